"""The seeds' examples (R torch docs), each checked against jax.grad of the plain math."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from seeds import exp2, linear, mul_constant, my_relu

KEYS = jax.random.split(jax.random.key(0), 4)
X = jax.random.normal(KEYS[0], (5, 3))
W = jax.random.normal(KEYS[1], (4, 3))
B = jax.random.normal(KEYS[2], (4,))
COT = jax.random.normal(KEYS[3], (5, 4))


def plain_linear(x, w, b=None):
    out = x @ w.T
    return out if b is None else out + b


@pytest.mark.parametrize("argnums", [(0,), (1,), (2,), (0, 1), (1, 2), (0, 2), (0, 1, 2)])
def test_linear_with_bias_matches_jax_grad(maybe_jit, argnums):
    loss = lambda f: lambda *a: jnp.vdot(f(*a), COT)  # noqa: E731
    got = maybe_jit(jax.grad(loss(linear), argnums))(X, W, B)
    want = jax.grad(loss(plain_linear), argnums)(X, W, B)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-12)


def test_linear_without_bias_matches_jax_grad(maybe_jit):
    got = maybe_jit(jax.grad(lambda x, w: jnp.vdot(linear(x, w), COT), (0, 1)))(X, W)
    want = jax.grad(lambda x, w: jnp.vdot(plain_linear(x, w), COT), (0, 1))(X, W)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_linear_numerically():
    check_grads(linear, (X, W, B), order=1, modes=["rev"])
    check_grads(linear, (X, W), order=1, modes=["rev"])


def test_mul_constant_like_the_r_docs(maybe_jit):
    x = jnp.array([1.0])
    out = maybe_jit(lambda x: mul_constant(x, 2))(x)
    grad = maybe_jit(jax.grad(lambda x: mul_constant(x, 2).sum()))(x)
    np.testing.assert_allclose(out, [2.0])
    np.testing.assert_allclose(grad, [2.0])  # R: x$grad is 2


def test_exp2(maybe_jit):
    x = jnp.linspace(-2.0, 2.0, 7)
    np.testing.assert_allclose(maybe_jit(jax.grad(lambda x: exp2(x).sum()))(x), jnp.exp(x), rtol=1e-12)
    check_grads(exp2, (x,), order=2, modes=["rev"])


def test_my_relu(maybe_jit):
    x = jnp.array([-2.0, -0.5, 0.5, 3.0])
    np.testing.assert_allclose(maybe_jit(my_relu)(x), jax.nn.relu(x))
    np.testing.assert_allclose(maybe_jit(jax.grad(lambda x: my_relu(x).sum()))(x), [0.0, 0.0, 1.0, 1.0])


def test_two_layer_net_step_matches_plain_autodiff():
    kx, ky, k1, k2 = jax.random.split(jax.random.key(1), 4)
    x, y = jax.random.normal(kx, (8, 20)), jax.random.normal(ky, (8, 3))
    w1, w2 = jax.random.normal(k1, (20, 6)), jax.random.normal(k2, (6, 3))

    def loss(relu):
        return lambda w1, w2: ((relu(x @ w1) @ w2 - y) ** 2).sum()

    got = jax.jit(jax.grad(loss(my_relu), (0, 1)))(w1, w2)
    want = jax.grad(loss(jax.nn.relu), (0, 1))(w1, w2)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-10)


@pytest.mark.parametrize("which", list(itertools.product([False, True], repeat=3)))
def test_needs_input_grad_for_each_combination(which):
    seen = {}

    def backward(ctx, grad_output):
        seen.update(
            by_name=dict(
                zip("iwb", (ctx.needs_input_grad.input, ctx.needs_input_grad.weight, ctx.needs_input_grad.bias))
            ),
            by_index=tuple(ctx.needs_input_grad),
            by_key=ctx.needs_input_grad["bias"],
        )
        return linear.backward(ctx, grad_output)

    import jaxfn

    fn = jaxfn.autograd_function(linear.forward, backward, name="linear")
    argnums = tuple(i for i, flag in enumerate(which) if flag)
    if not argnums:
        fn(X, W, B)
        assert seen == {}  # nothing differentiated: backward never runs
        return
    jax.grad(lambda *a: fn(*a).sum(), argnums)(X, W, B)
    assert seen["by_index"] == which
    assert tuple(seen["by_name"].values()) == which
    assert seen["by_key"] == which[2]


def test_r_examples_ported_line_by_line():
    """The seeds' R code with only the syntax changed ($ -> ., list(...) -> dict, <- -> =)."""
    import jaxfn

    def forward(ctx, i):
        result = jnp.exp(i)  # result <- i$exp()
        ctx.save_for_backward(result=result)  # ctx$save_for_backward(result = result)
        return result

    def backward(ctx, grad_output):
        return {"i": grad_output * ctx.saved_variables.result}  # list(i = grad_output * ctx$saved_variables$result)

    exp2_r = jaxfn.autograd_function(forward=forward, backward=backward)
    np.testing.assert_allclose(jax.grad(lambda x: exp2_r(x).sum())(X), jnp.exp(X), rtol=1e-12)

    def relu_backward(ctx, grad_output):
        v = ctx.saved_variables  # v <- ctx$saved_variables
        grad_input = grad_output.at[v.input < 0].set(0)  # grad_input[v$input < 0] <- 0 (arrays are immutable)
        return {"input": grad_input}  # list(input = grad_input)

    relu_r = jaxfn.autograd_function(
        lambda ctx, input: (ctx.save_for_backward(input=input), jnp.clip(input, 0))[1], relu_backward
    )
    np.testing.assert_allclose(jax.grad(lambda x: relu_r(x).sum())(X), (X > 0).astype(X.dtype))


def test_the_r_reference_page_typo_saved_variable_gets_a_hint():
    import jaxfn

    def backward(ctx, grad_output):
        return {"i": grad_output * ctx.saved_variable.result}  # exp2's R reference page writes saved_variable

    f = jaxfn.autograd_function(lambda ctx, i: (ctx.save_for_backward(result=jnp.exp(i)), jnp.exp(i))[1], backward)
    with pytest.raises(AttributeError, match=r"ctx has no 'saved_variable'.*Did you mean ctx.saved_variables\?"):
        jax.grad(lambda x: f(x).sum())(X)
