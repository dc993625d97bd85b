"""Forward's outputs, backward's return forms, and how gradients are checked."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn

X = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
W = jnp.array([0.5, -1.0, 2.0])


def _mul_forward(ctx, x, w):
    ctx.save_for_backward(x=x, w=w)
    return x * w


def _mul(backward, name="mul"):
    return jaxfn.autograd_function(_mul_forward, backward, name=name)


def _plain_grads():
    return jax.grad(lambda x, w: (x * w).sum(), (0, 1))(X, W)


@pytest.mark.parametrize(
    "backward",
    [
        lambda ctx, g: {"x": g * ctx.saved_variables.w, "w": g * ctx.saved_variables.x},  # dict (R)
        lambda ctx, g: (g * ctx.saved_variables.w, g * ctx.saved_variables.x),  # tuple (PyTorch)
        lambda ctx, g: [g * ctx.saved_variables.w, g * ctx.saved_variables.x],  # list
    ],
    ids=["dict", "tuple", "list"],
)
def test_return_forms(maybe_jit, backward):
    # w's gradient has the (2, 3) shape of the product: it is summed down to w's (3,)
    got = maybe_jit(jax.grad(lambda x, w: _mul(backward)(x, w).sum(), (0, 1)))(X, W)
    for g, r in zip(got, _plain_grads()):
        np.testing.assert_allclose(g, r)


def test_missing_keys_and_none_mean_zero():
    got = jax.grad(lambda x, w: _mul(lambda ctx, g: {"x": g * ctx.saved_variables.w})(x, w).sum(), (0, 1))(X, W)
    np.testing.assert_allclose(got[0], _plain_grads()[0])
    np.testing.assert_allclose(got[1], jnp.zeros(3))
    got = jax.grad(lambda x, w: _mul(lambda ctx, g: (None, g * ctx.saved_variables.x))(x, w).sum(), (0, 1))(X, W)
    np.testing.assert_allclose(got[0], jnp.zeros((2, 3)))
    np.testing.assert_allclose(got[1], _plain_grads()[1])
    got = jax.grad(lambda x: _mul(lambda ctx, g: None)(x, W).sum())(X)
    np.testing.assert_allclose(got, jnp.zeros((2, 3)))


def test_bare_array_for_one_parameter():
    f = jaxfn.autograd_function(lambda ctx, x: x * 3, lambda ctx, g: g * 3)
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(W), [3.0, 3.0, 3.0])


def test_backward_actually_runs_straight_through_estimator(maybe_jit):
    """A straight-through estimator: autodiff would give zero, backward gives the identity."""
    called = []

    def backward(ctx, g):
        called.append(True)
        return g

    sign = jaxfn.autograd_function(lambda ctx, x: jnp.sign(x), backward, name="sign_ste")
    x = jnp.array([-1.5, 0.3, 2.0])
    np.testing.assert_allclose(maybe_jit(jax.grad(lambda x: (sign(x) * x).sum()))(x), x + jnp.sign(x))
    assert called
    np.testing.assert_allclose(jax.grad(lambda x: (jnp.sign(x) * x).sum())(x), jnp.sign(x))  # autodiff differs


def test_gradient_dtype_cast_to_input():
    f = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: (g * 2).astype(jnp.float64), name="f")
    x32 = jnp.ones(3, jnp.float32)
    g = jax.grad(lambda x: f(x).sum())(x32)
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, 2.0)


def test_complex_follows_jax_convention():
    # f(z) = z^2: backward returns grad_output * f'(z), without conjugation
    f = jaxfn.autograd_function(
        lambda ctx, z: (ctx.save_for_backward(z), z**2)[1], lambda ctx, g: g * 2 * ctx.saved_tensors[0]
    )
    z = jnp.array([1.0 + 2.0j, -0.5 + 0.1j])
    loss = lambda f: lambda z: jnp.abs(f(z)).sum()  # noqa: E731
    np.testing.assert_allclose(jax.grad(loss(f))(z), jax.grad(loss(lambda z: z**2))(z), rtol=1e-12)


def test_output_forms():
    def forward(ctx, x):
        return {"double": x * 2, "pair": (x + 1, 3.0)}  # a pytree; a Python number stays a Python number

    seen = []

    def backward(ctx, g):
        seen.append(jax.tree_util.tree_structure(g, is_leaf=lambda v: v is None))
        assert g["pair"][1] is None  # a Python value gets no cotangent
        return g["double"] * 2 + g["pair"][0]

    f = jaxfn.autograd_function(forward, backward)
    out = f(jnp.ones(2))
    assert type(out["pair"][1]) is float and out["pair"][1] == 3.0
    inside_jit = []
    jax.jit(lambda x: inside_jit.append(type(f(x)["pair"][1])) or x)(jnp.ones(2))
    assert inside_jit == [float]  # also under jit
    got = jax.grad(lambda x: f(x)["double"].sum() + f(x)["pair"][0].sum())(jnp.ones(2))
    np.testing.assert_allclose(got, [3.0, 3.0])
    expected = jax.tree_util.tree_structure({"double": 0, "pair": (0, None)}, is_leaf=lambda v: v is None)
    assert seen and seen[0] == expected


def test_one_grad_output_per_tuple_element():
    def forward(ctx, x):
        return x * 2, (x * 3, x * 4)

    def backward(ctx, g_first, g_rest):
        return g_first * 2 + g_rest[0] * 3 + g_rest[1] * 4

    f = jaxfn.autograd_function(forward, backward)
    got = jax.grad(lambda x: sum(jnp.sum(o) for o in jax.tree_util.tree_leaves(f(x))))(jnp.ones(2))
    np.testing.assert_allclose(got, [9.0, 9.0])


def test_gradient_for_pytree_parameter_with_none_subtree():
    def forward(ctx, params, x):
        ctx.save_for_backward(params=params, x=x)
        return params["a"] * x + params["b"]["c"]

    def backward(ctx, g):
        s = ctx.saved_variables
        return {"params": {"a": g * s.x, "b": None}}

    f = jaxfn.autograd_function(forward, backward)
    params = {"a": jnp.array(2.0), "b": {"c": jnp.array(1.0)}}
    got = jax.grad(lambda p: f(p, jnp.array([1.0, 3.0])).sum())(params)
    np.testing.assert_allclose(got["a"], 4.0)
    np.testing.assert_allclose(got["b"]["c"], 0.0)
