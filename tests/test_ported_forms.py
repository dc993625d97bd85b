"""Forms ported code uses (SPEC section 11): PyTorch 2's setup_context, once_differentiable."""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn

X = jnp.array([0.5, -1.0, 2.0])


class MulAdd(jaxfn.Function):
    """PyTorch 2's recommended form: forward without ctx, setup_context saves."""

    @staticmethod
    def forward(x, y, scale=2.0):
        return x * y * scale + 1

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y, scale = inputs
        ctx.save_for_backward(x, y)
        ctx.scale = scale

    @staticmethod
    def backward(ctx, grad_output):
        x, y = ctx.saved_tensors
        return grad_output * y * ctx.scale, grad_output * x * ctx.scale, None


def _plain(x, y, scale=2.0):
    return x * y * scale + 1


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit])
def test_setup_context_in_the_class_style(transform):
    y = jnp.array([1.5, 2.0, -0.5])
    got = transform(jax.grad(lambda x, y: MulAdd.apply(x, y, 3.0).sum(), (0, 1)))(X, y)
    want = jax.grad(lambda x, y: _plain(x, y, 3.0).sum(), (0, 1))(X, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    np.testing.assert_allclose(MulAdd.apply(X, y), _plain(X, y), rtol=1e-12)
    assert jaxfn.gradcheck(MulAdd.apply, X, y)


def _square_forward(x):
    return x**2


def _square_setup(ctx, inputs, output):
    (x,) = inputs
    assert ctx.needs_input_grad[0] in (True, False)
    ctx.save_for_backward(x=x)


def _square_backward(ctx, grad_output):
    return grad_output * 2 * ctx.saved_variables.x


def test_setup_context_as_an_argument_and_pickling():
    square = jaxfn.autograd_function(_square_forward, _square_backward, setup_context=_square_setup, name="square")
    np.testing.assert_allclose(jax.grad(lambda x: square(x).sum())(X), 2 * X)
    for _ in range(4):  # eagerly, past the eager path's validation
        np.testing.assert_allclose(square(X), X**2)
    again = pickle.loads(pickle.dumps(square))
    np.testing.assert_allclose(jax.grad(lambda x: again(x).sum())(X), 2 * X)


def test_setup_context_with_a_forward_that_takes_ctx_is_refused():
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'f': setup_context is given, so forward must not take"):
        jaxfn.autograd_function(lambda ctx, x: x, lambda ctx, g: g, setup_context=lambda c, i, o: None, name="f")


def test_setup_context_can_mark_outputs():
    def forward(x):
        return x * 2, jnp.argsort(x).astype(x.dtype)

    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, g, g_order):
        assert not jnp.any(g_order)  # zeros: marked non-differentiable
        return g * 2

    f = jaxfn.autograd_function(forward, backward, setup_context=setup_context, name="with_order")
    np.testing.assert_allclose(jax.grad(lambda x: sum(o.sum() for o in f(x)))(X), [2.0, 2.0, 2.0])


class HostCube(jaxfn.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    @jaxfn.once_differentiable
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        return grad_output * 3 * x**2


def test_once_differentiable_first_derivative_works():
    np.testing.assert_allclose(jax.grad(lambda x: HostCube.apply(x).sum())(X), 3 * X**2, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: HostCube.apply(x).sum()))(X), 3 * X**2, rtol=1e-12)
    assert jaxfn.gradcheck(HostCube.apply, X)


@pytest.mark.parametrize(
    "second",
    [
        lambda f: jax.grad(lambda x: jax.grad(lambda x: f(x).sum())(x).sum())(X),
        lambda f: jax.jit(jax.grad(lambda x: jax.grad(lambda x: f(x).sum())(x).sum()))(X),
    ],
    ids=["grad of grad", "jit grad of grad"],
)
def test_once_differentiable_refuses_a_second_derivative(second):
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'HostCube': its backward is marked jaxfn.once_diff"):
        second(HostCube.apply)


def test_once_differentiable_and_forward_mode_are_refused_together():
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'f': it has forward_mode=True, whose tangent rule"):
        jaxfn.autograd_function(
            lambda ctx, x: x, jaxfn.once_differentiable(lambda ctx, g: g), name="f", forward_mode=True
        )
