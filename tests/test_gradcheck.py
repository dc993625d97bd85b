"""jaxfn.gradcheck: right backwards pass, wrong ones are caught and located."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import exp2, linear, make_mul_with_jvp, mul_constant, my_relu

import jaxfn

K = jax.random.split(jax.random.key(7), 3)
X = jax.random.normal(K[0], (5, 3))
W = jax.random.normal(K[1], (4, 3))
B = jax.random.normal(K[2], (4,))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_seed_functions_pass(dtype):
    x, w, b = (a.astype(dtype) for a in (X, W, B))
    assert jaxfn.gradcheck(linear, x, w, b)
    assert jaxfn.gradcheck(linear, x, w)
    assert jaxfn.gradcheck(linear, x, weight=w, bias=b)
    assert jaxfn.gradcheck(mul_constant, x, 2)  # a static argument, skipped
    assert jaxfn.gradcheck(exp2, x, order=2)
    assert jaxfn.gradcheck(my_relu, x + 0.05)  # away from the kink


def _wrong(name, transform):
    def backward(ctx, g):
        grads = linear.backward(ctx, g)
        grads[name] = transform(grads[name])
        return grads

    return jaxfn.autograd_function(linear.forward, backward, name="linear")


def test_scale_error_is_caught():
    with pytest.raises(jaxfn.GradcheckError, match=r"gradient for 'input' disagrees.*worst at index \(\d, \d\)"):
        jaxfn.gradcheck(_wrong("input", lambda g: 2 * g), X, W, B)


def test_sign_error_in_one_of_several_parameters_names_it():
    with pytest.raises(jaxfn.GradcheckError, match=r"for 'bias' disagrees") as info:
        jaxfn.gradcheck(_wrong("bias", lambda g: -g), X, W, B)
    assert "analytical" in str(info.value) and "numerical" in str(info.value) and "atol 1e-05" in str(info.value)


def test_wrong_element_is_located():
    wrong = _wrong("weight", lambda g: g.at[2, 1].add(1.0))
    with pytest.raises(jaxfn.GradcheckError, match=r"'weight'.*worst at index \(2, 1\).*1 of 12 elements disagree"):
        jaxfn.gradcheck(wrong, X, W, B)


def test_wrong_leaf_inside_pytree_is_named_with_key_path():
    def forward(ctx, params, x):
        ctx.save_for_backward(params=params, x=x)
        return jnp.tanh(x @ params["w"] + params["b"])

    def backward(ctx, g):
        s = ctx.saved_variables
        d = g * (1 - jnp.tanh(s.x @ s.params["w"] + s.params["b"]) ** 2)
        return {"params": {"w": s.x.T @ d, "b": 0.5 * d.sum(0)}, "x": d @ s.params["w"].T}

    dense = jaxfn.autograd_function(forward, backward, name="dense")
    params = {"w": W.T, "b": B}
    with pytest.raises(jaxfn.GradcheckError, match=r"for 'params\['b'\]' disagrees"):
        jaxfn.gradcheck(dense, params, X)


def test_multiple_outputs_and_keywords():
    def forward(ctx, x, *, scale):
        ctx.save_for_backward(x=x, scale=scale)
        return jnp.sin(x) * scale, jnp.cos(x)

    def backward(ctx, g_sin, g_cos):
        s = ctx.saved_variables
        return {"x": g_sin * s.scale * jnp.cos(s.x) - g_cos * jnp.sin(s.x), "scale": (g_sin * jnp.sin(s.x)).sum()}

    f = jaxfn.autograd_function(forward, backward, name="f")
    assert jaxfn.gradcheck(f, X, scale=jnp.array(1.5))
    wrong = jaxfn.autograd_function(forward, lambda ctx, a, b: {**backward(ctx, a, b), "scale": None}, name="f")
    with pytest.raises(jaxfn.GradcheckError, match="for 'scale' disagrees"):
        jaxfn.gradcheck(wrong, X, scale=jnp.array(1.5))


def test_wrong_second_derivative_with_order_2():
    def forward(ctx, x):
        ctx.save_for_backward(x=x)
        return jnp.sin(x)

    def backward(ctx, g):  # right values, but a stray stop_gradient: its own derivative is wrong
        return g * jnp.cos(jax.lax.stop_gradient(ctx.saved_variables.x))

    f = jaxfn.autograd_function(forward, backward, name="sin")
    assert jaxfn.gradcheck(f, X)
    with pytest.raises(jaxfn.GradcheckError, match=r"gradient of the backward \(order=2\) for 'x' disagrees"):
        jaxfn.gradcheck(f, X, order=2)


def test_raise_exception_false_returns_a_false_report_with_the_failure():
    report = jaxfn.gradcheck(_wrong("input", lambda g: 2 * g), X, W, B, raise_exception=False)
    assert not report and report.failure is not None
    # backward failed: it is the report's failure, not a check that passed
    assert "fails (0 checks passed, then one failed)" in str(report)
    assert "ran: backward" not in str(report)
    assert "failed: jaxfn.gradcheck: 'linear': the gradient for" in str(report)


@pytest.mark.parametrize("fails", [False, True])
def test_x64_setting_is_restored(fails):
    fn = _wrong("input", lambda g: 2 * g) if fails else linear
    jax.config.update("jax_enable_x64", False)
    try:
        jaxfn.gradcheck(fn, X.astype(jnp.float32), W.astype(jnp.float32), raise_exception=False)
        assert jax.config.jax_enable_x64 is False
    finally:
        jax.config.update("jax_enable_x64", True)
    jaxfn.gradcheck(fn, X, W, raise_exception=False)
    assert jax.config.jax_enable_x64 is True


def test_plain_jax_functions_and_class_style():
    assert jaxfn.gradcheck(lambda x, y: jnp.sin(x) * y, X, X)

    class Cube(jaxfn.Function):
        @staticmethod
        def forward(ctx, value):
            ctx.save_for_backward(value)
            return value**3

        @staticmethod
        def backward(ctx, g):
            return g * 3 * ctx.saved_tensors[0]  # wrong: should be squared

    with pytest.raises(jaxfn.GradcheckError, match="for 'value' disagrees"):
        jaxfn.gradcheck(Cube.apply, X)


def test_scales_to_thousands_of_elements():
    x = jax.random.normal(K[0], (64, 64))
    assert jaxfn.gradcheck(exp2, x * 0.1)


def test_bad_order():
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        jaxfn.gradcheck(exp2, X, order=3)


def _scale_function(factor):
    """x * 3 (a Python or NumPy scalar works too) with a backward that multiplies by ``factor``."""
    return jaxfn.autograd_function(lambda ctx, x: x * 3.0, lambda ctx, g: g * factor, name="times3")


@pytest.mark.parametrize(
    "value",
    [1.5, np.float32(1.5), np.float64(1.5), jnp.asarray([1.5, 2.0], jnp.bfloat16), jnp.asarray(1.5, jnp.float16)],
    ids=["python float", "numpy float32", "numpy float64", "bfloat16", "float16"],
)
def test_scalars_and_low_precision_inputs_are_checked(value):
    assert jaxfn.gradcheck(_scale_function(3.0), value)
    with pytest.raises(jaxfn.GradcheckError, match="for 'x' disagrees"):
        jaxfn.gradcheck(_scale_function(4.0), value)


def test_nothing_to_check_is_an_error():
    f = jaxfn.autograd_function(lambda ctx, x, n: x * n, lambda ctx, g: None, name="f")
    with pytest.raises(jaxfn.GradcheckError, match="there is nothing to check: no argument has a floating-point"):
        jaxfn.gradcheck(f, jnp.arange(3), 2)
    integer_out = jaxfn.autograd_function(lambda ctx, x: jnp.argmax(x), lambda ctx, g: None, name="argmax")
    with pytest.raises(jaxfn.GradcheckError, match="no output is floating-point or complex and differentiable"):
        jaxfn.gradcheck(integer_out, jnp.ones(3))


def _complex_square(conjugate_wrongly):
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        d = 2 * z
        return g * (jnp.conj(d) if conjugate_wrongly else d)  # JAX's convention: no conjugate

    def forward(ctx, z):
        ctx.save_for_backward(z)
        return z * z

    return jaxfn.autograd_function(forward, backward, name="csquare")


@pytest.mark.parametrize("dtype", [jnp.complex64, jnp.complex128])
def test_complex_inputs_and_outputs_are_checked(dtype):
    z = jnp.asarray([0.3 + 0.7j, -1.1 + 0.2j], dtype)
    assert jaxfn.gradcheck(_complex_square(False), z)
    with pytest.raises(jaxfn.GradcheckError, match="for 'z' disagrees"):
        jaxfn.gradcheck(_complex_square(True), z)
    assert jaxfn.gradcheck(_complex_square(False), z, order=2)


def test_real_input_complex_output():
    good = jaxfn.autograd_function(lambda ctx, x: x * (1 + 2j), lambda ctx, g: jnp.real(g * (1 + 2j)), name="rot")
    bad = jaxfn.autograd_function(lambda ctx, x: x * (1 + 2j), lambda ctx, g: jnp.real(g), name="rot")
    assert jaxfn.gradcheck(good, jnp.ones(3))
    assert not jaxfn.gradcheck(bad, jnp.ones(3), raise_exception=False)


def _with_ranks_forward(ctx, x):
    scaled = x * 5  # a float output declared to carry no gradient (finite differences would see one)
    ctx.mark_non_differentiable(scaled)
    return x * 2, scaled


def test_outputs_marked_non_differentiable_are_left_out():
    f = jaxfn.autograd_function(_with_ranks_forward, lambda ctx, g, g_ranks: g * 2, name="with_ranks")
    assert jaxfn.gradcheck(f, jnp.asarray([0.3, 0.1, 0.2]))

    class WithRanks(jaxfn.Function):
        forward = staticmethod(_with_ranks_forward)

        @staticmethod
        def backward(ctx, g, g_ranks):
            return g * 3  # wrong

    with pytest.raises(jaxfn.GradcheckError, match="for 'x' disagrees"):
        jaxfn.gradcheck(WithRanks.apply, jnp.asarray([0.3, 0.1, 0.2]))


@pytest.mark.parametrize("inner", [False, True])
def test_inside_enable_x64_contexts(inner):
    jax.config.update("jax_enable_x64", not inner)
    try:
        with jax.enable_x64(inner):
            x = jnp.asarray([0.5, 1.5, -0.7], jnp.float32)
            assert jaxfn.gradcheck(linear, x.reshape(1, 3), jnp.ones((2, 3), jnp.float32))
            assert jax.config.jax_enable_x64 is inner
            assert jnp.ones(1).dtype == (jnp.float64 if inner else jnp.float32)
        assert jax.config.jax_enable_x64 is (not inner)  # the global setting is untouched
    finally:
        jax.config.update("jax_enable_x64", True)


def _half_square_forward(ctx, x):
    ctx.save_for_backward(x)
    return x**2 / 2


@pytest.mark.parametrize(
    "backward, x",
    [
        (lambda ctx, g: g * jnp.nan, jnp.array([1.0, 2.0])),  # a NaN gradient
        (lambda ctx, g: g * ctx.saved_tensors[0] * jnp.array([2.0, 1.0]), jnp.array([1e-3, 1e3])),  # swamped
    ],
    ids=["nan gradient", "small element swamped by a large one"],
)
def test_every_element_is_checked_and_nan_never_passes(backward, x):
    f = jaxfn.autograd_function(_half_square_forward, backward, name="half_square")
    with pytest.raises(jaxfn.GradcheckError, match=r"for 'x' disagrees.*worst at index \(0,\)"):
        jaxfn.gradcheck(f, x)


def test_non_finite_finite_differences_never_pass():
    f = jaxfn.autograd_function(lambda ctx, x: jnp.sqrt(x), lambda ctx, g: g * 123.0, name="sqrt")
    assert not jaxfn.gradcheck(f, jnp.array([0.0, 1.0]), raise_exception=False)


def test_an_output_with_small_values_is_checked_on_its_own():
    def backward(ctx, g_big, g_small):
        return g_big * 1e3 + g_small * 2e-3  # the small output's derivative is wrong (1e-3)

    f = jaxfn.autograd_function(lambda ctx, x: (x * 1e3, x * 1e-3), backward, name="two_scales")
    with pytest.raises(jaxfn.GradcheckError, match=r"for 'x' disagrees.*\(output element 1\)"):
        jaxfn.gradcheck(f, jnp.array([1.0]), atol=1e-7)


def test_python_values_in_the_output_are_left_out():
    f = jaxfn.autograd_function(lambda ctx, x: (x * 2, "label", object()), lambda ctx, g, *_: g * 2, name="tagged")
    assert jaxfn.gradcheck(f, jnp.array([1.0, 2.0]))


def test_an_option_that_is_also_a_parameter_is_refused():
    def forward(ctx, x, rtol=1e-6):
        ctx.save_for_backward(x=x)
        return jnp.sin(x) + rtol

    f = jaxfn.autograd_function(forward, lambda ctx, g: {"x": g * jnp.cos(ctx.saved_variables.x)}, name="f")
    with pytest.raises(jaxfn.GradcheckError, match=r"'rtol' is both an option of gradcheck and a parameter"):
        jaxfn.gradcheck(f, jnp.ones(2), rtol=0.1)
    assert jaxfn.gradcheck(f, jnp.ones(2))  # not given: no ambiguity


def test_many_outputs_from_few_inputs_stay_bounded():
    f = jaxfn.autograd_function(lambda ctx, x: jnp.full(200_000, x), lambda ctx, g: g.sum(), name="spread")
    assert jaxfn.gradcheck(f, 0.5)  # 200,000 outputs: random directions, not a 200,000-row identity


def test_a_backward_wrong_only_when_one_input_is_differentiated_is_caught():
    """Each pattern of needs_input_grad a user's jax.grad can make is checked, not only all-inputs."""

    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    def backward(ctx, g):
        x, y = ctx.saved_tensors
        gx = g * y if ctx.needs_input_grad.y else 3 * g * y  # wrong when x alone is differentiated
        return gx, g * x

    f = jaxfn.autograd_function(forward, backward, name="product")
    x, y = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])
    with pytest.raises(
        jaxfn.GradcheckError,
        match=r"the gradient for 'x' \(differentiated alone, the other inputs held constant\) disagrees",
    ):
        jaxfn.gradcheck(f, x, y)


