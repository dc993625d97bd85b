"""Under jit, jaxfn compiles to the same computation as a hand-written jax.custom_vjp."""

import collections
import re

import jax
import jax.numpy as jnp
import pytest

import jaxfn


def _relu_jaxfn(forward_mode):
    def forward(ctx, input):
        ctx.save_for_backward(input=input)
        return jnp.clip(input, min=0)

    def backward(ctx, grad_output):
        return {"input": jnp.where(ctx.saved_variables.input < 0, 0, grad_output)}

    return jaxfn.autograd_function(forward, backward, name="my_relu", forward_mode=forward_mode)


def _relu_custom_vjp():
    @jax.custom_vjp
    def relu(x):
        return jnp.clip(x, min=0)

    relu.defvjp(lambda x: (jnp.clip(x, min=0), x), lambda x, g: (jnp.where(x < 0, 0, g),))
    return relu


def _opcodes(relu):
    def loss(params, x, y):
        w1, w2 = params
        return ((relu(x @ w1) @ w2 - y) ** 2).sum()

    def step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 1e-6 * g, params, grads)

    args = ((jnp.ones((20, 8)), jnp.ones((8, 3))), jnp.ones((16, 20)), jnp.ones((16, 3)))
    text = jax.jit(step).lower(*args).compile().as_text()
    return collections.Counter(re.findall(r" = \S+ (\w[\w-]*)\(", text))


@pytest.mark.parametrize("forward_mode", [False, True])
def test_training_step_compiles_to_the_same_hlo_as_custom_vjp(forward_mode):
    got, want = _opcodes(_relu_jaxfn(forward_mode)), _opcodes(_relu_custom_vjp())
    assert sum(want.values()) > 10
    assert got == want
