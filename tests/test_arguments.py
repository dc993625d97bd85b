"""Binding arguments like Python, pytree arguments, and the array / static split."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn


def _scale_forward(ctx, x, factor=2.0, *, shift=0.0):
    ctx.factor = factor
    ctx.kinds = (type(factor).__name__, type(shift).__name__)
    return x * factor + shift


def _scale_backward(ctx, grad_output):
    return {"x": grad_output * ctx.factor}


scale = jaxfn.autograd_function(_scale_forward, _scale_backward, name="scale")


@pytest.mark.parametrize(
    "call, expected",
    [
        (lambda x: scale(x), 2.0),
        (lambda x: scale(x, 3.0), 3.0),
        (lambda x: scale(x, factor=4.0), 4.0),
        (lambda x: scale(factor=5.0, x=x), 5.0),
        (lambda x: scale(x, 6.0, shift=1.0), 6.0),
    ],
)
def test_defaults_and_keywords_bind_like_python(maybe_jit, call, expected):
    x = jnp.array([1.0, 2.0])
    grad = maybe_jit(jax.grad(lambda x: call(x).sum()))(x)
    np.testing.assert_allclose(grad, [expected, expected])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: scale(), "missing a required argument: 'x'"),
        (lambda: scale(jnp.ones(2), nope=1), "unexpected keyword argument 'nope'"),
        (lambda: scale(jnp.ones(2), 1.0, 2.0), "too many positional arguments"),
    ],
)
def test_wrong_arguments_name_the_parameter(call, match):
    with pytest.raises(TypeError, match=match) as info:
        call()
    assert isinstance(info.value, jaxfn.AutogradFunctionError)
    assert "'scale'" in str(info.value)


def test_static_arguments_stay_python_values_under_jit():
    seen = []

    def forward(ctx, x, power, label, fn):
        seen.append((type(power), label, fn))
        ctx.save_for_backward(x=x, power=power)
        return fn(x) ** power

    def backward(ctx, grad_output):
        s = ctx.saved_variables
        seen.append((type(s.power), "backward", None))
        return {"x": grad_output * s.power * jnp.sin(s.x) ** (s.power - 1) * jnp.cos(s.x)}

    f = jaxfn.autograd_function(forward, backward, name="f")
    x = jnp.array([0.3, 0.7])
    got = jax.jit(jax.grad(lambda x: f(x, 3, "tag", jnp.sin).sum()))(x)
    np.testing.assert_allclose(got, jax.grad(lambda x: (jnp.sin(x) ** 3).sum())(x), rtol=1e-12)
    assert set(seen) == {(int, "tag", jnp.sin), (int, "backward", None)}  # jax_custom_vjp3 traces forward twice
    assert seen[-1] == (int, "backward", None)


def test_static_arguments_are_never_differentiated():
    flags = []

    def backward(ctx, grad_output):
        flags.append(tuple(ctx.needs_input_grad))
        return grad_output * 2, None

    g = jaxfn.autograd_function(lambda ctx, x, n: x * n, backward)
    jax.grad(lambda x: g(x, 2).sum())(jnp.ones(2))
    assert flags == [(True, False)]


def test_integer_arrays_pass_through_and_are_never_differentiated(maybe_jit):
    flags = []

    def forward(ctx, x, idx):
        ctx.save_for_backward(idx=idx, n=x.shape[0])
        return x[idx]

    def backward(ctx, grad_output):
        flags.append(tuple(ctx.needs_input_grad))
        s = ctx.saved_variables
        return jnp.zeros(s.n, grad_output.dtype).at[s.idx].add(grad_output), jnp.ones(3)  # int grad dropped

    take = jaxfn.autograd_function(forward, backward, name="take")
    x, idx = jnp.arange(5.0), jnp.array([0, 2, 2])
    got = maybe_jit(jax.grad(lambda x: (take(x, idx) ** 2).sum()))(x)
    np.testing.assert_allclose(got, jax.grad(lambda x: (x[idx] ** 2).sum())(x))
    assert flags[-1] == (True, False)


@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array
    activation: str = "tanh"


jax.tree_util.register_dataclass(Params, data_fields=["w", "b"], meta_fields=["activation"])


def _dense_forward(ctx, params, inputs):
    x = inputs["x"]
    ctx.save_for_backward(params=params, x=x)
    assert params.activation == "tanh"
    return jnp.tanh(x @ params.w + params.b)


def _dense_backward(ctx, grad_output):
    s = ctx.saved_variables
    pre = s.x @ s.params.w + s.params.b
    g = grad_output * (1 - jnp.tanh(pre) ** 2)
    return {
        "params": Params(w=s.x.T @ g, b=g, activation="tanh"),  # b's gradient broadcast: summed
        "inputs": {"x": g @ s.params.w.T},  # "scale" left out: no gradient
    }


dense = jaxfn.autograd_function(_dense_forward, _dense_backward, name="dense")


def _plain_dense(params, inputs):
    return jnp.tanh(inputs["x"] @ params.w + params.b)


def test_pytree_arguments_match_jax_grad(maybe_jit):
    k1, k2, k3 = jax.random.split(jax.random.key(2), 3)
    params = Params(jax.random.normal(k1, (3, 2)), jax.random.normal(k2, (2,)))
    inputs = {"x": jax.random.normal(k3, (4, 3)), "scale": 7}
    got = maybe_jit(jax.grad(lambda p, x: dense(p, {"x": x, "scale": 7}).sum(), (0, 1)))(params, inputs["x"])
    want = jax.grad(lambda p, x: _plain_dense(p, {"x": x}).sum(), (0, 1))(params, inputs["x"])
    np.testing.assert_allclose(got[0].w, want[0].w, rtol=1e-12)
    np.testing.assert_allclose(got[0].b, want[0].b, rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_pytree_needs_input_grad_is_any_leaf():
    flags = []

    def backward(ctx, grad_output):
        flags.append(tuple(ctx.needs_input_grad))
        return _dense_backward(ctx, grad_output)

    f = jaxfn.autograd_function(_dense_forward, backward, name="dense")
    params = Params(jnp.ones((3, 2)), jnp.ones(2))
    x = jnp.ones((4, 3))
    jax.grad(lambda b: f(Params(params.w, b), {"x": x, "scale": 1}).sum())(params.b)
    jax.grad(lambda x: f(params, {"x": x, "scale": 1}).sum())(x)
    assert flags == [(True, False), (False, True)]


def test_numpy_arrays_are_arrays():
    x = np.array([1.0, 2.0])
    np.testing.assert_allclose(jax.grad(lambda x: scale(x).sum())(x), [2.0, 2.0])