def test_failures_name_the_function_checked():
    wrong = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g * 3, name="wrong_double")

    class WrongDouble(jaxfn.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 3

    def plain(x):
        return wrong(x)

    for fn, name in ((wrong, "wrong_double"), (WrongDouble.apply, "WrongDouble"), (plain, "plain")):
        with pytest.raises(jaxfn.GradcheckError, match=rf"^jaxfn.gradcheck: '{name}': the gradient for 'x' disagrees"):
            jaxfn.gradcheck(fn, jnp.ones(2))
    with pytest.raises(jaxfn.GradcheckError, match=r"^jaxfn.gradcheck: 'plain': there is nothing to check"):
        jaxfn.gradcheck(plain, 1)


def _bisection(steps, wrong=False):
    """Sparsemax by ``steps`` bisection steps in a Python loop (entmax's ported code): per row, the
    tau with sum(max(x - tau, 0)) = radius; backward is sparsemax's (``wrong``: radius's doubled)."""

    def forward(ctx, x, radius):
        hi = jnp.max(x, axis=-1, keepdims=True)
        lo = hi - radius
        for _ in range(steps):
            tau = (lo + hi) / 2
            above = jnp.sum(jnp.maximum(x - tau, 0), axis=-1, keepdims=True) > radius
            lo, hi = jnp.where(above, tau, lo), jnp.where(above, hi, tau)
        p = jnp.maximum(x - (lo + hi) / 2, 0)
        ctx.save_for_backward(p)
        return p

    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        support = p > 0
        mean = jnp.sum(jnp.where(support, g, 0), -1, keepdims=True) / jnp.sum(support, -1, keepdims=True)
        return jnp.where(support, g - mean, 0), jnp.sum(mean) * (2 if wrong else 1)

    return jaxfn.autograd_function(forward, backward, name="bisection")


def test_compilations_do_not_grow_with_an_unrolled_loop():
    """The perturbed evaluations run as batches, op by op: each operation compiles once per shape,
    so a 50-step Python loop compiles no more than a 2-step one (compiling the whole unrolled
    function took seconds, once per input and pattern). Lowerings are counted, not compilations:
    JAX lowers before it looks in its persistent compilation cache (tests/conftest.py)."""
    lowered = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            lowered.append(kwargs.get("fun_name"))

    x = jax.random.normal(K[0], (3, 6))
    jaxfn.gradcheck(_bisection(2), x, 1.0, raise_exception=False)  # each operation's shapes seen (2 steps: inexact)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        assert jaxfn.gradcheck(_bisection(50), x, 1.0)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert len(lowered) <= 4, lowered
    with pytest.raises(jaxfn.GradcheckError, match=r"for 'radius' disagrees.*worst at index \(\)"):
        jaxfn.gradcheck(_bisection(50, wrong=True), x, 1.0)


class _Unbatchable(jaxfn.Function):
    """2 * x with a vmap rule that refuses: gradcheck evaluates it one element at a time."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2

    @staticmethod
    def vmap(info, in_dims, x):
        raise NotImplementedError("no batching here")


def test_a_function_whose_batching_fails_is_checked_one_element_at_a_time():
    with pytest.raises(
        jaxfn.GradcheckError, match=r"the output under jax.vmap raised NotImplementedError \(no batching"
    ):
        jaxfn.gradcheck(_Unbatchable.apply, X)  # the vmap rule raising is a failure of that rule
    report = jaxfn.gradcheck(_Unbatchable.apply, X, check_batched_grad=False)
    assert report and "not run: batching: turned off (check_batched_grad=False)" in str(report)

    class Wrong(_Unbatchable):
        @staticmethod
        def backward(ctx, g):
            return g * 2 * jnp.arange(1.0, 4.0)  # right in column 0 only

    with pytest.raises(jaxfn.GradcheckError, match=r"for 'x' disagrees.*worst at index \(\d, 2\).*10 of 15 elements"):
        jaxfn.gradcheck(Wrong.apply, X, check_batched_grad=False)


def test_a_wrong_vmap_rule_is_not_blamed_on_backward():
    """Finite differences run forward without its rules: a right backward passes beside a wrong
    vmap rule, which the batching check (on by default for a function with one) names."""

    class WrongRule(_Unbatchable):
        @staticmethod
        def vmap(info, in_dims, x):
            return jnp.moveaxis(x, in_dims[0], 0) * 3, 0

    assert jaxfn.gradcheck(WrongRule.apply, X, check_batched_grad=False)
    with pytest.raises(jaxfn.GradcheckError, match="the output for output 0 under jax.vmap disagrees"):
        jaxfn.gradcheck(WrongRule.apply, X)


def _sin_with_rules(forward_scale=1.0, jvp_scale=1.0, vmap_scale=1.0):
    """sin(x) with a backward, a jvp and a vmap rule; ``forward_scale`` makes forward wrong (its
    rules stay those of sin, so they agree with each other), the others make one rule wrong."""

    class Sin(jaxfn.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            ctx.save_for_forward(x)
            return jnp.sin(x) * forward_scale

        @staticmethod
        def backward(ctx, g):
            return g * jnp.cos(ctx.saved_tensors[0])

        @staticmethod
        def jvp(ctx, t):
            return t * jnp.cos(ctx.saved_tensors[0]) * jvp_scale

        @staticmethod
        def vmap(info, in_dims, x):
            return jnp.sin(jnp.moveaxis(x, in_dims[0], 0)) * vmap_scale, 0

    return Sin


def test_one_call_checks_every_rule_and_says_which():
    report = jaxfn.gradcheck(_sin_with_rules(), X)
    assert report and report.not_run == ["order 2: not asked for (order=2 checks the derivative of backward)"]
    assert report.ran == [
        "backward against finite differences of forward",
        "the jvp rule against finite differences of forward, element by element",
        "the vmap rule against a loop of forward (the value of every array output, integer and non-differentiable "
        "ones included), and backward under jax.vmap: every argument batched on axis 0 (in a batch of 1 too) and "
        "on the last axis",
    ]
    assert str(report).startswith("jaxfn.gradcheck 'Sin': passes (3 checks)")


def test_a_wrong_forward_is_caught_though_backward_and_the_vmap_rule_agree():
    """Finite differences run forward itself, not its vmap rule: before, they went through jax.vmap,
    which ran the rule, and a wrong forward whose rules agreed with each other passed."""
    wrong = _sin_with_rules(forward_scale=2.0, vmap_scale=2.0)  # forward 2 sin x; backward says cos x
    with pytest.raises(jaxfn.GradcheckError, match=r"'Sin': the gradient for 'x' disagrees with finite differences"):
        jaxfn.gradcheck(wrong.apply, X)
    plain = jax.vmap(jax.grad(lambda x: 2 * jnp.sin(x).sum()))(X)  # the true derivative: 2 cos x
    np.testing.assert_allclose(plain, 2 * np.cos(X))


def test_a_wrong_jvp_rule_is_caught_by_default():
    with pytest.raises(jaxfn.GradcheckError, match=r"'Sin': the gradient in forward mode \(jvp\) for 'x' disagrees"):
        jaxfn.gradcheck(_sin_with_rules(jvp_scale=1.5), X)
    report = jaxfn.gradcheck(_sin_with_rules(jvp_scale=1.5), X, raise_exception=False)
    assert not report and "in forward mode (jvp)" in report.failure


def test_a_wrong_vmap_rule_is_caught_by_default():
    with pytest.raises(jaxfn.GradcheckError, match=r"the output for output 0 under jax.vmap disagrees with the same"):
        jaxfn.gradcheck(_sin_with_rules(vmap_scale=1.5), X)


def test_a_raising_jvp_rule_is_a_failure_not_a_skipped_check():
    class Raising(_sin_with_rules()):
        @staticmethod
        def jvp(ctx, t):
            raise RuntimeError("jvp broke")

    with pytest.raises(jaxfn.GradcheckError, match=r"forward mode \(jax.jvp\) for 'x' raised RuntimeError \(jvp broke"):
        jaxfn.gradcheck(Raising, X)


def test_the_finite_difference_program_is_compiled_once_per_call_structure():
    compiled = []

    def listener(event, duration, **kwargs):  # lowerings of gradcheck's finite-difference program
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration" and "perturbed" in str(kwargs.get("fun_name")):
            compiled.append(kwargs.get("fun_name"))

    f, x = _bisection(50), jax.random.normal(K[1], (3, 6))
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        assert jaxfn.gradcheck(f, x, 1.0)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert len(compiled) == 1, compiled
    compiled.clear()
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        assert jaxfn.gradcheck(f, x + 0.01, 2.0)  # new values, same structure: nothing compiled
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiled == []


def test_saved_passes_python_numbers_as_they_are():
    import numbers

    def forward(ctx, scale, z):
        assert isinstance(scale, numbers.Number)  # what a real call gives it
        ctx.save_for_backward(z=z)
        return jnp.sin(z) * scale

    f = jaxfn.autograd_function(forward, lambda ctx, g: (None, g * jnp.cos(ctx.saved_variables.z)), name="f")
    report = jaxfn.saved(lambda s, z: f(s, z).sum(), 2.5, jnp.ones(3))
    from jaxfn import _saves

    if _saves.available():  # not on jax 0.10 with jax_remat3 on: JAX's checkpoint_name fails under vmap there
        assert [(r.function, r.save, r.kind) for r in report] == [("f", "z", "input")]
    else:
        assert [r.kind for r in report] == ["input"]


class _Scaled(jaxfn.Function):
    """x * sum(y) with a backward, a jvp and a vmap rule, all right; subclasses make one wrong."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        ctx.save_for_forward(x, y)
        return x * jnp.sum(y)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * jnp.sum(y), jnp.full_like(y, jnp.sum(g * x))

    @staticmethod
    def jvp(ctx, tx, ty):
        x, y = ctx.saved_tensors
        return tx * jnp.sum(y) + x * jnp.sum(ty)

    @staticmethod
    def vmap(info, in_dims, x, y):
        (dx, dy) = in_dims
        x = x if dx is None else jnp.moveaxis(x, dx, 0)
        total = jnp.sum(y) if dy is None else jnp.sum(jnp.moveaxis(y, dy, 0), -1, keepdims=True)
        return x * total, 0


_XY = (jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5, -1.0, 2.0]))


