"""The seeds' example functions, written with jaxfn as the R torch documents write them."""

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
