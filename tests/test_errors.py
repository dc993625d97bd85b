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
    _raises(
        TypeError,
        r"'f': ctx.mark_non_differentiable\(\) takes values that forward returns, but its argument 0 \(an array of "
        r"shape \(3,\)\) is not among forward's outputs; pass the very arrays you return",
        lambda: f(W),
    )


def _marking(*which):
    def forward(ctx, x, params, order):
        out = x * params["w"]
        given = {"out": out, "x": x, "w": params["w"], "order": order}
        ctx.mark_non_differentiable(*(given[name] for name in which))
        return out, order.argsort()

    return forward


@pytest.mark.parametrize(
    "host",
    [False, True],
    ids=["jax", "host"],
)
def test_mark_non_differentiable_names_the_argument_and_the_input_it_is(host, maybe_jit):
    args = (W, {"w": W * 2}, jnp.array([2, 0, 1]))
    cases = [
        (
            ("order",),
            r"its argument 0 \(forward's input 'order'\) is not among forward's outputs \(an input is not an "
            r"output unless forward returns it\); pass the very arrays you return",
        ),
        (("out", "x"), r"its argument 1 \(forward's input 'x'\) is not"),
        (
            ("out", "order", "w"),
            r"its argument 1 \(forward's input 'order'\) and argument 2 \(forward's input "
            r"'params\['w'\]'\) are not among",
        ),
    ]
    for which, match in cases:
        f = jaxfn.autograd_function(_marking(*which), lambda ctx, g, h: (g, None, None), host=host, name="marks")
        _raises(
            TypeError,
            r"^jaxfn: 'marks': ctx.mark_non_differentiable\(\) takes values that forward returns, but " + match,
            lambda f=f: maybe_jit(f)(*args),
        )
    fine = jaxfn.autograd_function(_marking("out"), lambda ctx, g, h: (g, None, None), host=host, name="marks")
    assert jaxfn.AutogradFunction.output_differentiable(fine, *args) == (False, False)


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
        # refused by jaxfn at the call (forward mode is seen there), or JAX's refusal (jax_custom_vjp3), chained
        assert err.__cause__ is None or isinstance(err.__cause__, (TypeError, NotImplementedError))


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