def test_every_rule_of_a_right_function_passes_and_each_new_check_is_listed():
    report = jaxfn.gradcheck(_Scaled, *_XY)
    assert report, report
    assert report.ran == [
        "backward against finite differences of forward, with 3 sets of inputs differentiated (the others held "
        "constant): every non-empty set of the 2 arguments",
        "the jvp rule against finite differences of forward, element by element, with 3 sets of inputs perturbed "
        "(the others not: no tangent, needs_input_grad False): every non-empty set of the 2 arguments",
        "the vmap rule against a loop of forward (the value of every array output, integer and non-differentiable "
        "ones included), and backward under jax.vmap: every argument batched on axis 0 (in a batch of 1 too), "
        "each argument alone (the others unbatched), on the last axis and mixed axes (each argument on its last "
        "axis, the others on axis 0)",
    ]


def test_a_vmap_rule_wrong_for_an_unbatched_argument_is_caught():
    """Every argument batched on axis 0 is one way a vmap rule is called among several: one wrong
    only where an argument is unbatched (in_dims None) fails, naming how it was batched."""

    class WrongUnbatched(_Scaled):
        @staticmethod
        def vmap(info, in_dims, x, y):
            (dx, dy) = in_dims
            x = x if dx is None else jnp.moveaxis(x, dx, 0)
            total = 2 * jnp.sum(y) if dy is None else jnp.sum(jnp.moveaxis(y, dy, 0), -1, keepdims=True)
            return x * total, 0

    with pytest.raises(
        jaxfn.GradcheckError,
        match=r"the output for output 0 under jax.vmap disagrees .*, with only 'x' batched \(in_dims None for the",
    ):
        jaxfn.gradcheck(WrongUnbatched, *_XY)

    class Crashing(_Scaled):  # assumes y batched on axis 0
        @staticmethod
        def vmap(info, in_dims, x, y):
            return x * jnp.sum(y[:, :], -1, keepdims=True), 0

    with pytest.raises(jaxfn.GradcheckError, match=r"under jax.vmap raised .* with only 'x' batched"):
        jaxfn.gradcheck(Crashing, *_XY)


