"""The seeds' example functions, written with jaxfn as the R torch documents write them."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp

import jaxfn


def linear_forward(ctx, input, weight, bias=None):
    ctx.save_for_backward(input=input, weight=weight, bias=bias)
    output = input @ weight.T
    if bias is not None:
        output = output + bias
    return output


def linear_backward(ctx, grad_output):
    s = ctx.saved_variables
    grads = {"input": None, "weight": None, "bias": None}
    if ctx.needs_input_grad.input:
        grads["input"] = grad_output @ s.weight
    if ctx.needs_input_grad.weight:
        grads["weight"] = grad_output.T @ s.input
    if s.bias is not None and ctx.needs_input_grad.bias:
        grads["bias"] = grad_output.sum(0)
    return grads


linear = jaxfn.autograd_function(forward=linear_forward, backward=linear_backward, name="linear")


def _mul_constant_forward(ctx, tensor, constant):
    ctx.save_for_backward(constant=constant)
    return tensor * constant


def _mul_constant_backward(ctx, grad_output):
    v = ctx.saved_variables
    return {"tensor": grad_output * v.constant}


mul_constant = jaxfn.autograd_function(_mul_constant_forward, _mul_constant_backward, name="mul_constant")


def _exp2_forward(ctx, i):
    result = jnp.exp(i)
    ctx.save_for_backward(result=result)
    return result


def _exp2_backward(ctx, grad_output):
    return {"i": grad_output * ctx.saved_variables.result}


exp2 = jaxfn.autograd_function(_exp2_forward, _exp2_backward, name="exp2")


def _my_relu_forward(ctx, input):
    ctx.save_for_backward(input=input)
    return jnp.clip(input, min=0)


def _my_relu_backward(ctx, grad_output):
    v = ctx.saved_variables
    grad_input = jnp.where(v.input < 0, 0, grad_output)
    return {"input": grad_input}


my_relu = jaxfn.autograd_function(_my_relu_forward, _my_relu_backward, name="my_relu")


def plain_linear_free(input, weight, bias=None):
    """The same math as ``linear``, in plain JAX: the reference for its gradients."""
    output = input @ weight.T
    return output if bias is None else output + bias


# -- the tutorial's ReLU three ways, and its training step: shared by the tests and benchmarks/ --
D_IN, H, D_OUT, LR = 1000, 100, 10, 1e-6


def make_jaxfn_relu(forward_mode=False, jit=False):
    """The tutorial's my_relu, written with jaxfn (a fresh function each call)."""
    return jaxfn.autograd_function(
        _my_relu_forward, _my_relu_backward, name="my_relu", forward_mode=forward_mode, jit=jit
    )


def make_custom_vjp_relu():
    """The same ReLU as a hand-written jax.custom_vjp."""

    @jax.custom_vjp
    def relu(x):
        return jnp.clip(x, min=0)

    relu.defvjp(lambda x: (jnp.clip(x, min=0), x), lambda x, g: (jnp.where(x < 0, 0, g),))
    return relu


def plain_relu(x):
    """The same ReLU, differentiated by JAX's own autodiff."""
    return jnp.clip(x, min=0)


def make_step(relu):
    """One SGD step of the tutorial's two-layer net with ``relu``."""

    def loss(params, x, y):
        w1, w2 = params
        return ((relu(x @ w1) @ w2 - y) ** 2).sum()

    def step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)

    return step


def run_on_8_devices(code: str, cwd: str) -> subprocess.CompletedProcess:
    """``python -c code`` with 8 host CPU devices (set before JAX is imported), bounded in time."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=cwd)


@jax.tree_util.register_pytree_node_class
class StaticNode:
    """A pytree node with one array child and static (aux) data of the test's choosing: equal
    values of different types (1 and 1.0), or an unhashable dict."""

    def __init__(self, value, static):
        self.value, self.static = value, static

    def tree_flatten(self):
        return (self.value,), self.static

    @classmethod
    def tree_unflatten(cls, static, children):
        return cls(children[0], static)


def make_mul_with_jvp(jvp, materialize=True):
    """x * y with the given jvp rule, named 'mul': forward saves x and y for backward and for the
    jvp rule, and keeps ctx.needs_input_grad on ctx as ``ctx.needs`` for it to read."""

    def forward(ctx, x, y):
        ctx.set_materialize_grads(materialize)
        ctx.save_for_backward(x, y)
        ctx.save_for_forward(x, y)
        ctx.needs = ctx.needs_input_grad
        return x * y

    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x

    return jaxfn.autograd_function(forward, backward, jvp=jvp, name="mul")
