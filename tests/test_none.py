"""A ``None`` among a function's arguments, among its outputs and inside their pytrees, on every
path (default, forward_mode, a jvp rule, a vmap rule, host, host with a jvp rule, finite
differences, from_torch, closures) under grad, jvp, vmap, jit and a checkpointed scan: each result
compared with the same math written in plain JAX (no jaxfn)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn
from jaxfn import _saves

NAMES = pytest.mark.skipif(
    not _saves.available(), reason="JAX's checkpoint_name fails under vmap on jax 0.10 with jax_remat3 on: no names"
)


def reference(x, b, p):
    """The plain-JAX math every path computes: ``b`` and ``p["skip"]`` are None."""
    assert b is None and p["skip"] is None
    w = p["w"]
    return None, {"y": jnp.sin(x) * w, "n": None, "z": jnp.cos(x) * w}


def _jax_forward(ctx, x, b, p):
    ctx.save_for_backward(x=x, w=p["w"])
    ctx.save_for_forward(x=x, w=p["w"])
    w = p["w"]
    return None, {"y": jnp.sin(x) * w, "n": None, "z": jnp.cos(x) * w}


def _np_forward(ctx, x, b, p):
    ctx.save_for_backward(x=x, w=p["w"])
    ctx.save_for_forward(x=x, w=p["w"])
    w = p["w"]
    return None, {"y": np.sin(x) * w, "n": None, "z": np.cos(x) * w}


def _backward(xp):
    def backward(ctx, g_none, g):
        assert g_none is None and g["n"] is None
        x, w = ctx.saved_variables.x, ctx.saved_variables.w
        gy, gz = g["y"], g["z"]
        gx = gy * xp.cos(x) * w - gz * xp.sin(x) * w
        gw = (gy * xp.sin(x) + gz * xp.cos(x)).sum()
        return gx, None, {"w": gw, "skip": None}

    return backward


def _jvp(xp):
    def jvp(ctx, tx, tb, tp):
        assert tb is None and tp["skip"] is None
        x, w = ctx.saved_variables.x, ctx.saved_variables.w
        tx = xp.zeros_like(x) if tx is None else tx
        tw = 0.0 if tp["w"] is None else tp["w"]
        return None, {"y": xp.cos(x) * w * tx + xp.sin(x) * tw, "n": None, "z": -xp.sin(x) * w * tx + xp.cos(x) * tw}

    return jvp


def _vmap_rule(info, in_dims, x, b, p):
    assert in_dims[1] is None and in_dims[2]["skip"] is None
    x = jnp.moveaxis(x, in_dims[0], 0) if in_dims[0] is not None else jnp.broadcast_to(x, (info.batch_size, *x.shape))
    w = p["w"] if in_dims[2]["w"] is None else jnp.moveaxis(p["w"], in_dims[2]["w"], 0)
    w = jnp.reshape(w, w.shape + (1,) * (x.ndim - w.ndim)) if in_dims[2]["w"] is not None else w
    out = (None, {"y": jnp.sin(x) * w, "n": None, "z": jnp.cos(x) * w})
    return out, (None, {"y": 0, "n": None, "z": 0})


def _torch_function():
    torch = pytest.importorskip("torch")

    class TorchNone(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b, w):
            ctx.save_for_backward(x, w)
            ctx.save_for_forward(x, w)  # what PyTorch's jvp reads as saved_tensors
            return torch.sin(x) * w, None, torch.cos(x) * w

        @staticmethod
        def backward(ctx, gy, g_none, gz):
            x, w = ctx.saved_tensors
            gy = torch.zeros_like(x) if gy is None else gy
            gz = torch.zeros_like(x) if gz is None else gz
            return gy * torch.cos(x) * w - gz * torch.sin(x) * w, None, (gy * torch.sin(x) + gz * torch.cos(x)).sum()

        @staticmethod
        def jvp(ctx, tx, tb, tw):
            x, w = ctx.saved_tensors
            tx = torch.zeros_like(x) if tx is None else tx
            tw = torch.zeros_like(w) if tw is None else tw
            return torch.cos(x) * w * tx + torch.sin(x) * tw, None, -torch.sin(x) * w * tx + torch.cos(x) * tw

    port = jaxfn.from_torch(TorchNone)

    def call(x, b, p):
        y, none, z = port(x, b, p["w"])
        return none, {"y": y, "n": None, "z": z}

    return call


def _closure():
    def call(x, b, p):
        w = p["w"]  # closed over by forward and backward: a parameter of the call (named w)

        def forward(ctx, x, b):
            ctx.save_for_backward(x=x)
            return None, {"y": jnp.sin(x) * w, "n": None, "z": jnp.cos(x) * w}

        def backward(ctx, g_none, g):
            x = ctx.saved_variables.x
            gy, gz = g["y"], g["z"]
            return {"x": gy * jnp.cos(x) * w - gz * jnp.sin(x) * w, "w": (gy * jnp.sin(x) + gz * jnp.cos(x)).sum()}

        return jaxfn.autograd_function(forward, backward, name="closing")(x, b)

    return call


def _finite_differences():
    def forward(ctx, x, b, p):
        w = p["w"]
        return None, {"y": np.sin(x) * w, "n": None, "z": np.cos(x) * w}

    return jaxfn.autograd_function(forward, "finite_differences", host=True, name="fd")


PATHS = {
    "default": lambda: jaxfn.autograd_function(_jax_forward, _backward(jnp), name="default"),
    "forward_mode": lambda: jaxfn.autograd_function(_jax_forward, _backward(jnp), forward_mode=True, name="fm"),
    "jvp rule": lambda: jaxfn.autograd_function(_jax_forward, _backward(jnp), jvp=_jvp(jnp), name="jvp"),
    "vmap rule": lambda: jaxfn.autograd_function(
        _jax_forward, _backward(jnp), vmap=_vmap_rule, forward_mode=True, name="vmap"
    ),
    "host": lambda: jaxfn.autograd_function(_np_forward, _backward(np), host=True, name="host"),
    "host jvp": lambda: jaxfn.autograd_function(_np_forward, _backward(np), jvp=_jvp(np), host=True, name="hjvp"),
    "finite differences": _finite_differences,
    "from_torch": _torch_function,
    "closures": _closure,
}
HAS_FORWARD_MODE = {"forward_mode", "jvp rule", "vmap rule", "host jvp", "finite differences", "from_torch"}
TOLERANCE = {"finite differences": 2e-3}


def _loss(f):
    def loss(x, w):
        none, out = f(x, None, {"w": w, "skip": None})
        assert none is None and out["n"] is None
        return (out["y"] * jnp.arange(1.0, 4.0)).sum() + 2.0 * out["z"].sum()

    return loss


def _outputs(f):
    def outputs(x, w):
        _, out = f(x, None, {"w": w, "skip": None})
        return out["y"], out["z"]

    return outputs


X, W = jnp.array([0.3, -0.7, 1.1]), jnp.array(1.7)


def _close(got, want, path):
    rtol = TOLERANCE.get(path, 1e-5)
    for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=rtol, atol=rtol)


def _scan_loss(f):
    @jax.checkpoint
    def body(carry, _):
        x, w = carry
        _, out = f(x, None, {"w": w, "skip": None})
        return (0.5 * out["y"] + 0.1 * out["z"], w), None

    def loss(x, w):
        (x, _), _ = jax.lax.scan(body, (x, w), None, length=2)
        return x.sum()

    return loss


@pytest.mark.parametrize("path", PATHS)
def test_a_none_argument_and_none_outputs_keep_every_gradient_in_place(path):
    f = PATHS[path]()
    want = jax.grad(_loss(reference), argnums=(0, 1))(X, W)
    _close(jax.grad(_loss(f), argnums=(0, 1))(X, W), want, path)
    _close(jax.jit(jax.grad(_loss(f), argnums=(0, 1)))(X, W), want, path)


@pytest.mark.parametrize("path", PATHS)
def test_a_none_argument_and_none_outputs_under_vmap_and_its_gradient(path):
    f = PATHS[path]()
    xs = jnp.stack([X, 2 * X])
    values = jax.vmap(_outputs(f), in_axes=(0, None))(xs, W)
    _close(values, jax.vmap(_outputs(reference), in_axes=(0, None))(xs, W), path)
    if path in ("finite differences", "from_torch", "host", "host jvp"):
        return  # host code under jit(vmap(grad)): below, one case is enough for the callbacks
    grads = jax.jit(jax.vmap(jax.grad(_loss(f), argnums=(0, 1)), in_axes=(0, None)))(xs, W)
    _close(grads, jax.vmap(jax.grad(_loss(reference), argnums=(0, 1)), in_axes=(0, None))(xs, W), path)


def test_host_none_outputs_under_jit_vmap_grad():
    f = PATHS["host"]()
    xs = jnp.stack([X, 2 * X])
    grads = jax.jit(jax.vmap(jax.grad(_loss(f), argnums=(0, 1)), in_axes=(0, None)))(xs, W)
    _close(grads, jax.vmap(jax.grad(_loss(reference), argnums=(0, 1)), in_axes=(0, None))(xs, W), "host")


@pytest.mark.parametrize("path", sorted(HAS_FORWARD_MODE))
def test_a_none_argument_keeps_the_tangents_of_the_arguments_after_it(path):
    f = PATHS[path]()
    for tangents in [(jnp.zeros(3), jnp.array(1.0)), (jnp.ones(3), jnp.array(0.0)), (X, jnp.array(-2.0))]:
        got = jax.jvp(_outputs(f), (X, W), tangents)[1]
        _close(got, jax.jvp(_outputs(reference), (X, W), tangents)[1], path)
    tangents = (jnp.ones(3), jnp.array(0.5))
    got = jax.jit(lambda x, w: jax.jvp(_outputs(f), (x, w), tangents)[1])(X, W)
    _close(got, jax.jvp(_outputs(reference), (X, W), tangents)[1], path)


# host code: its own scan test below; closures: a value closed over inside a checkpointed loop is a known
# limit (JAX's CustomVJPException, docs/known-limits.md), with or without None
@pytest.mark.parametrize(
    "path", [p for p in PATHS if p not in ("finite differences", "from_torch", "host", "host jvp", "closures")]
)
def test_a_none_argument_and_none_outputs_through_a_checkpointed_scan(path):
    f = PATHS[path]()
    want = jax.grad(_scan_loss(reference), argnums=(0, 1))(X, W)
    _close(jax.grad(_scan_loss(f), argnums=(0, 1))(X, W), want, path)


@pytest.mark.parametrize("path", ["host", "host jvp", "finite differences", "from_torch"])
def test_host_code_with_none_through_a_scan(path):
    f = PATHS[path]()

    def loss(x, w):
        def body(carry, _):
            _, out = f(carry, None, {"w": w, "skip": None})
            return 0.5 * out["y"] + 0.1 * out["z"], None

        return jax.lax.scan(body, x, None, length=2)[0].sum()

    def plain(x, w):
        def body(carry, _):
            _, out = reference(carry, None, {"w": w, "skip": None})
            return 0.5 * out["y"] + 0.1 * out["z"], None

        return jax.lax.scan(body, x, None, length=2)[0].sum()

    _close(jax.jit(jax.grad(loss, argnums=(0, 1)))(X, W), jax.grad(plain, argnums=(0, 1))(X, W), path)


def test_a_host_none_output_first_gets_its_gradient():
    """The case that gave a zero gradient: ``(None, np.sin(x))``."""
    f = jaxfn.autograd_function(
        lambda ctx, x: (ctx.save_for_backward(x), (None, np.sin(x)))[1],
        lambda ctx, g_none, g: g * np.cos(ctx.saved_tensors[0]),
        host=True,
        name="hsin",
    )
    np.testing.assert_allclose(jax.grad(lambda x: f(x)[1].sum())(X), jnp.cos(X), rtol=1e-6)


def _sine_with_a_float64_tangent(xp, host):
    def forward(ctx, x):
        ctx.save_for_forward(x)
        return xp.sin(x)

    def jvp(ctx, t):
        return xp.asarray(xp.cos(ctx.saved_tensors[0]) * t, xp.float64)  # float64 for a float32 output

    return jaxfn.autograd_function(forward, lambda ctx, g: {}, jvp=jvp, host=host, name="cast")


def test_a_host_jvp_tangent_of_another_float_dtype_is_cast_as_the_traced_jvp_does():
    with jax.enable_x64(True):
        for xp, host in ((np, True), (jnp, False)):
            f = _sine_with_a_float64_tangent(xp, host)
            x = jnp.array([0.3, 0.5], jnp.float32)
            _, tangent = jax.jvp(f, (x,), (jnp.ones(2, jnp.float32),))
            assert tangent.dtype == jnp.float32
            np.testing.assert_allclose(tangent, jnp.cos(x), rtol=1e-6)


@NAMES
def test_a_host_save_is_named_as_saved():
    def forward(ctx, x):
        ctx.save_for_backward(cosx=np.cos(x))
        ctx.scale = np.float32(2.0)
        return np.sin(x)

    hsin = jaxfn.autograd_function(forward, lambda ctx, g: g * ctx.saved_variables.cosx, host=True, name="hsin")
    report = jaxfn.saved(lambda x: hsin(x).sum(), X)
    assert {(r.function, r.save) for r in report} >= {("hsin", "cosx"), ("hsin", "scale")}
    policy = jax.checkpoint_policies.save_only_these_names("hsin.cosx")
    checkpointed = jax.checkpoint(lambda x: hsin(x).sum(), policy=policy)
    assert [r.save for r in jaxfn.saved(checkpointed, X) if r.function == "hsin"] == ["cosx"]
    np.testing.assert_allclose(jax.grad(checkpointed)(X), jnp.cos(X), rtol=1e-6)


@NAMES
def test_a_closed_over_value_is_saved_under_its_own_name():
    def loss(w, x):
        def forward(ctx, x):
            ctx.save_for_backward(x=x)
            return x * w

        scale = jaxfn.autograd_function(
            forward, lambda ctx, g: {"x": g * w, "w": (g * ctx.saved_variables.x).sum()}, name="scale"
        )
        return scale(x).sum()

    saves = {r.save for r in jaxfn.saved(loss, W, X) if r.function == "scale"}
    assert "w" in saves and not any("jaxfn" in s for s in saves)
    np.testing.assert_allclose(jax.grad(loss)(W, X), X.sum(), rtol=1e-6)


def test_a_host_call_on_saved_values_inside_a_forward_mode_backward():
    hcos = jaxfn.autograd_function(lambda ctx, x: np.cos(x), lambda ctx, g: {}, host=True, name="hcos")

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return jnp.sin(x)

    f = jaxfn.autograd_function(
        forward, lambda ctx, g: g * hcos(ctx.saved_tensors[0]), forward_mode=True, name="sin_fm"
    )
    for run in (lambda x: jax.jvp(f, (x,), (jnp.ones(3),))[1], jax.jit(lambda x: jax.jvp(f, (x,), (jnp.ones(3),))[1])):
        np.testing.assert_allclose(run(X), jnp.cos(X), rtol=1e-6)


def test_a_host_call_on_grad_output_inside_a_forward_mode_backward_is_refused_naming_it():
    hscale = jaxfn.autograd_function(lambda ctx, x: 2 * x, lambda ctx, g: 2 * g, host=True, name="hscale")
    f = jaxfn.autograd_function(lambda ctx, x: 2 * x, lambda ctx, g: hscale(g), forward_mode=True, name="twice")
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(X), 2 * jnp.ones(3))
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'hscale': it is a host=True function .* on grad_output"):
        jax.jvp(f, (X,), (jnp.ones(3),))


@pytest.mark.parametrize("inside", [False, True], ids=["the argument", "inside a pytree"])
def test_a_gradient_for_a_none_argument_is_refused_saying_it_is_none(inside):
    """PyTorch refuses a gradient for an input that was None; jaxfn too, saying so (not as a
    pytree of no leaves, with advice for Flax parameters)."""

    def forward(ctx, x, b):
        return x * 2.0

    def backward(ctx, g):
        return g * 2.0, ({"skip": g} if inside else g)

    f = jaxfn.autograd_function(forward, backward, name="gb")
    b = {"skip": None} if inside else None
    where = r"'b', but that part of 'b' is None, not an array, so it can't have a gradient; return None for it"
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"^jaxfn: 'gb': backward returned an array .* for " + where):
        jax.grad(lambda x: f(x, b).sum())(X)