def test_a_vmap_rule_wrong_for_a_batch_axis_other_than_0_is_caught():
    class Scale(jaxfn.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return g * 2.0

        @staticmethod
        def vmap(info, in_dims, x):
            (d,) = in_dims
            out = x * 2.0
            return (out if d == 0 else jnp.flip(out, axis=-1)), d  # wrong unless the batch is on axis 0

    with pytest.raises(
        jaxfn.GradcheckError, match=r"under jax.vmap disagrees .*, with every argument batched on its last"
    ):
        jaxfn.gradcheck(Scale, X)


def test_a_jvp_rule_wrong_only_with_several_tangents_is_caught():
    """One tangent at a time sets the others to zero: a rule with a product of tangents is right
    there; every tangent at once (random directions) against finite differences catches it."""

    class CrossTerm(_Scaled):
        @staticmethod
        def jvp(ctx, tx, ty):
            x, y = ctx.saved_tensors
            return tx * jnp.sum(y) + x * jnp.sum(ty) + tx * jnp.sum(ty)

    with pytest.raises(jaxfn.GradcheckError, match=r"forward mode \(jvp\) with every input's tangent set at once"):
        jaxfn.gradcheck(CrossTerm, *_XY)


def _product_of_three(wrong_for):
    """x * y * z whose backward is wrong only when exactly the arguments ``wrong_for`` are differentiated."""

    def forward(ctx, x, y, z):
        ctx.save_for_backward(x, y, z)
        return x * y * z

    def backward(ctx, g):
        x, y, z = ctx.saved_tensors
        wrong = tuple(ctx.needs_input_grad) == wrong_for
        return (3 if wrong else 1) * g * y * z, g * x * z, g * x * y

    return jaxfn.autograd_function(forward, backward, name="product3")


def test_a_backward_wrong_for_one_set_of_differentiated_arguments_is_caught():
    x, y, z = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0]), jnp.array([5.0, 6.0])
    for wrong_for, named in (((True, True, False), "'x' and 'y'"), ((True, False, True), "'x' and 'z'")):
        with pytest.raises(
            jaxfn.GradcheckError, match=rf"the gradient for 'x' \(with {named} differentiated, the other"
        ):
            jaxfn.gradcheck(_product_of_three(wrong_for), x, y, z)
    right = jaxfn.gradcheck(_product_of_three(None), x, y, z)
    assert right.ran == [
        "backward against finite differences of forward, with 7 sets of inputs differentiated (the others held "
        "constant): every non-empty set of the 3 arguments",
    ]


def test_with_many_arguments_the_sets_not_checked_are_listed():
    def forward(ctx, *a):
        return sum(a[1:], a[0])

    def backward(ctx, g):
        n = ctx.needs_input_grad
        return (3 * g if (n[0] and n[1] and not n[2] and not n[3]) else g,) + (g,) * 6  # a set not checked

    f = jaxfn.autograd_function(forward, backward, name="sum7")
    report = jaxfn.gradcheck(f, *(jnp.full(2, float(i)) for i in range(7)))
    assert report.ran[0].endswith("all 7 arguments, each alone and each all but one")
    assert report.not_run[0] == (
        "backward with the other 112 of the 127 sets of the 7 arguments differentiated (needs_input_grad patterns): "
        "all, each alone and each all but one were checked (every set is checked up to 5 arguments)"
    )