# -- a newcomer's first mistakes ---------------------------------------------------------------------
def test_forward_written_without_ctx_says_the_first_parameter_is_the_context():
    def forward(x, y):  # PyTorch 2's ctx-less form, without setup_context
        return x * y

    f = jaxfn.autograd_function(forward, lambda ctx, g: (g, g), name="mul")

    class Mul(jaxfn.Function):
        @staticmethod
        def forward(x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g, g

    for call in (lambda: f(W, W), lambda: jax.jit(f)(W, W), lambda: Mul.apply(W, W)):
        _raises(
            TypeError,
            r"too many positional arguments: 2 for forward\(x, y\), which takes 1 after its first parameter 'x', "
            r"and that one is always the context.*forward\(ctx, \.\.\.\).*setup_context\(ctx, inputs, output\)",
            call,
        )


def test_a_dict_gradient_with_an_unknown_key_for_a_one_parameter_function_names_the_key():
    f = jaxfn.autograd_function(lambda ctx, input: input * 2, lambda ctx, g: {"x": g}, name="double")
    _raises(
        TypeError,
        r"'double': backward returned gradients for 'x', but the only parameter of 'double' is 'input'; key the "
        r"dict by forward's parameter names",
        lambda: jax.grad(lambda x: f(x).sum())(W),
    )


class _Exp(jaxfn.Function):
    @staticmethod
    def forward(ctx, x):
        return jnp.exp(x)

    @staticmethod
    def backward(ctx, g):
        return g


@pytest.mark.parametrize(
    "call, how",
    [(lambda: _Exp(W), r"_Exp\(\.\.\.\)"), (lambda: _Exp()(W), r"_Exp\(\)\(\.\.\.\)")],
    ids=["cls", "instance"],
)
def test_a_function_class_called_directly_says_to_call_apply(call, how):
    _raises(
        TypeError,
        rf"'_Exp': a jaxfn.Function subclass is called through its apply class method, as in PyTorch, but it was "
        rf"called as {how}; call _Exp.apply\(\.\.\.\)",
        call,
    )
    assert float(_Exp.apply(0.0)) == 1.0


def test_apply_on_a_function_made_by_autograd_function_says_to_call_it_directly():
    exp = jaxfn.autograd_function(lambda ctx, x: jnp.exp(x), lambda ctx, g: g, name="exp")
    _raises(
        TypeError,
        r"'exp': a function made by jaxfn.autograd_function .* is called directly, .* but it was called as "
        r"exp.apply\(\.\.\.\) .*; call it with the same arguments: exp\(\.\.\.\)",
        lambda: exp.apply(W),
    )
    assert float(exp(0.0)) == 1.0


def _branching_forward(ctx, x):
    if x.sum() > 0:  # a Python if on an array's value
        return x
    return -x


def _item_forward(ctx, x):
    return x * float(x.sum())


def _numpy_backward(ctx, g):
    return jnp.asarray(np.asarray(g) * 2)


def _int_forward(ctx, x):
    return x * [1.0, 2.0, 3.0][x.sum().astype(int)]


@pytest.mark.parametrize(
    "forward, backward, role, what, fix",
    [
        (_branching_forward, lambda ctx, g: g, "forward", "used the value of an array as a Python bool", "jnp.where"),
        (
            _item_forward,
            lambda ctx, g: g,
            "forward",
            r"read the concrete value of an array \(float\(\), \.item\(\)",
            "jax.lax.cond",
        ),
        (_int_forward, lambda ctx, g: g, "forward", r"used the value of an array as a Python int", "jnp.where"),
        (lambda ctx, x: x * 2, _numpy_backward, "backward", r"handed an array to NumPy", "host=True"),
    ],
    ids=["if", "float", "int", "numpy"],
)
def test_tracer_errors_in_forward_or_backward_name_the_function_and_the_fix(forward, backward, role, what, fix):
    f = jaxfn.autograd_function(forward, backward, name="mine")
    err = _raises(
        TypeError,
        rf"^jaxfn: 'mine': {role} {what}.*but under jax.jit .*{role} runs on tracers.*{fix}",
        lambda: jax.jit(jax.grad(lambda x: f(x).sum()))(jnp.ones(3)),
    )
    chain = []  # chained from JAX's own error (under jax.grad's backward pass, JAX puts its stack trace between)
    while err is not None and len(chain) < 5:
        chain.append(err)
        err = err.__cause__ or err.__context__
    assert any(isinstance(e, jax.errors.JAXTypeError) for e in chain), chain
    assert "_reverse_mode.py" not in str(chain[0]) and "argument unknown" not in str(chain[0])


def test_tracer_errors_in_eager_calls_pass_through_unchanged():
    def forward(ctx, x):  # the user's own jax.jit, inside an eager call: their error, as it is
        return jax.jit(lambda y: y if y.sum() > 0 else -y)(x)

    f = jaxfn.autograd_function(forward, lambda ctx, g: g, name="mine")
    with pytest.raises(jax.errors.TracerBoolConversionError) as info:
        f(W)
    assert not isinstance(info.value, jaxfn.AutogradFunctionError)
    assert float(jaxfn.autograd_function(_branching_forward, lambda ctx, g: g)(W).sum()) == 3.0  # eager: fine


# -- a newcomer's first hour: misuses found by probing (each once a raw traceback or a silent result) --


@pytest.mark.parametrize("bad", ["nonsense", jnp.ones((7, 7)), {"bogus": 1}], ids=["str", "wrong shape", "dict"])
@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_gradient_that_cant_be_one_for_an_integer_argument_is_refused(bad, transform):
    f = jaxfn.autograd_function(lambda ctx, a, n: a * n, lambda ctx, g, bad=bad: (g, bad), name="scale")
    kind = ValueError if hasattr(bad, "shape") else TypeError
    match = r"'scale': backward returned .* for 'n', but 'n' .*int\d+, which is never differentiated; return None"
    _raises(kind, match, lambda: transform(jax.grad(lambda a: f(a, jnp.arange(3)).sum()))(W))


def test_zeros_returned_for_an_integer_argument_are_accepted_and_dropped():
    f = jaxfn.autograd_function(lambda ctx, a, n: a * n, lambda ctx, g: (g * 2.0, jnp.zeros(3, int)), name="scale")
    np.testing.assert_allclose(jax.grad(lambda a: f(a, jnp.arange(3)).sum())(W), 2.0 * np.ones(3))


def test_flags_take_true_or_false_only():
    def forward(ctx, x):
        ctx.set_materialize_grads("False")
        return x * 2.0

    f = jaxfn.autograd_function(forward, lambda ctx, g: g * 2.0, name="two")
    _raises(
        TypeError, r"'two': ctx.set_materialize_grads\(\) takes True or False, .* got a str \('False'\)", lambda: f(W)
    )
    _raises(
        TypeError,
        r"set_detect_anomaly\(\) takes True or False, but got a str \('off'\)",
        lambda: jaxfn.set_detect_anomaly("off"),
    )


def test_saved_tensors_out_of_range_is_named_in_backward_and_in_a_jvp_rule():
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2.0

    f = jaxfn.autograd_function(forward, lambda ctx, g: g * ctx.saved_tensors[1], name="two")
    error = _raises(
        IndexError,
        r"'two': ctx.saved_tensors\[1\] is out of range: it has 1 entry",
        lambda: jax.grad(lambda x: f(x).sum())(W),
    )
    assert isinstance(error, jaxfn.AutogradFunctionError)
    g = jaxfn.autograd_function(forward, lambda ctx, g: g, name="two", jvp=lambda ctx, t: t * ctx.saved_tensors[0])
    _raises(
        IndexError,
        r"ctx.saved_tensors\[0\] is out of range: it has 0 entries.*ctx.save_for_forward",
        lambda: jax.jvp(g, (W,), (W,)),
    )


@pytest.mark.parametrize("dims", ["0", 0.0, True], ids=["str", "float", "bool"])
def test_a_vmap_rule_out_dim_that_is_not_an_int_is_named(dims):
    f = jaxfn.autograd_function(
        lambda ctx, a: a * 2, lambda ctx, g: g * 2, name="double", vmap=lambda info, d, a, dims=dims: (a * 2, dims)
    )
    _raises(TypeError, r"'double': vmap's out_dims must give an int \(or None\) per output", lambda: jax.vmap(f)(X))


def test_a_rule_that_cant_take_its_arguments_is_named_with_what_it_must_take():
    mul = jaxfn.autograd_function(lambda ctx, a, b: a * b, lambda ctx, g: (g, g), name="mul", jvp=lambda ctx, ta: ta)
    _raises(
        TypeError,
        r"'mul': jvp must take ctx and one tangent per argument .* jvp\(ctx, t_a, t_b\), but its "
        r"signature is \(ctx, ta\)",
        lambda: jax.jvp(mul, (W, W), (W, W)),
    )
    double = jaxfn.autograd_function(
        lambda ctx, a: a * 2, lambda ctx, g: g * 2, name="double", vmap=lambda info, a: (a * 2, 0)
    )
    _raises(
        TypeError,
        r"'double': vmap must take info, in_dims and one value .* vmap\(info, in_dims, a\)",
        lambda: jax.vmap(double)(X),
    )
    setup = jaxfn.autograd_function(
        lambda a: a * 2, lambda ctx, g: g * 2, name="setup", setup_context=lambda ctx, inputs: None
    )
    _raises(TypeError, r"'setup': setup_context must take \(ctx, inputs, output\)", lambda: setup(W))
    inner = jaxfn.autograd_function(
        lambda ctx, a: a * 2, lambda ctx, g: g * 2, name="inner", jvp=lambda ctx, t: t + "x"
    )  # a TypeError of the rule's own: untouched
    with pytest.raises(TypeError) as info:
        jax.jvp(inner, (W,), (W,))
    assert not isinstance(info.value, jaxfn.AutogradFunctionError)


def test_a_host_output_declaration_that_is_not_a_shape_dtype_struct_is_named():
    _raises(
        TypeError,
        r"'double': output= declares .* but output\[0\] is an int \(3\); write, for instance, "
        r"jax.ShapeDtypeStruct",
        lambda: jaxfn.autograd_function(
            lambda ctx, a: a * 2, lambda ctx, g: g * 2, name="double", host=True, output=(3,)
        ),
    )


def test_a_function_class_written_without_staticmethod_is_told_so():
    def make():
        class Double(jaxfn.Function):
            def forward(self, ctx, a):
                return a * 2

            def backward(self, ctx, g):
                return g * 2

        return Double.apply(W)

    _raises(TypeError, r"'Double': (forward|backward)'s first parameter is 'self'.* write @staticmethod", make)


def test_gradcheck_saved_and_their_options_are_checked():
    double = jaxfn.autograd_function(lambda ctx, a: a * 2, lambda ctx, g: g * 2, name="double")
    _raises(
        TypeError, r"jaxfn.gradcheck: gradcheck takes the function first.* got an int", lambda: jaxfn.gradcheck(3, W)
    )
    _raises(
        ValueError,
        r"'double': eps must be a positive number, but got an int \(0\)",
        lambda: jaxfn.gradcheck(double, W, eps=0),
    )
    _raises(
        ValueError, r"'double': atol must be a number >= 0, but got a str", lambda: jaxfn.gradcheck(double, W, atol="1")
    )
    _raises(TypeError, r"jaxfn.saved takes the function first.* got an int", lambda: jaxfn.saved(3, W))


def test_an_unknown_name_on_a_vmap_rule_info_lists_the_names():
    f = jaxfn.autograd_function(
        lambda ctx, a: a * 2, lambda ctx, g: g * 2, name="v", vmap=lambda info, d, a: (a * info.batchsize, d[0])
    )
    _raises(
        AttributeError,
        r"'v': vmap's info has no 'batchsize'; the names it has are: 'batch_size', 'randomness'",
        lambda: jax.vmap(f)(X),
    )


def test_saved_variables_after_a_positional_save_and_mark_dirty_of_a_new_array_say_why():
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2.0

    f = jaxfn.autograd_function(forward, lambda ctx, g: g * ctx.saved_variables.x, name="two")
    _raises(
        AttributeError,
        r"'two': ctx.saved_variables has no 'x'.*by position: read them as ctx.saved_tensors\[i\]",
        lambda: jax.grad(lambda x: f(x).sum())(W),
    )

    def dirty(ctx, x):
        x = x + 1.0
        ctx.mark_dirty(x)
        return x

    g = jaxfn.autograd_function(dirty, lambda ctx, g: g, name="dirty")
    _raises(
        TypeError,
        r"'dirty': ctx.mark_dirty\(\) .* argument 0 is an array that is not one of them.*immutable",
        lambda: g(W),
    )


def test_gradcheck_given_pytorchs_tuple_of_inputs_says_to_unpack_them():
    mul = jaxfn.autograd_function(lambda ctx, a, b: a * b, lambda ctx, g: (g, g), name="mul")
    _raises(
        TypeError,
        r"'mul': .*missing a required argument: 'b'.*gradcheck takes the arguments unpacked",
        lambda: jaxfn.gradcheck(mul, (W, W)),
    )


def test_a_boolean_mask_under_jit_is_named_with_the_jnp_where_fix():
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g.at[x < 0].set(0)  # R's grad_input[input < 0] <- 0

    relu = jaxfn.autograd_function(
        lambda ctx, x: (ctx.save_for_backward(x), jnp.maximum(x, 0))[1], backward, name="my_relu"
    )
    _raises(
        TypeError,
        r"'my_relu': backward indexed an array with a boolean mask.*jnp.where",
        lambda: jax.jit(jax.grad(lambda x: relu(x).sum()))(W),
    )


def test_saved_values_and_flags_are_read_only_by_item_too_and_a_second_save_is_named():
    def backward(ctx, g):
        ctx.saved_variables["x"] = 0
        return g

    def forward(ctx, x):
        ctx.save_for_backward(x=x)
        return x * 2.0

    f = jaxfn.autograd_function(forward, backward, name="double")
    _raises(TypeError, r"'double': ctx.saved_variables is read-only", lambda: jax.grad(lambda x: f(x).sum())(W))

    def flags(ctx, g):
        ctx.needs_input_grad[0] = False
        return g

    g = jaxfn.autograd_function(forward, flags, name="double")
    _raises(TypeError, r"'double': ctx.needs_input_grad is read-only", lambda: jax.grad(lambda x: g(x).sum())(W))

    def saving_twice(ctx, x, w):
        ctx.save_for_backward(input=x)
        ctx.save_for_backward(weight=w)
        return x * w

    h = jaxfn.autograd_function(saving_twice, lambda ctx, g: (g * ctx.saved_variables.input, None), name="linear")
    _raises(
        AttributeError,
        r"'input' was saved by an earlier ctx.save_for_backward call.*in one call",
        lambda: jax.grad(lambda w: h(W, w).sum())(W),
    )
