"""A jaxfn function inside an Equinox Module and a Flax NNX layer, trained with Optax.

Each test skips when its optional package is absent (they come with the `test` extra). Every
gradient is checked against plain JAX autodiff of the same math, with no module and no jaxfn;
training is checked against the same Optax loop run on plain arrays.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import linear_backward, linear_forward, plain_linear_free

import jaxfn

pytestmark = pytest.mark.slow  # trains Equinox and Flax models

IN, OUT, N, STEPS, LR = 3, 2, 64, 20, 0.05

BACKWARD_CALLS = []  # needs_input_grad of each traced backward of `linear`


def _recording_backward(ctx, grad_output):
    BACKWARD_CALLS.append(tuple(ctx.needs_input_grad))
    return linear_backward(ctx, grad_output)


def _doubled_backward(ctx, grad_output):
    return {k: None if g is None else 2 * g for k, g in linear_backward(ctx, grad_output).items()}


# The seeds' linear, with a backward that records that it ran; and one whose gradients are twice
# the true ones, which JAX's own autodiff of forward could never give.
linear = jaxfn.autograd_function(linear_forward, _recording_backward, name="linear")
doubled_linear = jaxfn.autograd_function(linear_forward, _doubled_backward, name="doubled_linear")


def _data():
    """A small synthetic regression: y = x @ w.T + b + noise, in float32."""
    kx, kw, kn = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (N, IN), jnp.float32)
    w_true = jax.random.normal(kw, (OUT, IN), jnp.float32)
    y = x @ w_true.T + jnp.array([1.0, -2.0], jnp.float32) + 0.01 * jax.random.normal(kn, (N, OUT), jnp.float32)
    return x, y


def _plain_loss(weight, bias, x, y):
    return jnp.mean((plain_linear_free(x, weight, bias) - y) ** 2)


def _plain_training(weight, bias, x, y):
    """The reference: the same Optax loop on plain arrays, gradients from JAX's autodiff."""
    params = (weight, bias)
    tx = _optax().adam(LR)
    opt_state = tx.init(params)
    losses = []
    for _ in range(STEPS):
        loss, grads = jax.value_and_grad(lambda p: _plain_loss(*p, x, y))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = _optax().apply_updates(params, updates)
        losses.append(float(loss))
    return params, losses


def _optax():
    return pytest.importorskip("optax")


def _assert_close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-5, atol=1e-6)


# -- Equinox ------------------------------------------------------------------------------------


@functools.cache
def _equinox_classes():
    eqx = pytest.importorskip("equinox")

    class Linear(eqx.Module):
        weight: jax.Array
        bias: jax.Array

        def __init__(self, in_features, out_features, *, key):
            self.weight = jax.random.normal(key, (out_features, in_features), jnp.float32) / in_features**0.5
            self.bias = jnp.zeros((out_features,), jnp.float32)

        def __call__(self, x):
            return linear(x, self.weight, self.bias)

    class DoubledLinear(Linear):
        def __call__(self, x):
            return doubled_linear(x, self.weight, self.bias)

    return eqx, Linear, DoubledLinear


def _equinox_loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "filter_jit"])
def test_equinox_gradients_match_plain_jax(jit):
    eqx, Linear, _ = _equinox_classes()
    model = Linear(IN, OUT, key=jax.random.key(1))
    x, y = _data()
    value_and_grad = eqx.filter_value_and_grad(_equinox_loss)
    BACKWARD_CALLS.clear()
    loss, grads = (eqx.filter_jit(value_and_grad) if jit else value_and_grad)(model, x, y)
    ref_loss, (ref_w, ref_b) = jax.value_and_grad(_plain_loss, argnums=(0, 1))(model.weight, model.bias, x, y)
    _assert_close(loss, ref_loss)
    _assert_close(grads.weight, ref_w)
    _assert_close(grads.bias, ref_b)
    assert BACKWARD_CALLS == [(False, True, True)]  # backward ran; the data `x` is not differentiated


