"""jaxfn.gradcheck: right backwards pass, wrong ones are caught and located."""

import jax
import jax.numpy as jnp
import pytest
from seeds import exp2, linear, mul_constant, my_relu

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


def test_raise_exception_false_returns_false():
    assert jaxfn.gradcheck(_wrong("input", lambda g: 2 * g), X, W, B, raise_exception=False) is False


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
