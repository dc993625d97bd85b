"""Every misuse: an AutogradFunctionError naming the function, the place, expected vs got."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn

X = jnp.ones((2, 3))
W = jnp.ones(3)


def _grad_of(backward, forward=None, name="mul"):
    def default_forward(ctx, x, w):
        return x * w

    f = jaxfn.autograd_function(forward or default_forward, backward, name=name)
    return lambda: jax.grad(lambda x, w: f(x, w).sum(), (0, 1))(X, W)


def _raises(kind, match, call):
    with pytest.raises(kind, match=match) as info:
        call()
    assert isinstance(info.value, jaxfn.AutogradFunctionError)
    return info.value


@pytest.mark.parametrize(
    "forward, backward, match",
    [
        (42, lambda ctx, g: g, r"'f': forward must be a function taking ctx first, but got an int"),
        (lambda ctx, x: x, None, r"'f': backward must be a function taking ctx first, but got a NoneType"),
        (lambda: 1, lambda ctx, g: g, r"'f': forward must take the context as its first parameter.*\(\)"),
        (lambda *, x: x, lambda ctx, g: g, r"forward must take the context as its first parameter"),
        (lambda ctx, x: x, lambda: 1, r"'f': backward must take the context as its first parameter"),
    ],
)
def test_bad_definitions_are_refused_at_definition(forward, backward, match):
    _raises(TypeError, match, lambda: jaxfn.autograd_function(forward, backward, name="f"))


def test_default_name_is_forward_name():
    def my_op(ctx, x):
        return "nope"

    f = jaxfn.autograd_function(my_op, lambda ctx, g: g)
    assert f.name == "my_op"
    _raises(TypeError, r"'my_op': forward must return arrays.*but its output is a str", lambda: f(W))


@pytest.mark.parametrize(
    "out, match",
    [
        (lambda x: ("label", 3), r"'f': forward must return arrays .* but it has none"),
        (lambda x: (x, np.array(["a", "b"])), r"'f': forward returned a NumPy array of dtype <U1 as output\[1\]"),
        (lambda x: None, r"'f': forward returned None.*miss a return statement"),
    ],
)
def test_bad_outputs(out, match):
    f = jaxfn.autograd_function(lambda ctx, x: out(x), lambda ctx, *g: None, name="f")
    _raises(TypeError, match, lambda: f(W))


def test_mark_non_differentiable_of_something_not_returned():
    def forward(ctx, x):
        ctx.mark_non_differentiable(x * 2)
        return x * 3

    f = jaxfn.autograd_function(forward, lambda ctx, g: g, name="f")
    _raises(TypeError, r"'f': ctx.mark_non_differentiable\(\) takes values that forward returns", lambda: f(W))


def test_wrong_shape_names_parameter_expected_and_got():
    err = _raises(
        ValueError,
        r"'mul': backward returned a gradient for 'w' with shape \(4,\), but 'w' has shape \(3,\), so the "
        r"shapes do not match \(and \(3,\) does not broadcast to \(4,\)\)",
        _grad_of(lambda ctx, g: {"x": g, "w": jnp.ones(4)}),
    )
    assert "jaxfn:" in str(err)


def test_scalar_gradient_for_vector_input_is_an_error():
    _raises(ValueError, r"'w' with shape \(\), but 'w' has shape \(3,\)", _grad_of(lambda ctx, g: {"x": g, "w": 1.0}))


def test_all_mismatches_of_one_call_are_reported_together():
    err = _raises(
        TypeError,
        r"2 problems in one call",
        _grad_of(lambda ctx, g: {"x": jnp.ones((5,)), "w": jnp.ones(3, jnp.int32)}),
    )
    assert "'x' with shape (5,)" in str(err) and "'w' with dtype int32" in str(err)


def test_complex_gradient_for_real_input():
    _raises(
        TypeError,
        r"'w' with complex dtype complex128, but 'w' is real \(float64\); return the real part",
        _grad_of(lambda ctx, g: {"x": g, "w": jnp.ones(3, jnp.complex128)}),
    )


def test_gradient_that_is_not_an_array():
    _raises(TypeError, r"returned a str as the gradient for 'w'", _grad_of(lambda ctx, g: {"x": g, "w": "zero"}))


def test_unknown_parameter_in_dict():
    _raises(
        TypeError,
        r"backward returned gradients for 'weight', but the parameters of 'mul' are 'x', 'w'",
        _grad_of(lambda ctx, g: {"x": g, "weight": g}),
    )


def test_tuple_of_wrong_length():
    _raises(
        TypeError,
        r"'mul': backward returned 3 gradients for 2 parameters \(x, w\)",
        _grad_of(lambda ctx, g: (g, g, g)),
    )


def test_bare_array_for_several_parameters():
    _raises(
        TypeError,
        r"'mul': backward must return a dict keyed by parameter name.* but it returned an array of "
        r"shape \(2, 3\) and dtype float64 for a function with 2 parameters \(x, w\)",
        _grad_of(lambda ctx, g: g),
    )


def test_gradient_for_static_parameter_says_how_to_fix():
    f = jaxfn.autograd_function(lambda ctx, x, c: x * c, lambda ctx, g: (g * 2, g.sum()), name="mul_constant")
    _raises(
        TypeError,
        r"'mul_constant': backward returned a gradient for 'c', but it is a static argument \(an int\).*pass a "
        r"floating-point jnp array",
        lambda: jax.grad(lambda x: f(x, 2).sum())(W),
    )


def test_pytree_gradient_with_wrong_structure():
    def forward(ctx, params):
        return params["a"] * params["b"]

    f = jaxfn.autograd_function(forward, lambda ctx, g: {"params": (g, g)}, name="f")
    _raises(
        TypeError,
        r"gradient for 'params' with pytree structure PyTreeDef\(\(\*, \*\)\), but 'params' has "
        r"structure PyTreeDef\(\{'a': \*, 'b': \*\}\)",
        lambda: jax.grad(lambda p: f(p).sum())({"a": W, "b": W}),
    )


def test_single_array_for_pytree_parameter():
    f = jaxfn.autograd_function(lambda ctx, p: p["a"] * p["b"], lambda ctx, g: {"p": g}, name="f")
    _raises(
        TypeError,
        r"returned an array of shape \(3,\) and dtype float64 for 'p', but that part of 'p' is a dict, a "
        r"pytree with 2 leaves",
        lambda: jax.grad(lambda p: f(p).sum())({"a": W, "b": W}),
    )


def test_wrong_key_path_is_named():
    f = jaxfn.autograd_function(lambda ctx, p: p["a"] * p["b"], lambda ctx, g: {"p": {"a": g, "b": g[:2]}}, name="f")
    _raises(
        ValueError,
        r"gradient for 'p\['b'\]' with shape \(2,\), but 'p\['b'\]' has shape \(3,\)",
        lambda: jax.grad(lambda p: f(p).sum())({"a": W, "b": W}),
    )


def test_backward_with_too_few_parameters():
    f = jaxfn.autograd_function(lambda ctx, x: (x, x * 2), lambda ctx, g: g, name="two_out")
    _raises(
        TypeError,
        r"'two_out': backward must accept ctx and 2 grad_output argument\(s\), one per output of "
        r"forward, but its signature is \(ctx, g\)",
        lambda: jax.grad(lambda x: f(x)[0].sum())(W),
    )


def test_default_mode_forward_error_names_function_and_fix():
    f = jaxfn.autograd_function(lambda ctx, x: jnp.sin(x), lambda ctx, g: g, name="my_sin")
    for transform in (lambda: jax.jvp(f, (W,), (W,)), lambda: jax.jacfwd(f)(W)):
        err = _raises(TypeError, r"'my_sin': it was differentiated in forward mode.*forward_mode=True", transform)
        assert isinstance(err.__cause__, (TypeError, NotImplementedError))  # the latter: jax_custom_vjp3


def test_user_exceptions_pass_through_untouched():
    def backward(ctx, g):
        raise RuntimeError("my bug")

    f = jaxfn.autograd_function(lambda ctx, x: x * 1, backward)
    with pytest.raises(RuntimeError, match="my bug"):
        jax.grad(lambda x: f(x).sum())(W)


def test_a_failed_call_leaves_the_function_usable():
    calls = []

    def backward(ctx, g):
        calls.append(1)
        if len(calls) == 1:
            return jnp.ones(7)  # wrong shape on the first call only
        return g * 2

    f = jaxfn.autograd_function(lambda ctx, x: x * 2, backward, name="f")
    grad = jax.jit(jax.grad(lambda x: f(x).sum()))
    with pytest.raises(ValueError):
        grad(W)
    assert float(jax.grad(lambda x: f(x).sum())(W).sum()) == 6.0
    with pytest.raises(TypeError):
        f(W, W)
    assert float(f(W).sum()) == 6.0