def test_a_kept_program_is_traced_again_when_forward_reads_a_changed_global():
    """The finite-difference program is kept per call structure; what forward read when it was
    traced (a global's value) is checked against forward as called, at x and a nearby point."""

    class Config:
        scale = 2.0
        power = 2.0

    config = Config()
    scaled = jaxfn.autograd_function(lambda ctx, x: x * config.scale, lambda ctx, g: g * 2.0, name="scaled")
    x = jnp.array([1.0, 2.0, 3.0])
    assert jaxfn.gradcheck(scaled, x)
    config.scale = 3.0  # forward now computes 3x; backward still says 2
    with pytest.raises(jaxfn.GradcheckError, match=r"'scaled': the gradient for 'x' disagrees"):
        jaxfn.gradcheck(scaled, x)

    def power_backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2.0 * x

    def power_forward(ctx, x):
        ctx.save_for_backward(x)
        return x**config.power

    power = jaxfn.autograd_function(power_forward, power_backward, name="power")
    ones = jnp.ones(3)  # forward's value at x is 1 whatever the power
    assert jaxfn.gradcheck(power, ones)
    config.power = 3.0
    with pytest.raises(jaxfn.GradcheckError, match=r"'power': the gradient for 'x' disagrees"):
        jaxfn.gradcheck(power, ones)
    config.power = 2.0
    assert jaxfn.gradcheck(power, ones)


def test_a_backward_wrong_when_an_output_gets_no_cotangent_is_caught():
    """A loss using one output gives the others no cotangent (None under
    set_materialize_grads(False)): each output alone is checked."""

    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * 2.0, x**2

    def backward(ctx, g0, g1, wrong=True):
        (x,) = ctx.saved_tensors
        if g1 is None:
            return g0 * (3.0 if wrong else 2.0)
        if g0 is None:
            return g1 * 2 * x
        return g0 * 2.0 + g1 * 2 * x

    x = jnp.array([1.0, 2.0, 3.0])
    with pytest.raises(
        jaxfn.GradcheckError, match=r"the gradient for 'x' \(output 0 alone given a cotangent, the others none\)"
    ):
        jaxfn.gradcheck(jaxfn.autograd_function(forward, backward, name="two"), x)
    right = jaxfn.autograd_function(forward, lambda ctx, g0, g1: backward(ctx, g0, g1, wrong=False), name="two")
    report = jaxfn.gradcheck(right, x)
    assert report.ran == [
        "backward against finite differences of forward",
        "backward with each of the 2 outputs alone given a cotangent (the others none: None under "
        "ctx.set_materialize_grads(False)) against finite differences of forward",
    ]


def test_with_three_outputs_the_sets_of_outputs_not_given_cotangents_are_listed_as_not_run():
    """Every output and each alone are given cotangents; a backward wrong only where two of three
    get one passes, so the report says those sets were not run (never a yes about them)."""

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2.0, x * 3.0, x * 4.0

    def backward(ctx, g0, g1, g2):
        return g0 * 2.0 + g1 * 3.0 + g2 * 4.0

    report = jaxfn.gradcheck(jaxfn.autograd_function(forward, backward, name="three"), jnp.array([1.0, 2.0]))
    assert report, str(report)
    assert (
        "backward with the other 3 sets of the 3 outputs given cotangents (2 of them, the others none): every "
        "output and each alone were checked"
    ) in report.not_run, str(report)


def test_the_reports_printed_on_the_gradcheck_page_are_what_gradcheck_prints():
    """docs/gradcheck.md shows reports after "prints": each is what its Python block prints (the
    docs test runs the blocks but does not compare their output)."""
    import contextlib
    import io
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "gradcheck.md").read_text()
    blocks = re.findall(r"```(\w*)\n(.*?)```", page, re.S)
    namespace: dict = {"__name__": "docs_page"}
    compared = 0
    for (language, code), following in zip(blocks, [*blocks[1:], ("", "")]):
        if language != "python":
            continue
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "docs/gradcheck.md", "exec"), namespace)
        if printed.getvalue():
            assert following[0] == "", code
            assert printed.getvalue().split() == following[1].split(), printed.getvalue()
            compared += 1
    assert compared == 3


def _with_vmap(forward, backward, vmap, name):
    return jaxfn.autograd_function(forward, backward, vmap=vmap, name=name)


def _moved(x, d, size=None):
    """``x`` with its batch axis ``d`` first (broadcast to ``size`` examples where unbatched)."""
    return jnp.broadcast_to(x, (size, *jnp.shape(x))) if d is None else jnp.moveaxis(x, d, 0)


def test_a_vmap_rule_that_mixes_the_examples_is_caught():
    """The batch's examples are O(1) apart (they were x + 1e-3 * noise, within the tolerance): a rule
    that centres over the batch axis too, or gives every example the first one's value, fails."""

    def center_forward(ctx, x):
        return x - jnp.mean(x)

    def center_backward(ctx, g):
        return g - jnp.mean(g)

    over_the_batch = _with_vmap(
        center_forward, center_backward, lambda info, d, x: (_moved(x, d[0]) - jnp.mean(x), 0), "center"
    )
    right = _with_vmap(
        center_forward,
        center_backward,
        lambda info, d, x: (_moved(x, d[0]) - jnp.mean(_moved(x, d[0]), axis=-1, keepdims=True), 0),
        "center",
    )
    first_only = _with_vmap(
        lambda ctx, x: 10.0 * x,
        lambda ctx, g: 10.0 * g,
        lambda info, d, x: (jnp.broadcast_to(10.0 * _moved(x, d[0])[0], _moved(x, d[0]).shape), 0),
        "scale",
    )
    for x in (jnp.array([1.0, 5.0, -3.0, 2.0]), jnp.array([10.0, 50.0, -30.0, 20.0]), jnp.array([1e-4, 2e-4, 3e-4])):
        with pytest.raises(jaxfn.GradcheckError, match=r"'center': the output for output 0 under jax.vmap disagrees"):
            jaxfn.gradcheck(over_the_batch, x)
        with pytest.raises(jaxfn.GradcheckError, match=r"'scale': the output for output 0 under jax.vmap disagrees"):
            jaxfn.gradcheck(first_only, x)
        assert jaxfn.gradcheck(right, x)


def _take(vmap):
    def forward(ctx, x, idx):
        ctx.save_for_backward(idx)
        ctx.n = x.shape[-1]
        return x[idx]

    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        return jnp.zeros(ctx.n, g.dtype).at[idx].add(g), None

    return _with_vmap(forward, backward, vmap, "take")


def test_a_vmap_rule_using_one_examples_indices_for_all_is_caught():
    """An integer argument is batched with its own values rearranged (it was stacked unchanged),
    so a rule that takes example 0's indices for every example fails; a right one passes."""

    def first_indices(info, in_dims, x, idx):
        x, i = _moved(x, in_dims[0], info.batch_size), idx if in_dims[1] is None else _moved(idx, in_dims[1])[0]
        return x[:, i], 0

    def right(info, in_dims, x, idx):
        x = _moved(x, in_dims[0], info.batch_size)
        i = _moved(idx, in_dims[1], info.batch_size)
        return jnp.take_along_axis(x, i, axis=1), 0

    x, idx = jnp.array([1.0, 2.0, 3.0, 4.0]), jnp.array([0, 2])
    with pytest.raises(jaxfn.GradcheckError, match=r"'take': the output for output 0 under jax.vmap disagrees"):
        jaxfn.gradcheck(_take(first_indices), x, idx)
    report = jaxfn.gradcheck(_take(right), x, idx)
    assert report and "each argument alone (the others unbatched)" in report.ran[-1]
    mask = jnp.array([True, False, False, True])  # a boolean argument too
    masked = _with_vmap(
        lambda ctx, x, m: (ctx.save_for_backward(m), jnp.where(m, x, 0.0))[1],
        lambda ctx, g: (jnp.where(ctx.saved_tensors[0], g, 0.0), None),
        lambda info, d, x, m: (
            jnp.where(_moved(m, d[1], info.batch_size)[0], _moved(x, d[0], info.batch_size), 0.0),
            0,
        ),
        "masked",
    )
    with pytest.raises(jaxfn.GradcheckError, match=r"'masked': the output for output 0 under jax.vmap disagrees"):
        jaxfn.gradcheck(masked, x, mask)


