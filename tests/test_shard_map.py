"""jaxfn functions inside jax.shard_map with check_vma on (SPEC section 10), on 8 simulated CPU devices."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jaxfn
    from seeds import linear, linear_backward, linear_forward

    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("d",))
    kx, kw, kb = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (32, 5))
    w, b = jax.random.normal(kw, (4, 5)), jax.random.normal(kb, (4,))
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))

    def close(got, want):
        for g, r in zip(got, want):
            np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-10)

    # 1. The usual data-parallel layer: a sharded batch, replicated parameters.
    def per_device(fn):
        return jax.shard_map(fn, mesh=mesh, in_specs=(P("d"), P(), P()), out_specs=P("d"))

    plain = lambda x, w, b: jnp.sin(x @ w.T + b).sum()
    want = jax.grad(plain, (0, 1, 2))(x, w, b)
    for mode in (False, True):
        fn = jaxfn.autograd_function(linear_forward, linear_backward, name="linear", forward_mode=mode)
        loss = lambda x, w, b: jnp.sin(per_device(fn)(x, w, b)).sum()
        close(jax.jit(jax.grad(loss, (0, 1, 2)))(xs, w, b), want)
        close(jax.grad(loss, (1, 2))(xs, w, b), want[1:])
        close(jax.grad(loss, (0, 1, 2))(xs, w, b), want)
        # un-jitted shard_map, nothing differentiated: JAX refuses a custom_vjp with symbolic zeros
        # there, so jaxfn calls it through jax.jit
        np.testing.assert_allclose(per_device(fn)(xs, w, b), x @ w.T + b, rtol=1e-10)
    # forward mode inside shard_map too
    fwd = jaxfn.autograd_function(linear_forward, linear_backward, name="linear", forward_mode=True)
    tangent = jax.jit(lambda w: jax.jvp(lambda w: per_device(fwd)(xs, w, b), (w,), (jnp.ones_like(w),))[1])(w)
    np.testing.assert_allclose(tangent, x @ jnp.ones_like(w).T, rtol=1e-10)

    # 2. A backward that itself uses a collective: a synchronized (cross-device) centering.
    def center_forward(ctx, x):
        count = jax.lax.psum(x.shape[0], "d")
        return x - jax.lax.psum(x.sum(0), "d") / count

    def center_backward(ctx, g):
        count = jax.lax.psum(g.shape[0], "d")
        return g - jax.lax.psum(g.sum(0), "d") / count

    center = jaxfn.autograd_function(center_forward, center_backward, name="sync_center")
    sharded = jax.shard_map(lambda x, w: center(x) * w, mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d"))
    loss = lambda x, w: jnp.sin(sharded(x, w)).sum()
    want = jax.grad(lambda x, w: jnp.sin((x - x.mean(0)) * w).sum(), (0, 1))(x, w[0])
    close(jax.jit(jax.grad(loss, (0, 1)))(xs, w[0]), want)
    print("OK")
    """
)


@pytest.mark.slow
def test_shard_map_with_replicated_parameters_and_collectives_in_backward():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")


EVERY_BUILDER = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jaxfn

    mesh = Mesh(np.array(jax.devices()), ("d",))
    x = jnp.arange(16.0).reshape(8, 2) / 10
    b = jnp.array([0.3, -0.2])
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    close = lambda got, want: np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)

    def forward(ctx, x, b):
        y = jnp.tanh(x + b)
        ctx.save_for_backward(y=y)
        return y

    def backward(ctx, g):
        gz = g * (1 - ctx.saved_variables.y ** 2)
        return gz, gz

    vmap_rule = lambda info, d, x, b: (jnp.tanh(jnp.moveaxis(x, d[0], 0) + b), 0)
    builders = {
        "default": {},
        "forward_mode": {"forward_mode": True},
        "jvp rule": {"jvp": lambda ctx, tx, tb: (tx + tb) * (1 - ctx.saved_tensors[0] ** 2)},
        "vmap rule": {"vmap": vmap_rule},
    }
    plain = lambda x, b: jnp.tanh(x + b)
    shard = lambda f: jax.shard_map(f, mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d"))
    batched = lambda f: shard(jax.vmap(f, in_axes=(0, None)))
    for name, options in builders.items():
        f = jaxfn.autograd_function(forward, backward, name="th", **options)
        if name == "jvp rule":  # its jvp reads what forward saved for it
            def fwd_saving(ctx, x, b):
                y = forward(ctx, x, b)
                ctx.save_for_forward(y)
                return y
            f = jaxfn.autograd_function(fwd_saving, backward, name="th", **options)
        for wrap in (shard, batched):  # a replicated parameter, per-device batches; also vmap inside
            loss = lambda b, f=f, wrap=wrap: jnp.sin(wrap(f)(xs, b)).sum()
            close(jax.jit(jax.grad(loss))(b), jax.grad(lambda b: jnp.sin(wrap(plain)(xs, b)).sum())(b))
        if name != "default" and name != "vmap rule":  # forward mode wrt the replicated parameter
            tangent = jax.jit(lambda b, f=f: jax.jvp(lambda b: shard(f)(xs, b), (b,), (b,))[1])(b)
            close(tangent, jax.jvp(lambda b: shard(plain)(xs, b), (b,), (b,))[1])

    center = jaxfn.autograd_function(  # forward mode of a backward with a collective
        lambda ctx, x: x - jax.lax.psum(x.sum(0), "d") / 16,
        lambda ctx, g: g - jax.lax.psum(g.sum(0), "d") / 16,
        name="center",
        forward_mode=True,
    )
    plain_center = lambda x: x - jax.lax.psum(x.sum(0), "d") / 16
    sh = lambda f: jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P("d"))
    want = jax.jvp(sh(plain_center), (xs,), (xs * xs,))[1]
    close(jax.jit(lambda x: jax.jvp(sh(center), (x,), (x * x,))[1])(xs), want)

    def summing_backward(ctx, g):  # sums the replicated parameter's gradient itself: refused, named
        return g, jax.lax.psum(g.sum(0), "d")

    for options in ({}, {"forward_mode": True}, {"vmap": vmap_rule}):
        f = jaxfn.autograd_function(lambda ctx, x, b: x + b, summing_backward, name="summed", **options)
        try:
            jax.jit(jax.grad(lambda b, f=f: shard(f)(xs, b).sum()))(b)
        except jaxfn.AutogradFunctionError as err:
            assert "'summed': inside jax.shard_map, 'b' is used with values varying over the mesh axes ['d']" in str(
                err
            ), err
        else:
            raise AssertionError("a psum of a replicated parameter's gradient in backward was accepted")
    print("OK")
    """
)


@pytest.mark.slow
def test_every_builder_inside_shard_map_with_a_replicated_parameter():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", EVERY_BUILDER], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")
