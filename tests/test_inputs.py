"""Every dtype JAX differentiates, and the inputs ported code passes: each works or says why."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jaxfn

INEXACT = ["bfloat16", "float16", "float32", "float64", "complex64", "complex128"] + sorted(
    name for name in dir(jnp) if name.startswith(("float8_", "float6_", "float4_"))
)


def _square_forward(ctx, x):
    ctx.save_for_backward(x)
    return x * x


def _square_backward(ctx, grad_output):
    (x,) = ctx.saved_tensors
    assert ctx.needs_input_grad[0]
    return grad_output * 2 * x


def _array_of(dtype_name):
    dtype = getattr(jnp, dtype_name)
    values = [1 + 1j, 2 - 1j] if "complex" in dtype_name else [1.0, 2.0]
    try:
        x = jnp.asarray(values, dtype)
    except Exception as err:  # noqa: BLE001 - a dtype this backend's XLA can't hold at all
        pytest.skip(f"{dtype_name} arrays can't be made on this backend: {err}")
    try:  # the tests multiply: some XLA backends hold a dtype but can't multiply it (float6 on jax 0.12's CPU)
        jax.block_until_ready(jax.jit(lambda x: x * x)(x))
    except jax.errors.JaxRuntimeError as err:
        pytest.skip(f"this backend's XLA can't multiply {dtype_name} arrays: {str(err)[:200]}")
    return x


@pytest.mark.parametrize("dtype_name", INEXACT)
@pytest.mark.parametrize("forward_mode", [False, True], ids=["reverse", "forward_mode"])
def test_every_inexact_dtype_is_differentiable(dtype_name, forward_mode):
    x = _array_of(dtype_name)
    square = jaxfn.autograd_function(_square_forward, _square_backward, name="square", forward_mode=forward_mode)
    wide = jnp.complex128 if "complex" in dtype_name else jnp.float64

    def loss(x):
        return jnp.real(square(x).astype(wide) * jnp.asarray([1.0, 0.5], wide)).sum()

    got = jax.grad(loss)(x)
    want = jax.grad(lambda x: jnp.real((x * x).astype(wide) * jnp.asarray([1.0, 0.5], wide)).sum())(x)
    assert got.dtype == x.dtype
    np.testing.assert_allclose(np.asarray(got.astype(wide)), np.asarray(want.astype(wide)), rtol=1e-2)
    assert np.any(np.asarray(got.astype(wide)) != 0)
    if forward_mode:
        tangent = jax.jvp(square, (x,), (jnp.ones_like(x),))[1]
        np.testing.assert_allclose(np.asarray(tangent.astype(wide)), np.asarray((2 * x).astype(wide)), rtol=1e-2)


@pytest.mark.parametrize("dtype_name", INEXACT)
def test_gradcheck_checks_every_inexact_dtype(dtype_name):
    x = _array_of(dtype_name)
    square = jaxfn.autograd_function(_square_forward, _square_backward, name="square")
    wrong = jaxfn.autograd_function(_square_forward, lambda ctx, g: g * 3 * ctx.saved_tensors[0], name="wrong")
    assert jaxfn.gradcheck(square, x)
    assert not jaxfn.gradcheck(wrong, x, raise_exception=False)


def test_typed_prng_keys_pass_through_as_arguments_and_outputs():
    def forward(ctx, x, key, rate):
        key, sub = jax.random.split(key)
        keep = jax.random.bernoulli(sub, 1 - rate, x.shape)
        ctx.save_for_backward(keep=keep)
        ctx.mark_non_differentiable(key)
        return jnp.where(keep, x / (1 - rate), 0.0), key

    def backward(ctx, grad_output, grad_key):
        assert grad_key is None  # a key has no zeros to hand over
        assert not ctx.needs_input_grad.key
        return {"x": jnp.where(ctx.saved_variables.keep, grad_output / 0.5, 0.0)}

    dropout = jaxfn.autograd_function(forward, backward, name="dropout")
    x, key = jnp.arange(1.0, 9.0), jax.random.key(0)
    for call in (dropout, jax.jit(dropout, static_argnums=2)):
        y, new_key = call(x, key, 0.5)
        assert jax.dtypes.issubdtype(new_key.dtype, jax.dtypes.prng_key)
        grad = jax.grad(lambda x, call=call: call(x, key, 0.5)[0].sum())(x)
        np.testing.assert_allclose(grad, jnp.where(y != 0, 2.0, 0.0))


def _bias_forward(ctx, x, w, b):
    ctx.save_for_backward(x=x, w=w)
    return x @ w + b


def _bias_backward(ctx, g):
    s = ctx.saved_variables
    return {"x": g @ s.w.T, "w": s.x.T @ g, "b": g}  # (N, out) for an (out,) bias: summed by jaxfn


def test_export_with_a_symbolic_batch_dimension():
    linear = jaxfn.autograd_function(_bias_forward, _bias_backward, name="linear")
    w, b = jnp.ones((3, 2)), jnp.arange(2.0)

    def grads(x, w, b):
        return jax.grad(lambda x, w, b: linear(x, w, b).sum(), (0, 1, 2))(x, w, b)

    (batch,) = export.symbolic_shape("n")
    x_spec = jax.ShapeDtypeStruct((batch, 3), jnp.float32)
    exported = export.export(jax.jit(grads))(x_spec, w.astype(jnp.float32), b.astype(jnp.float32))
    restored = export.deserialize(exported.serialize())
    for n in (1, 5):
        x = jnp.ones((n, 3), jnp.float32)
        got = restored.call(x, w.astype(jnp.float32), b.astype(jnp.float32))
        want = jax.grad(lambda x, w, b: (x @ w + b).sum(), (0, 1, 2))(x, w, b)
        for g, r in zip(got, want):
            np.testing.assert_allclose(g, r, rtol=1e-6)


def _varargs_sum(ctx, *xs):
    return sum(xs)


@pytest.mark.parametrize(
    "returned",
    [lambda g: (g,), lambda g: g, lambda g: (g, None, None), lambda g: {"xs": (g,)}],
    ids=["tuple", "bare", "trailing Nones", "dict"],
)
def test_varargs_forward_with_one_array(returned):
    f = jaxfn.autograd_function(_varargs_sum, lambda ctx, g: returned(g * 3), name="vsum")
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(jnp.ones(2)), [3.0, 3.0])


def test_varargs_forward_gets_one_gradient_and_one_flag_per_argument():
    seen = []

    def backward(ctx, g):
        seen.append(tuple(ctx.needs_input_grad))
        return g * 2, None, g * 4

    f = jaxfn.autograd_function(_varargs_sum, backward, name="vsum")
    grads = jax.grad(lambda a, c: f(a, jnp.ones(2), c).sum(), (0, 1))(jnp.ones(2), jnp.ones(2))
    np.testing.assert_allclose(grads[0], [2.0, 2.0])
    np.testing.assert_allclose(grads[1], [4.0, 4.0])
    assert seen == [(True, False, True)]


def test_trailing_nones_like_pytorch_and_the_count_message():
    f = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: (g * 2, None, None), name="double")
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(jnp.ones(2)), [2.0, 2.0])
    bad = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: (g, g, g), name="double")
    with pytest.raises(
        jaxfn.AutogradFunctionError, match=r"'double': backward returned 3 gradients for 1 parameter \(x\)"
    ):
        jax.grad(lambda x: bad(x).sum())(jnp.ones(2))


def test_numpy_string_arrays_are_static_arguments_and_refused_outputs():
    labels = np.array(["cat", "dog"])

    def forward(ctx, x, names):
        ctx.names = names
        return x * len(names)

    f = jaxfn.autograd_function(forward, lambda ctx, g: {"x": g * len(ctx.names)}, name="by_label")
    for call in (f, jax.jit(lambda x: f(x, labels))):
        args = (jnp.ones(2), labels) if call is f else (jnp.ones(2),)
        np.testing.assert_allclose(call(*args), [2.0, 2.0])
    np.testing.assert_allclose(jax.grad(lambda x: f(x, labels).sum())(jnp.ones(2)), [2.0, 2.0])
    g = jaxfn.autograd_function(lambda ctx, x: (x, labels), lambda ctx, *gs: None, name="labelled")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'labelled': forward returned a NumPy array of dtype <U3"):
        g(jnp.ones(2))


class _Box:
    def __init__(self, value):
        self.value = value


@pytest.mark.parametrize("transform", ["scan", "checkpoint"])
def test_arrays_hidden_in_a_plain_object_on_ctx_are_refused_with_the_fix(transform):
    def forward(ctx, x):
        ctx.box = _Box(x)
        return x * 2

    f = jaxfn.autograd_function(forward, lambda ctx, g: g * 2, name="boxed")
    if transform == "scan":
        run = lambda x: jax.lax.scan(lambda c, _: (f(c), None), x, None, length=2)[0].sum()  # noqa: E731
    else:
        run = lambda x: jax.checkpoint(lambda x: f(x).sum())(x)  # noqa: E731
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'boxed': ctx.box is a _Box that holds arrays JAX"):
        jax.grad(run)(jnp.ones(2))


def test_mark_non_differentiable_on_a_python_number_output():
    def forward(ctx, x):
        count = 3
        ctx.mark_non_differentiable(count)
        return x * 2, count

    def backward(ctx, g, g_count):
        assert g_count is None
        return g * 2

    f = jaxfn.autograd_function(forward, backward, name="counted")
    assert f(jnp.ones(2))[1] == 3
    np.testing.assert_allclose(jax.grad(lambda x: f(x)[0].sum())(jnp.ones(2)), [2.0, 2.0])


def test_linearize_in_the_default_mode_gives_the_primal_and_refuses_the_tangent_map():
    # jax.linearize returns before any forward-mode work; JAX raises its own refusal when the
    # linear map is applied, with jaxfn no longer on the stack (README, Known limits).
    f = jaxfn.autograd_function(lambda ctx, x: jnp.sin(x), lambda ctx, g: g * jnp.cos(1.0), name="my_sin")
    if jax.config.jax_custom_vjp3:  # JAX's new custom_vjp refuses linearize at once: jaxfn says so
        with pytest.raises(jaxfn.AutogradFunctionError, match=r"'my_sin': it was differentiated in forward mode"):
            jax.linearize(f, jnp.ones(2))
    else:
        y, tangent_map = jax.linearize(f, jnp.ones(2))
        np.testing.assert_allclose(y, jnp.sin(jnp.ones(2)))
        with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
            tangent_map(jnp.ones(2))
    g = jaxfn.autograd_function(lambda ctx, x: jnp.sin(x), lambda ctx, g: g * jnp.cos(1.0), forward_mode=True)
    np.testing.assert_allclose(jax.linearize(g, jnp.ones(2))[1](jnp.ones(2)), jnp.cos(jnp.ones(2)))


def test_saved_variables_by_position():
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    def backward(ctx, g):
        s = ctx.saved_variables
        return g * s[1], g * s[0]

    f = jaxfn.autograd_function(forward, backward, name="mul")
    grads = jax.grad(lambda x, y: f(x, y).sum(), (0, 1))(jnp.full(2, 3.0), jnp.full(2, 5.0))
    np.testing.assert_allclose(grads[0], [5.0, 5.0])
    np.testing.assert_allclose(grads[1], [3.0, 3.0])