def test_integer_and_non_differentiable_outputs_are_compared_under_vmap():
    """Every array output's value is compared under the vmap rule (the filter for gradients left
    integer and non-differentiable outputs out of it); the report says so."""

    def forward(ctx, x):
        ctx.save_for_backward(x)
        fraction = jnp.mean(x > 0).astype(x.dtype)
        ctx.mark_non_differentiable(fraction)
        return jnp.maximum(x, 0.0), jnp.sum(x > 0), fraction

    def backward(ctx, g, gc, gf):
        return g * (ctx.saved_tensors[0] > 0)

    def rule(count_over_batch, fraction_scale):
        def vmap(info, in_dims, x):
            x = _moved(x, in_dims[0])
            count = jnp.sum(x > 0) if count_over_batch else jnp.sum(x > 0, axis=1)
            fraction = fraction_scale * jnp.mean(x > 0, axis=1).astype(x.dtype)
            return (jnp.maximum(x, 0.0), count, fraction), (0, None if count_over_batch else 0, 0)

        return _with_vmap(forward, backward, vmap, "relu_count")

    x = jnp.array([1.0, -5.0, 2.0])
    with pytest.raises(
        jaxfn.GradcheckError, match=r"the output for output 1 under jax.vmap disagrees.*where they must be equal"
    ):
        jaxfn.gradcheck(rule(True, 1.0), x)
    with pytest.raises(jaxfn.GradcheckError, match=r"the output for output 2 under jax.vmap disagrees"):
        jaxfn.gradcheck(rule(False, 2.0), x)
    report = jaxfn.gradcheck(rule(False, 1.0), x)
    assert report and "(the value of every array output, integer and non-differentiable ones included)" in str(report)


def test_a_jvp_rule_wrong_when_an_input_is_not_perturbed_is_caught():
    """Each argument's tangent alone is checked with the others not perturbed (jax.jvp of a function
    of that argument alone): a tangent None under set_materialize_grads(False), needs_input_grad
    False. Zero tangents for the others (as before) never reached those branches."""

    def wrong_when_none(ctx, tx, ty):
        x, y = ctx.saved_tensors
        if ty is None:
            return 2 * tx * y
        return ty * x if tx is None else tx * y + ty * x

    def wrong_when_not_needed(ctx, tx, ty):
        x, y = ctx.saved_tensors
        return 3 * tx * y if not ctx.needs[1] else tx * y + ty * x

    def right(ctx, tx, ty):
        x, y = ctx.saved_tensors
        return (0 if tx is None else tx * y) + (0 if ty is None else ty * x)

    x, y = jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5, -1.0, 2.0])
    for jvp in (wrong_when_none, wrong_when_not_needed):
        with pytest.raises(jaxfn.GradcheckError, match=r"'mul': the gradient in forward mode \(jvp\) for 'x'"):
            jaxfn.gradcheck(make_mul_with_jvp(jvp, materialize=False), x, y)
    assert jaxfn.gradcheck(make_mul_with_jvp(right, materialize=False), x, y)


def test_a_jvp_rule_wrong_at_one_element_of_many_is_caught():
    """The jvp's output is compared element by element with finite differences along the same
    direction (it was one random combination, with a tolerance scaled by the whole sum)."""

    def sine(jvp_factor):
        class S(jaxfn.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                ctx.save_for_forward(x)
                return jnp.sin(x)

            @staticmethod
            def backward(ctx, g):
                return g * jnp.cos(ctx.saved_tensors[0])

            @staticmethod
            def jvp(ctx, t):
                return (t * jnp.cos(ctx.saved_tensors[0])).at[0].multiply(jvp_factor)

        return S

    x = jnp.linspace(-1.0, 1.0, 1000)
    with pytest.raises(jaxfn.GradcheckError, match=r"'S': the gradient in forward mode \(jvp\) for 'x'.*index \(0,\)"):
        jaxfn.gradcheck(sine(1.02), x)
    assert jaxfn.gradcheck(sine(1.0), x)

    def two_outputs(ctx, tx, ty):  # right alone; at once, its second output is off at one element
        x, y = ctx.saved_tensors
        both = tx is not None and ty is not None
        out = (0 if tx is None else tx * y) + (0 if ty is None else ty * x)
        return out, (out * 2).at[3].multiply(1.05 if both else 1.0)

    def forward(ctx, x, y):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, y)
        ctx.save_for_forward(x, y)
        return x * y, 2 * x * y

    def backward(ctx, g, h):
        x, y = ctx.saved_tensors
        total = (0 if g is None else g) + (0 if h is None else 2 * h)
        return total * y, total * x

    f = jaxfn.autograd_function(forward, backward, jvp=two_outputs, name="pair")
    big = jnp.linspace(1.0, 2.0, 400)
    with pytest.raises(
        jaxfn.GradcheckError,
        match=r"forward mode \(jvp\) with every input's tangent set at once .* worst at output 1, index \(3,\)",
    ):
        jaxfn.gradcheck(f, big, big[::-1])


def test_a_pytree_argument_is_batched_as_a_whole_with_the_others_unbatched():
    """Each argument alone batches all the leaves of a pytree argument (an ensemble of parameters
    over one input); each leaf alone, as before, too; the report says both."""

    def forward(ctx, x, p):
        ctx.save_for_backward(x, p["w"])
        return x * p["w"] + p["b"]

    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, {"w": g * x, "b": g}

    def rule(wrong):
        def vmap(info, in_dims, x, p):
            dx, dp = in_dims
            size = info.batch_size
            x, w, b = _moved(x, dx, size), _moved(p["w"], dp["w"], size), _moved(p["b"], dp["b"], size)
            ensemble = dx is None and dp["w"] is not None and dp["b"] is not None
            return x * w + (b[:, ::-1] if wrong and ensemble else b), 0

        return _with_vmap(forward, backward, vmap, "affine")

    x = jnp.array([1.0, 2.0, 3.0, 4.0])
    p = {"w": jnp.array([0.5, -1.0, 2.0, 1.0]), "b": jnp.array([0.1, 0.2, 0.3, 0.4])}
    with pytest.raises(
        jaxfn.GradcheckError, match=r"under jax.vmap disagrees .*, with only 'p' batched \(in_dims None for the"
    ):
        jaxfn.gradcheck(rule(True), x, p)
    report = jaxfn.gradcheck(rule(False), x, p)
    assert report.ran[-1].endswith(
        "every argument batched on axis 0 (in a batch of 1 too), each argument alone (the others unbatched), each "
        "leaf of a pytree argument alone, on the last axis and mixed axes (each argument on its last axis, the "
        "others on axis 0)"
    )


def test_a_vmap_rule_wrong_for_a_batch_of_one_is_caught():
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x / jnp.linalg.norm(x)

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        n = jnp.linalg.norm(x)
        y = x / n
        return (g - y * jnp.sum(g * y)) / n

    def rule(squeeze):
        def vmap(info, in_dims, x):
            x = _moved(x, in_dims[0])
            x = x.squeeze() if squeeze else x[..., 0]  # squeeze drops the batch axis of a batch of one
            return (x / jnp.linalg.norm(x, axis=-1, keepdims=True))[..., None], 0

        return _with_vmap(forward, backward, vmap, "unit")

    x = jnp.array([[1.0], [2.0], [2.0]])
    with pytest.raises(jaxfn.GradcheckError, match=r"'unit': the output under jax.vmap raised .* a batch of 1"):
        jaxfn.gradcheck(rule(True), x)
    assert jaxfn.gradcheck(rule(False), x)


