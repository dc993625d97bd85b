"""Named saves: each residual under "<function>.<save>", selected by JAX's checkpoint policies;
``jaxfn.saved`` reports what a call keeps. The kept residuals are read from JAX's own report."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals
from seeds import linear_backward, linear_forward

import jaxfn
from jaxfn import _saves

pytestmark = pytest.mark.skipif(
    not _saves.available(), reason="JAX's checkpoint_name fails under vmap on jax 0.10 with jax_remat3 on: no names"
)

linear = jaxfn.autograd_function(linear_forward, linear_backward, name="linear")


def _tanh_forward(ctx, x):
    y = jnp.tanh(x)
    ctx.save_for_backward(y)  # by position: "tanh.0"
    return y


tanh = jaxfn.autograd_function(_tanh_forward, lambda ctx, g: g * (1 - ctx.saved_tensors[0] ** 2), name="tanh")


def _scale_forward(ctx, params, x):
    ctx.save_for_backward(params=params)  # a pytree: "scale.params.w"
    ctx.x = x  # an attribute: "scale.x"
    return x * params["w"]


def _scale_backward(ctx, g):
    return {"params": {"w": (g * ctx.x).sum(0)}, "x": g * ctx.saved_variables.params["w"]}


scale = jaxfn.autograd_function(_scale_forward, _scale_backward, name="scale")

K = jax.random.split(jax.random.key(0), 4)
X = jax.random.normal(K[0], (4, 3))
W1, W2 = jax.random.normal(K[1], (5, 3)), jax.random.normal(K[2], (2, 5))
P = {"w": jax.random.normal(K[3], (5,))}


def net(x, w1, w2, params):
    return linear(tanh(scale(params, linear(x, w1))), w2).sum()


def plain(x, w1, w2, params):
    return (jnp.tanh((x @ w1.T) * params["w"]) @ w2.T).sum()


def _named(f, *args):
    """The names of the residuals JAX keeps for f, from its own report, in order."""
    return [m.group(1) for _, d in saved_residuals(f, *args) if (m := re.match(r"named '([^']+)'", d))]


def test_every_save_carries_its_name():
    assert sorted(_named(net, X, W1, W2, P)) == sorted(
        ["linear.input", "linear.weight", "scale.params.w", "scale.x", "tanh.0", "linear.input", "linear.weight"]
    )


@pytest.mark.parametrize(
    "names",
    [("tanh.0",), ("linear.input",), ("scale.params.w", "scale.x"), ()],
)
def test_a_policy_keeps_exactly_the_named_residuals(maybe_jit, names):
    policy = jax.checkpoint_policies.save_only_these_names(*names)
    checkpointed = jax.checkpoint(net, policy=policy)
    kept = _named(checkpointed, X, W1, W2, P)
    assert set(kept) == set(names)
    grads = maybe_jit(jax.grad(checkpointed, (0, 1, 2, 3)))(X, W1, W2, P)
    for got, want in zip(
        jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(jax.grad(plain, (0, 1, 2, 3))(X, W1, W2, P))
    ):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_save_any_names_but_these_drops_one():
    policy = jax.checkpoint_policies.save_any_names_but_these("tanh.0")
    kept = _named(jax.checkpoint(net, policy=policy), X, W1, W2, P)
    assert "tanh.0" not in kept and "linear.weight" in kept


def test_saved_reports_each_residual():
    report = jaxfn.saved(net, X, W1, W2, P)
    rows = [(r.function, r.save, r.shape, r.dtype, r.nbytes, r.kind) for r in report if r.function]
    assert rows == [
        ("linear", "input", (4, 3), "float64", 96, "input"),
        ("linear", "weight", (5, 3), "float64", 120, "input"),
        ("scale", "params.w", (5,), "float64", 40, "input"),
        ("scale", "x", (4, 5), "float64", 160, "input"),
        ("tanh", "0", (4, 5), "float64", 160, "new"),
        ("linear", "input", (4, 5), "float64", 160, "input"),
        ("linear", "weight", (2, 5), "float64", 80, "input"),
    ]
    assert report.nbytes == sum(r.nbytes for r in report)
    table = str(report)
    assert table.splitlines()[0] == "| function | save | shape | dtype | bytes | kind |"
    assert "| tanh | 0 | (4, 5) | float64 | 160 | new |" in table


@pytest.mark.parametrize("forward_mode", [False, True])
def test_an_input_forward_returns_unchanged_is_reported_as_an_input(forward_mode):
    """A save of an input that forward also returns as is: kind "input" (the outer differentiation
    replaces the saved output with the output it sees, which must not make it "new")."""

    def through(ctx, x, w):
        ctx.save_for_backward(x=x, w=w)
        return x, x * w

    def backward(ctx, gx, gy):
        x, w = ctx.saved_tensors
        return gx + gy * w, gy * x

    f = jaxfn.autograd_function(through, backward, forward_mode=forward_mode, name="through")
    x, w = jnp.arange(3.0), jnp.ones(3)
    rows = [(r.save, r.kind) for r in jaxfn.saved(lambda x, w: sum(o.sum() for o in f(x, w)), x, w) if r.function]
    assert rows == [("x", "input"), ("w", "input")]
    want = jax.grad(lambda x, w: (x + x * w).sum(), (0, 1))(x, w)
    got = jax.grad(lambda x, w: sum(o.sum() for o in f(x, w)), (0, 1))(x, w)
    np.testing.assert_allclose(got, want)


def test_saved_under_a_policy_lists_what_it_keeps():
    policy = jax.checkpoint_policies.save_only_these_names("tanh.0")
    report = jaxfn.saved(jax.checkpoint(net, policy=policy), X, W1, W2, P)
    assert [(r.function, r.save) for r in report if r.function] == [("tanh", "0")]
    assert {r.save for r in report if not r.function} == {
        "from the argument x",
        "from the argument w1",
        "from the argument w2",
        "from the argument params['w']",
    }


def test_names_in_the_setup_context_form_and_with_a_jvp_rule():
    class Square(jaxfn.Function):
        @staticmethod
        def forward(x):
            return x * x

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(x=inputs[0])

        @staticmethod
        def backward(ctx, g):
            return 2 * ctx.saved_variables.x * g

        @staticmethod
        def jvp(ctx, t):
            return t  # not used here

    assert _named(lambda x: Square.apply(jnp.sin(x)).sum(), X) == ["Square.x"]


def test_offload_policy_on_this_backend():
    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=["tanh.0"],
        offload_src="device",
        offload_dst="pinned_host",
    )
    f = jax.jit(jax.grad(jax.checkpoint(net, policy=policy)))
    try:
        got = f(X, W1, W2, P)
    except Exception as err:  # noqa: BLE001 - the backend's own refusal is what this records
        pytest.skip(f"offloading to pinned_host is not supported on {jax.default_backend()}: {str(err)[:200]}")
    np.testing.assert_allclose(got, jax.grad(plain)(X, W1, W2, P), rtol=1e-10)


def test_keys_integers_and_low_precision_saves():
    def forward(ctx, x, key):
        mask = jax.random.bernoulli(key, 0.5, x.shape)
        ctx.save_for_backward(mask=mask, key=key, idx=jnp.arange(3, dtype=jnp.int32), half=x.astype(jnp.bfloat16))
        return jnp.where(mask, x, 0)

    drop = jaxfn.autograd_function(
        forward, lambda ctx, g: (jnp.where(ctx.saved_variables.mask, g, 0), None), name="drop"
    )
    x, key = jnp.arange(1.0, 4.0), jax.random.key(0)
    rows = [(r.save, r.shape, r.dtype, r.nbytes) for r in jaxfn.saved(lambda x: drop(x, key).sum(), x) if r.function]
    assert rows == [
        ("mask", (3,), "bool", 3),
        ("key", (), "key<fry>", 8),
        ("idx", (3,), "int32", 12),
        ("half", (3,), "bfloat16", 6),
    ]
    mask = jax.random.bernoulli(key, 0.5, x.shape)
    policy = jax.checkpoint_policies.save_only_these_names("drop.mask")
    np.testing.assert_array_equal(jax.grad(jax.checkpoint(lambda x: drop(x, key).sum(), policy=policy))(x), mask)