def test_equinox_gradients_come_from_backward():
    eqx, _, DoubledLinear = _equinox_classes()
    model = DoubledLinear(IN, OUT, key=jax.random.key(1))
    x, y = _data()
    grads = eqx.filter_jit(eqx.filter_grad(_equinox_loss))(model, x, y)
    ref_w, ref_b = jax.grad(_plain_loss, argnums=(0, 1))(model.weight, model.bias, x, y)
    _assert_close(grads.weight, 2 * ref_w)
    _assert_close(grads.bias, 2 * ref_b)


def test_equinox_optax_training_matches_plain_jax():
    eqx, Linear, _ = _equinox_classes()
    optax = _optax()
    model = Linear(IN, OUT, key=jax.random.key(1))
    x, y = _data()
    (ref_w, ref_b), ref_losses = _plain_training(model.weight, model.bias, x, y)
    optimizer = optax.adam(LR)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def train_step(model, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(_equinox_loss)(model, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    losses = []
    for _ in range(STEPS):
        model, opt_state, loss = train_step(model, opt_state, x, y)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]
    _assert_close(losses, ref_losses)
    _assert_close(model.weight, ref_w)
    _assert_close(model.bias, ref_b)
    assert model.weight.dtype == jnp.float32


# -- Flax NNX -----------------------------------------------------------------------------------


@functools.cache
def _nnx_classes():
    nnx = pytest.importorskip("flax.nnx")

    class Linear(nnx.Module):
        def __init__(self, in_features, out_features, *, rngs):
            key = rngs.params()
            self.weight = nnx.Param(jax.random.normal(key, (out_features, in_features), jnp.float32) / in_features**0.5)
            self.bias = nnx.Param(jnp.zeros((out_features,), jnp.float32))

        def __call__(self, x):
            # param[...] is the array; an nnx.Param itself is a one-leaf pytree to jaxfn
            return linear(x, self.weight[...], self.bias[...])

    class DoubledLinear(Linear):
        def __call__(self, x):
            return doubled_linear(x, self.weight[...], self.bias[...])

    return nnx, Linear, DoubledLinear


def _nnx_loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "nnx_jit"])
def test_nnx_gradients_match_plain_jax(jit):
    nnx, Linear, _ = _nnx_classes()
    model = Linear(IN, OUT, rngs=nnx.Rngs(1))
    x, y = _data()
    value_and_grad = nnx.value_and_grad(_nnx_loss)
    BACKWARD_CALLS.clear()
    loss, grads = (nnx.jit(value_and_grad) if jit else value_and_grad)(model, x, y)
    ref_loss, (ref_w, ref_b) = jax.value_and_grad(_plain_loss, argnums=(0, 1))(model.weight[...], model.bias[...], x, y)
    _assert_close(loss, ref_loss)
    _assert_close(grads["weight"][...], ref_w)
    _assert_close(grads["bias"][...], ref_b)
    assert BACKWARD_CALLS == [(False, True, True)]  # backward ran; the data `x` is not differentiated


def test_nnx_gradients_come_from_backward():
    nnx, _, DoubledLinear = _nnx_classes()
    model = DoubledLinear(IN, OUT, rngs=nnx.Rngs(1))
    x, y = _data()
    grads = nnx.jit(nnx.grad(_nnx_loss))(model, x, y)
    ref_w, ref_b = jax.grad(_plain_loss, argnums=(0, 1))(model.weight[...], model.bias[...], x, y)
    _assert_close(grads["weight"][...], 2 * ref_w)
    _assert_close(grads["bias"][...], 2 * ref_b)


def test_nnx_optax_training_matches_plain_jax():
    nnx, Linear, _ = _nnx_classes()
    optax = _optax()
    model = Linear(IN, OUT, rngs=nnx.Rngs(1))
    x, y = _data()
    (ref_w, ref_b), ref_losses = _plain_training(model.weight[...], model.bias[...], x, y)
    optimizer = nnx.Optimizer(model, optax.adam(LR), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(_nnx_loss)(model, x, y)
        optimizer.update(model, grads)  # updates the model's Params in place
        return loss

    losses = [float(train_step(model, optimizer, x, y)) for _ in range(STEPS)]
    assert losses[-1] < 0.5 * losses[0]
    _assert_close(losses, ref_losses)
    _assert_close(model.weight[...], ref_w)
    _assert_close(model.bias[...], ref_b)
    assert model.weight[...].dtype == jnp.float32