def test_a_python_number_is_passed_to_the_vmap_rule_as_given_never_batched():
    """A Python float is a static value under jax.vmap in a real call: the vmap rule gets it as it
    is (it was batched as an array, so a rule treating it as a number failed), and the report says so."""
    seen = []

    def forward(ctx, x, p):
        ctx.save_for_backward(x)
        ctx.p = p
        return x * p

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ctx.p, jnp.sum(g * x)

    def vmap(info, in_dims, x, p):
        seen.append((type(p), in_dims[1]))
        return _moved(x, in_dims[0]) * p, 0

    f = _with_vmap(forward, backward, vmap, "scale")
    x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    report = jaxfn.gradcheck(f, x, 2.5)
    assert report, report
    assert "'p' never batched (a Python number: passed as given" in report.ran[-1]
    assert (float, None) in seen and all(d is None for _, d in seen)
    only_numbers = jaxfn.gradcheck(f, 2.0, 2.5, check_batched_grad=True)
    assert only_numbers and any("no argument is an array to batch" in line for line in only_numbers.not_run)


def test_a_right_function_with_every_kind_of_argument_and_output_passes():
    """Integer and pytree arguments, a Python number, an integer output and every rule, all right."""

    def forward(ctx, x, p, idx, scale):
        ctx.save_for_backward(x, p["w"], idx)
        ctx.save_for_forward(x, p["w"], idx)
        ctx.scale = scale
        return (x * p["w"])[idx] * scale + p["b"], jnp.sum(idx)

    def backward(ctx, g, gc):
        x, w, idx = ctx.saved_tensors
        spread = jnp.zeros_like(x).at[idx].add(g * ctx.scale)
        return spread * w, {"w": spread * x, "b": jnp.sum(g)}, None, jnp.sum(g * (x * w)[idx])

    def jvp(ctx, tx, tp, tidx, tscale):
        x, w, idx = ctx.saved_tensors
        out = jnp.zeros(idx.shape)
        if tx is not None:
            out = out + (tx * w)[idx] * ctx.scale
        if tp is not None:
            out = out + (tp["w"] * x)[idx] * ctx.scale + tp["b"]
        if tscale is not None:
            out = out + (x * w)[idx] * tscale
        return out, None

    def vmap(info, in_dims, x, p, idx, scale):
        size = info.batch_size
        x, w, b = (
            _moved(x, in_dims[0], size),
            _moved(p["w"], in_dims[1]["w"], size),
            _moved(p["b"], in_dims[1]["b"], size),
        )
        i = _moved(idx, in_dims[2], size)
        out = jnp.take_along_axis(x * w, i, axis=1) * scale + b[:, None]
        return (out, jnp.sum(i, axis=1)), (0, 0)

    f = jaxfn.autograd_function(forward, backward, jvp=jvp, vmap=vmap, name="gather")
    report = jaxfn.gradcheck(
        f,
        jnp.array([1.0, -2.0, 3.0, 0.5]),
        {"w": jnp.array([0.5, 1.5, -1.0, 2.0]), "b": jnp.array(0.3)},
        jnp.array([3, 0, 2]),
        1.5,
    )
    assert report, report


def _sin_times(wrong_second_order):
    """sin(x) * y whose backward, where ``y`` is not differentiated, holds x constant
    (``stop_gradient``): right values, but a wrong derivative of backward (order 2) in that case."""

    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return jnp.sin(x) * y

    def backward(ctx, g):
        x, y = ctx.saved_tensors
        if ctx.needs_input_grad[1]:
            return g * jnp.cos(x) * y, g * jnp.sin(x)
        return g * jnp.cos(jax.lax.stop_gradient(x) if wrong_second_order else x) * y, None

    return jaxfn.autograd_function(forward, backward, name="sin_times")


def test_order_2_checks_every_set_of_differentiated_arguments():
    """The derivative of backward is checked with each set of arguments differentiated, as
    backward is: one wrong only where y is not differentiated fails (it passed, checked with every
    argument differentiated only), and the report lists the sets."""
    x, y = jnp.array([0.3, 1.1]), jnp.array([2.0, -1.5])
    wrong = jaxfn.gradcheck(_sin_times(True), x, y, order=2, raise_exception=False)
    assert not wrong
    assert wrong.failure.startswith(
        "jaxfn.gradcheck: 'sin_times': the gradient of the backward (order=2) for 'x' (differentiated alone, the "
        "other inputs held constant) disagrees with finite differences"
    ), wrong.failure
    plain = jax.grad(lambda x: jax.grad(lambda x: _sin_times(True)(x, y).sum())(x).sum())(x)
    np.testing.assert_allclose(plain, [0.0, 0.0])  # what the planted rule gives, where -sin(x) y is right
    right = jaxfn.gradcheck(_sin_times(False), x, y, order=2)
    assert right.ran[-1] == (
        "order 2: the derivative of backward against finite differences of backward, with 3 sets of inputs "
        "differentiated (the others held constant): every non-empty set of the 2 arguments"
    )


def test_order_2_checks_each_output_alone_given_a_cotangent():
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return jnp.sin(x), x**2

    def backward(ctx, g0, g1, wrong=True):
        (x,) = ctx.saved_tensors
        if g1 is None:  # right values; held constant (wrong second derivative) only here
            return g0 * jnp.cos(jax.lax.stop_gradient(x) if wrong else x)
        return (0 if g0 is None else g0 * jnp.cos(x)) + g1 * 2 * x

    x = jnp.array([0.3, 1.1, -0.7])
    with pytest.raises(
        jaxfn.GradcheckError,
        match=r"gradient of the backward \(order=2\) for 'x' \(output 0 alone given a cotangent, the others none\)",
    ):
        jaxfn.gradcheck(jaxfn.autograd_function(forward, backward, name="two"), x, order=2)
    right = jaxfn.autograd_function(forward, lambda ctx, g0, g1: backward(ctx, g0, g1, wrong=False), name="two")
    report = jaxfn.gradcheck(right, x, order=2)
    assert report.ran[-1] == (
        "order 2: the derivative of backward against finite differences of backward, and with each of the 2 "
        "outputs alone given a cotangent"
    )


def _product(n, wrong_in_dims=None):
    """The product of ``n`` arrays, with a vmap rule; ``wrong_in_dims``: the rule adds 1 where it
    gets exactly these in_dims (batched or not, per argument)."""

    def forward(ctx, *a):
        ctx.save_for_backward(*a)
        return functools.reduce(jnp.multiply, a)

    def backward(ctx, g):
        a = ctx.saved_tensors
        return tuple(g * functools.reduce(jnp.multiply, [v for j, v in enumerate(a) if j != i], 1.0) for i in range(n))

    def vmap(info, in_dims, *a):
        out = functools.reduce(jnp.multiply, [_moved(v, d, info.batch_size) for v, d in zip(a, in_dims)])
        return out + (1.0 if tuple(d is not None for d in in_dims) == wrong_in_dims else 0.0), 0

    return _with_vmap(forward, backward, vmap, f"product{n}")


def test_a_vmap_rule_wrong_for_a_set_of_batched_arguments_is_caught():
    """With 3 arguments, (None, 0, 0) is neither all nor one argument batched: every set is."""
    args = [jnp.array([0.3, 1.1]), jnp.array([2.0, -1.5]), jnp.array([0.5, 0.25])]
    with pytest.raises(
        jaxfn.GradcheckError,
        match=r"output 0 under jax.vmap disagrees .*, with only 'args\[1\]' and 'args\[2\]' batched \(in_dims None",
    ):
        jaxfn.gradcheck(_product(3, (False, True, True)), *args)
    report = jaxfn.gradcheck(_product(3), *args)
    assert report.ran[-1].endswith(
        "each argument alone (the others unbatched), every set of 2 of the 3 arguments (the others unbatched), on "
        "the last axis and mixed axes (each argument on its last axis, the others on axis 0)"
    )


def test_with_many_arguments_the_batchings_and_second_derivatives_not_checked_are_listed():
    report = jaxfn.gradcheck(_product(6), *(jnp.array([1.0, 0.5]) + 0.1 * i for i in range(6)), order=2)
    assert report, report
    assert "each all but one of the 6 arguments (the others unbatched)" in report.ran[1]
    assert report.not_run[-2:] == [
        "the vmap rule with the other 50 of the 63 sets of the 6 arguments batched (the others unbatched, in_dims "
        "None): all, each alone and each all but one were checked (every set is checked up to 5 arguments)",
        "order 2: the derivative of backward with the other 50 of the 63 sets of the 6 arguments differentiated "
        "(needs_input_grad patterns): all, each alone and each all but one were checked (every set is checked up to "
        "5 arguments)",
    ]


def _mul(wrong):
    """x * y with a vmap rule that, ``wrong``, moves y by x's in_dim (a copy-paste slip): right
    whenever every batched argument has the same axis."""

    class Mul(jaxfn.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y, g * x

        @staticmethod
        def vmap(info, in_dims, x, y):
            dx, dy = in_dims
            first = lambda a, d: a if d is None else jnp.moveaxis(a, d, 0)  # noqa: E731 (unbatched: broadcast)
            return Mul.apply(first(x, dx), first(y, dx if wrong else dy)), 0

    return Mul


def test_a_vmap_rule_wrong_for_mixed_batch_axes_is_caught():
    """Each argument batched on its last axis, the others on axis 0 (it passed: every batched
    argument always had the same axis)."""
    x, y = jnp.array([[0.3, 1.1], [0.2, -0.4]]), jnp.array([[2.0, -1.5], [0.5, 1.0]])
    with pytest.raises(
        jaxfn.GradcheckError,
        match=r"under jax.vmap raised TypeError .* with 'x' batched on its last axis, the others on",
    ):
        jaxfn.gradcheck(_mul(True), x, y)  # y moved by x's axis: the shapes don't match
    report = jaxfn.gradcheck(_mul(False), x, y)
    assert report and report.ran[-1].endswith("and mixed axes (each argument on its last axis, the others on axis 0)")


def _two_outputs(guarded, host=False):
    """sin(x), cos(x) with materialize_grads off; a backward not ``guarded`` multiplies a None
    grad_output (an output given no cotangent)."""
    lib = np if host else jnp

    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return lib.sin(x), lib.cos(x)

    def backward(ctx, ga, gb):
        (x,) = ctx.saved_tensors
        if guarded:
            return (0 if ga is None else ga * lib.cos(x)) - (0 if gb is None else gb * lib.sin(x))
        return ga * lib.cos(x) - gb * lib.sin(x)

    return jaxfn.autograd_function(forward, backward, host=host, name="two_out")


@pytest.mark.parametrize("host", [False, True])
def test_an_exception_backward_raises_in_a_case_is_a_failure_naming_the_case(host):
    x = jnp.array([0.3, 1.1])
    report = jaxfn.gradcheck(_two_outputs(False, host), x, raise_exception=False)
    assert not report
    assert report.failure.startswith(
        "jaxfn.gradcheck: 'two_out': backward raised TypeError (unsupported operand type(s) for *: 'NoneType' and "
    ), report.failure
    assert (
        "with 'x' differentiated and output 0 alone given a cotangent (the others none), where finite differences "
        "of forward give a gradient; check the function's backward: an output given no cotangent gets grad_output "
        "None under ctx.set_materialize_grads(False)"
    ) in report.failure
    assert "fails (0 checks passed, then one failed)" in str(report)
    with pytest.raises(jaxfn.GradcheckError, match=r"'two_out': backward raised TypeError") as info:
        jaxfn.gradcheck(_two_outputs(False, host), x)
    assert isinstance(info.value.__cause__, Exception)  # chained from what backward raised
    if not host:
        assert isinstance(info.value.__cause__, TypeError)
    assert jaxfn.gradcheck(_two_outputs(True, host), x)


def test_an_exception_in_a_case_checked_along_random_directions_is_a_failure():
    x = jnp.linspace(-1.0, 1.0, 3000)  # 3000 inputs x 6000 outputs: past the whole Jacobian's size
    with pytest.raises(
        jaxfn.GradcheckError,
        match=r"'two_out': forward or backward raised TypeError .* with 'x' differentiated and output 0 alone",
    ):
        jaxfn.gradcheck(_two_outputs(False), x)
    assert jaxfn.gradcheck(_two_outputs(True), x)


def _refusing(wrong):
    """sin(x) * y whose forward, ``wrong``, raises where x is differentiated and y is not."""

    def forward(ctx, x, y):
        if wrong and ctx.needs_input_grad[0] and not ctx.needs_input_grad[1]:
            raise KeyError("forward wants y differentiated")
        ctx.save_for_backward(x, y)
        return jnp.sin(x) * y

    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * jnp.cos(x) * y, g * jnp.sin(x)

    return jaxfn.autograd_function(forward, backward, name="f")


def test_an_exception_forward_raises_in_a_case_is_a_failure_naming_the_case():
    x, y = jnp.array([0.3, 1.1]), jnp.array([2.0, -1.5])
    report = jaxfn.gradcheck(_refusing(True), x, y, raise_exception=False)
    assert not report
    assert report.failure == (
        "jaxfn.gradcheck: 'f': forward (run by jax.vjp) raised KeyError ('forward wants y differentiated') with 'x' "
        "differentiated (the other inputs held constant: needs_input_grad False) and its output given a cotangent, "
        "where the call with the arguments given ran; check the function's forward."
    )
    assert jaxfn.gradcheck(_refusing(False), x, y)


def test_a_backward_that_refuses_a_second_derivative_fails_order_2_as_a_rule_that_raises():
    """A jaxfn refusal while gradcheck runs a case is a failure of that case, as a jvp or vmap
    rule's is: with raise_exception=False a false report, else a GradcheckError chained from it."""

    class Once(jaxfn.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return jnp.sin(x)

        @staticmethod
        @jaxfn.once_differentiable
        def backward(ctx, g):
            return g * jnp.cos(ctx.saved_tensors[0])

    x = jnp.array([0.3, 1.1])
    assert jaxfn.gradcheck(Once, x)
    report = jaxfn.gradcheck(Once, x, order=2, raise_exception=False)
    assert not report and report.failure.startswith(
        "jaxfn.gradcheck: 'Once': backward or its derivative (order=2) raised AutogradFunctionTypeError (jaxfn: "
        "'Once': its backward is marked jaxfn.once_differentiable"
    ), report.failure
    with pytest.raises(jaxfn.GradcheckError) as info:
        jaxfn.gradcheck(Once, x, order=2)
    assert isinstance(info.value.__cause__, jaxfn.AutogradFunctionError)


def test_a_host_exception_is_named_as_itself_where_jax_kept_only_its_traceback():
    """JAX reports an exception of host code (a callback) as its own runtime error, carrying the
    traceback's text; where it kept no reference to the exception, the failure still names it."""
    from jaxfn._gradcheck import _said

    def refuse(x):
        raise ZeroDivisionError("backward refuses x[1] > 5")

    shape = jax.ShapeDtypeStruct((2,), jnp.float32)
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.jit(lambda x: jax.pure_callback(refuse, shape, x))(jnp.ones(2, jnp.float32)).block_until_ready()
    info.value.__context__ = None  # as JAX gives it on a later call of the same signature
    assert _said(info.value) == "ZeroDivisionError (backward refuses x[1] > 5)"
