"""forward_mode=True: jvp, jacfwd and linearize from the same backward; reverse mode unchanged."""

import collections
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import linear_backward, linear_forward, plain_linear_free

import jaxfn

linear = jaxfn.autograd_function(linear_forward, linear_backward, name="linear", forward_mode=True)
K = jax.random.split(jax.random.key(11), 4)
X, W, B = jax.random.normal(K[0], (5, 3)), jax.random.normal(K[1], (4, 3)), jax.random.normal(K[2], (4,))


_CANT_TRANSPOSE = "JAX can't transpose it as a linear function of grad_output"
_COMBINES = _CANT_TRANSPOSE + r" \(AssertionError: it combines two values computed from grad_output"
_CONSTANT_TERM = "its gradient for 'x' is not zero when grad_output is zero"
_TRIPLE_VJP = jax.custom_vjp(lambda u: u * 3.0)
_TRIPLE_VJP.defvjp(lambda u: (u * 3.0, None), lambda _, g: (g * 3.0,))


def _close(got, want):
    for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("argnums", [0, 1, 2, (0, 1, 2)])
@pytest.mark.parametrize("jac", [jax.jacfwd, jax.jacrev], ids=["jacfwd", "jacrev"])
def test_jacobians_match_plain_math(maybe_jit, jac, argnums):
    _close(maybe_jit(jac(linear, argnums))(X, W, B), jac(plain_linear_free, argnums)(X, W, B))


def test_jvp_and_linearize(maybe_jit):
    tangents = (X * 0.3, W * -2.0, B)
    _close(
        maybe_jit(lambda p, t: jax.jvp(linear, p, t))((X, W, B), tangents),
        jax.jvp(plain_linear_free, (X, W, B), tangents),
    )
    _, f_lin = jax.linearize(lambda w: linear(X, w, B), W)
    _close(f_lin(W), X @ W.T)


def test_vmap_of_jvp():
    xs = jax.random.normal(K[3], (7, 5, 3))
    got = jax.vmap(lambda x: jax.jvp(lambda x: linear(x, W), (x,), (x,))[1])(xs)
    _close(got, jax.vmap(lambda x: x @ W.T)(xs))


def test_reverse_mode_runs_users_backward_straight_through():
    called = []

    def backward(ctx, g):
        called.append(True)
        return g

    sign = jaxfn.autograd_function(lambda ctx, x: jnp.sign(x), backward, name="sign_ste", forward_mode=True)
    x = jnp.array([-1.5, 0.3, 2.0])
    np.testing.assert_allclose(jax.grad(lambda x: (sign(x) * x).sum())(x), x + jnp.sign(x))
    np.testing.assert_allclose(jax.jvp(sign, (x,), (jnp.ones(3) * 2,))[1], [2.0, 2.0, 2.0])
    assert called


def test_hessian_and_second_order():
    def forward(ctx, x):
        ctx.save_for_backward(x=x)
        return jnp.sin(x)

    my_sin = jaxfn.autograd_function(forward, lambda ctx, g: g * jnp.cos(ctx.saved_variables.x), forward_mode=True)
    x = jnp.array([0.2, -0.9])
    _close(jax.hessian(lambda x: my_sin(x).sum())(x), jnp.diag(-jnp.sin(x)))
    _close(jax.jacfwd(jax.jacfwd(my_sin))(x), jax.jacfwd(jax.jacfwd(jnp.sin))(x))


def test_context_api_pytrees_keywords_several_and_non_differentiable_outputs():
    flags = []

    def forward(ctx, params, x, *, power=2):
        ctx.power = power  # static
        ctx.save_for_backward(params=params, x=x)
        y = params["a"] * x**power
        index = jnp.argmax(y)
        scaled = y * 0 + 3.0
        ctx.mark_non_differentiable(scaled)
        return y, jnp.sum(params["b"]) * x, scaled, index

    def backward(ctx, g_y, g_b, g_scaled, g_index):
        flags.append(tuple(ctx.needs_input_grad))
        s, p = ctx.saved_variables, ctx.power
        return {
            "params": {"a": (g_y * s.x**p).sum(), "b": jnp.full(s.params["b"].shape, (g_b * s.x).sum())},
            "x": g_y * s.params["a"] * p * s.x ** (p - 1) + g_b * jnp.sum(s.params["b"]),
        }

    f = jaxfn.autograd_function(forward, backward, name="f", forward_mode=True)

    def plain(params, x, power=2):
        y = params["a"] * x**power
        return y, jnp.sum(params["b"]) * x, y * 0 + 3.0

    params = {"a": jnp.array(1.5), "b": jnp.array([0.5, -1.0])}
    x = jnp.array([0.3, 0.8, -0.4])
    got = jax.jacfwd(lambda p, x: f(p, x, power=3)[:3], (0, 1))(params, x)
    want = jax.jacfwd(lambda p, x: plain(p, x, power=3), (0, 1))(params, x)
    _close(got[:2], want[:2])  # y and the b-term; the marked output has zero tangents
    _close(jax.jacfwd(lambda x: f(params, x)[2])(x), jnp.zeros((3, 3)))
    _close(jax.grad(lambda x: f(params, x)[0].sum())(x), jax.grad(lambda x: plain(params, x)[0].sum())(x))
    assert (False, True, False) in flags and (True, True, False) in flags


def test_class_attribute():
    class Cube(jaxfn.Function):
        forward_mode = True

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**3

        @staticmethod
        def backward(ctx, g):
            return g * 3 * ctx.saved_tensors[0] ** 2

    x = jnp.array([1.0, 2.0])
    _close(jax.jacfwd(Cube.apply)(x), jnp.diag(3 * x**2))


@pytest.mark.parametrize(
    "backward, what",
    [
        (lambda ctx, g: jnp.ones(2), _CONSTANT_TERM),
        (lambda ctx, g: g**2, _CANT_TRANSPOSE + ".*integer_pow"),
        (lambda ctx, g: g * g, _COMBINES),
        (lambda ctx, g: jnp.clip(g, -1, 1), _CANT_TRANSPOSE + ".*'(clamp|max|min)'"),
        (lambda ctx, g: jnp.where(g > 0, g, 0.0), _COMBINES),
        (lambda ctx, g: g / jnp.linalg.norm(g), _CANT_TRANSPOSE + ".*nonlinear div"),
        (lambda ctx, g: g + 1.0, _CONSTANT_TERM),
        (lambda ctx, g: g * 2.0 + ctx.bias, _CONSTANT_TERM),
        (lambda ctx, g: jax.nn.relu(g), _CANT_TRANSPOSE + ".*'max'"),
        (lambda ctx, g: jax.lax.stop_gradient(g), _CANT_TRANSPOSE + ".*'stop_gradient'"),
        (lambda ctx, g: jnp.where(ctx.mask, g, 1.0), _CONSTANT_TERM),
        (lambda ctx, g: jax.lax.cond(g.sum() > 0, lambda: g, lambda: -g), _COMBINES),
    ],
    ids=[
        "ignores",
        "squares",
        "g*g",
        "clips",
        "where",
        "normalizes",
        "g+1",
        "affine",
        "relu",
        "stop_gradient",
        "where-const",
        "cond-on-g",
    ],
)
def test_backward_not_linear_in_grad_output_is_refused(backward, what):
    def forward(ctx, x):
        ctx.bias = jnp.arange(2.0)
        ctx.mask = x > 1
        return x * 2

    f = jaxfn.autograd_function(forward, backward, name="clip_grad", forward_mode=True)
    for transform in (lambda: jax.jvp(f, (jnp.ones(2),), (jnp.ones(2),)), lambda: jax.jit(jax.jacfwd(f))(jnp.ones(2))):
        with pytest.raises(
            jaxfn.AutogradFunctionError,
            match=r"'clip_grad': it has forward_mode=True, so its backward must "
            rf"be linear in grad_output.*{what}.*without forward_mode=True",
        ):
            transform()


def _linear_backwards():
    inner_vjp = jax.custom_vjp(lambda u: u * 3.0)
    inner_vjp.defvjp(lambda u: (u * 3.0, None), lambda _, g: (g * 3.0,))
    triple = jaxfn.autograd_function(lambda ctx, u: u * 3.0, lambda ctx, g: g * 3.0, name="triple")
    m = jnp.array([[2.0, 1.0], [0.0, 3.0]])
    return {
        "many ops": lambda ctx, g: (
            (jnp.cumsum(g[::-1])[::-1] * 2.0 + jnp.roll(g, 1) - 0.0 * g) / 3.0 * 3.0
            - jnp.roll(g, 1)
            + jnp.concatenate([g[:1], g[1:]])
            - g
            + jnp.where(ctx.mask, g, 0.0)
            - jnp.where(ctx.mask, g, 0.0)
        ),
        "matmul": lambda ctx, g: jnp.linalg.solve(m, m @ g),
        "jaxfn on g": lambda ctx, g: triple(g) / 3.0 * 2.0,
        "jit on g": lambda ctx, g: jax.jit(lambda u: u * 2.0)(g),
        "cond on x": lambda ctx, g: jax.lax.cond(ctx.flag.sum() > 0, lambda: g * 2.0, lambda: g * 5.0),
        "tile and split": lambda ctx, g: sum(jnp.split(jnp.tile(g, 2), 2)) * 1.5,
        "fori_loop over g": lambda ctx, g: jax.lax.fori_loop(0, 3, lambda i, c: c * 2.0 + jnp.roll(c, 1), g),
        "checkpoint on g": lambda ctx, g: jax.checkpoint(lambda u: jnp.sin(ctx.flag) * u)(g),
        "cond on x with g": lambda ctx, g: jax.lax.cond(ctx.flag[0] > 0, lambda u: u * 2.0, lambda u: -u, g),
        "scan over g": lambda ctx, g: (
            jax.lax.scan(lambda c, gi: (c + gi, c + 2.0 * gi), 0.0, g)[1]
            - jnp.cumsum(g)
            + jnp.cumsum(g)
            - jax.lax.scan(lambda c, gi: (c + gi, c), 0.0, g)[1]
        ),
    }


@pytest.mark.parametrize("name", list(_linear_backwards()))
def test_linear_backwards_built_from_many_ops_are_accepted(name):
    if name == "checkpoint on g" and os.environ.get("JAX_REMAT3", "").lower() in ("1", "true"):
        pytest.skip("with jax_remat3 on, JAX can't transpose jax.checkpoint (refused in jaxfn's words)")
    backward = _linear_backwards()[name]

    def forward(ctx, x):
        ctx.mask = x > 1
        ctx.flag = x
        return x * 2

    f = jaxfn.autograd_function(forward, backward, name="twice", forward_mode=True)
    x, t = jnp.array([1.0, 2.0]), jnp.array([0.5, -1.5])
    _, pullback = jax.vjp(f, x)
    (vjp_of_t,) = pullback(t)
    want_jvp = jnp.stack([pullback(e)[0] for e in jnp.eye(2)]) @ t  # J^T of the pullback, applied to t
    _close(jax.jvp(f, (x,), (t,))[1], want_jvp)
    _close(jax.jit(lambda x: jax.jvp(f, (x,), (t,))[1])(x), want_jvp)
    _close(vjp_of_t, jax.vjp(lambda u: jax.jvp(f, (x,), (u,))[1], t)[1](t)[0])


def test_zero_gradients_are_linear():
    f = jaxfn.autograd_function(lambda ctx, x, y: x * 2 + y, lambda ctx, g: (g * 2, jnp.zeros(2)), forward_mode=True)
    _close(jax.jvp(f, (jnp.ones(2), jnp.ones(2)), (jnp.ones(2), jnp.ones(2)))[1], jnp.full(2, 2.0))


@pytest.mark.parametrize(
    "backward, what",
    [
        (
            lambda ctx, g: jnp.take(g, jnp.array([0, 7]), mode="fill", fill_value=1.0) + g.sum(),
            _CONSTANT_TERM,
        ),
        (lambda ctx, g: g * 2 if g.sum() > 0 else g, "it needs the concrete value of grad_output"),
        (lambda ctx, g: _TRIPLE_VJP(g), "it calls a jax.custom_vjp function on grad_output, which JAX can't transpose"),
    ],
    ids=["take fills with 1", "branch on g", "custom_vjp on g"],
)
def test_more_backwards_that_are_not_linear(backward, what):
    f = jaxfn.autograd_function(lambda ctx, x: x * 2.0, backward, name="f", forward_mode=True)
    with pytest.raises(jaxfn.AutogradFunctionError, match=rf"'f': it has forward_mode=True.*{what}"):
        jax.jvp(f, (jnp.ones(2),), (jnp.ones(2),))


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_an_infinite_derivative_is_no_constant_term(transform):
    """At x = 0 backward multiplies grad_output by inf: its value at a zero grad_output is NaN
    (0 * inf), which is no constant term; eagerly as under jit it is accepted, and the tangent
    there is what backward's formula gives."""

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return jnp.sqrt(x)

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 0.5 / jnp.sqrt(x)

    f = jaxfn.autograd_function(forward, backward, name="sqrt", forward_mode=True)
    tangent = transform(lambda x: jax.jvp(f, (x,), (jnp.ones(2),))[1])(jnp.array([0.0, 4.0]))
    assert jnp.isinf(tangent[0]) and float(tangent[1]) == 0.25


def test_jaxfn_functions_called_on_grad_output_are_transposed_through_their_forward():
    """backward's value is what the inner function's forward computes; its own backward (which
    clips here) is not the transpose of that."""
    clip_gradient = jaxfn.autograd_function(lambda ctx, g: g, lambda ctx, ct: jnp.clip(ct, -1.0, 1.0), name="clip")
    f = jaxfn.autograd_function(lambda ctx, x: x * 2.0, lambda ctx, g: clip_gradient(g) * 2.0, forward_mode=True)
    x, t = jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5, -3.0, 2.0])
    _close(jax.jvp(f, (x,), (t,))[1], 2.0 * t)  # the transpose of what backward computes: g * 2
    _close(jax.jit(lambda t: jax.jvp(f, (x,), (t,))[1])(t), 2.0 * t)
    _close(jax.grad(lambda x: (f(x) * 5.0).sum())(x), jnp.full(3, 10.0))  # backward's value, ct = 5


def test_reduce_precision_of_grad_output_is_transposed_as_jax_does():
    """JAX's transposition treats reduce_precision as linear (as it does a cast): so does the gate."""
    f = jaxfn.autograd_function(
        lambda ctx, x: x * 1.0, lambda ctx, g: jax.lax.reduce_precision(g, 8, 7), name="rounds", forward_mode=True
    )
    _close(jax.jvp(f, (jnp.ones(1),), (jnp.array([0.5]),))[1], jnp.array([0.5]))


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_an_affine_backward_is_refused_whatever_its_saved_offset_holds(transform):
    """A saved offset that happens to be zero must not make `g * 2 + b` pass eagerly only."""

    def forward(ctx, x, s):
        ctx.save_for_backward(b=s * x)
        return x * 2

    def backward(ctx, g):
        return g * 2 + ctx.saved_variables.b, None

    f = jaxfn.autograd_function(forward, backward, name="offset", forward_mode=True)
    jvp = transform(lambda x: jax.jvp(lambda x: f(x, jnp.array(0.0)), (x,), (jnp.ones(3),))[1])
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'offset': it has forward_mode=True"):
        jvp(jnp.ones(3))


def _max_pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (2,), (2,), "VALID")


def test_a_max_pool_backward_is_accepted_and_correct(maybe_jit):
    """Its backward is select_and_scatter_add, which JAX transposes (the old primitive table refused it)."""

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _max_pool(x)

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return jax.vjp(_max_pool, x)[1](g)[0]

    pool = jaxfn.autograd_function(forward, backward, name="max_pool", forward_mode=True)
    x, t = jnp.array([1.0, 3.0, -2.0, -5.0, 4.0, 0.5]), jnp.arange(6.0)
    _close(maybe_jit(lambda x, t: jax.jvp(pool, (x,), (t,)))(x, t), jax.jvp(_max_pool, (x,), (t,)))
    _close(maybe_jit(jax.jacfwd(pool))(x), jax.jacfwd(_max_pool)(x))


def test_a_tridiagonal_solve_backward_is_accepted_and_correct(maybe_jit):
    dl, d, du = jnp.array([0.0, 1.0, 1.0]), jnp.array([4.0, 5.0, 6.0]), jnp.array([1.0, 1.0, 0.0])
    dense = jnp.diag(d) + jnp.diag(dl[1:], -1) + jnp.diag(du[:-1], 1)

    def forward(ctx, b):
        return jax.lax.linalg.tridiagonal_solve(dl, d, du, b[:, None])[:, 0]

    def backward(ctx, g):  # the transposed system: a tridiagonal solve of g
        return jax.lax.linalg.tridiagonal_solve(jnp.roll(du, 1), d, jnp.roll(dl, -1), g[:, None])[:, 0]

    solve = jaxfn.autograd_function(forward, backward, name="tridiagonal", forward_mode=True)
    b = jnp.array([1.0, -2.0, 0.5])
    _close(maybe_jit(jax.jacfwd(solve))(b), jnp.linalg.inv(dense))


@pytest.mark.parametrize(
    "backward",
    [
        lambda ctx, g: jax.lax.scan(lambda c, gi: (c, gi + ctx.saved_tensors[0][0]), 0.0, g)[1],
        lambda ctx, g: jax.lax.cond(ctx.saved_tensors[0][0] > 10, lambda: g, lambda: g + 1.0),
        lambda ctx, g: jax.jit(lambda u, r: u * 2.0 + r)(g, ctx.saved_tensors[0]),
        lambda ctx, g: jax.checkpoint(lambda u: u - ctx.saved_tensors[0])(g),
        lambda ctx, g: jax.lax.fori_loop(0, 2, lambda i, c: c + ctx.saved_tensors[0], g),
        lambda ctx, g: _AFFINE(g, ctx.saved_tensors[0]),
    ],
    ids=["scan", "cond", "jit", "checkpoint", "fori_loop", "nested jaxfn"],
)
@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_affine_backwards_are_refused_through_control_flow_and_nesting(backward, transform):
    """A term that does not depend on grad_output, hidden inside scan, cond, jit, checkpoint, a
    loop or another jaxfn function, is found eagerly and under jit (saved values unknown there)."""

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2.0

    f = jaxfn.autograd_function(forward, backward, name="affine", forward_mode=True)
    jvp = transform(lambda x: jax.jvp(f, (x,), (jnp.ones(3),))[1])
    # (with jax_remat3 on, JAX can't transpose a checkpoint at all: refused as not transposable)
    with pytest.raises(jaxfn.AutogradFunctionError, match=rf"'affine': .*({_CONSTANT_TERM}|{_CANT_TRANSPOSE})"):
        jvp(jnp.array([1.0, 2.0, 3.0]))


_AFFINE = jaxfn.autograd_function(lambda ctx, u, r: u + r, lambda ctx, g: (g, g), name="inner_affine")


def test_a_while_loop_over_g_is_refused_in_jaxfns_words():
    f = jaxfn.autograd_function(
        lambda ctx, x: x * 2.0,
        lambda ctx, g: jax.lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] * 2.0), (0, g))[1],
        name="loops",
        forward_mode=True,
    )
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'loops': .*" + _CANT_TRANSPOSE + ".*while_loop"):
        jax.jvp(f, (jnp.ones(2),), (jnp.ones(2),))


def test_the_gate_adds_nothing_to_the_compiled_program():
    """The constant-term check runs at trace time in a thread of its own: the compiled program of
    jit(jvp) is a hand-written custom_jvp's, opcode for opcode."""
    f = jaxfn.autograd_function(lambda ctx, x: x * 2.0, lambda ctx, g: g * 2.0, name="double", forward_mode=True)
    plain = jax.custom_jvp(lambda x: x * 2.0)
    plain.defjvp(lambda p, t: (p[0] * 2.0, t[0] * 2.0))

    def opcodes(g):
        text = jax.jit(lambda x: jax.jvp(g, (x,), (x,))).lower(jnp.ones(3)).compile().as_text()
        return collections.Counter(re.findall(r" = \S+ (\w[\w-]*)\(", text))

    assert opcodes(f) == opcodes(plain)


@pytest.mark.parametrize(
    "second",
    [jax.hessian, lambda f: jax.jacfwd(jax.jacrev(f)), lambda f: jax.jacrev(jax.jacrev(f))],
    ids=["hessian", "jacfwd of jacrev", "jacrev of jacrev"],
)
def test_second_derivatives_in_forward_mode_match_plain_math(maybe_jit, second):
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return jnp.sin(x) * x

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (jnp.cos(x) * x + jnp.sin(x))

    f = jaxfn.autograd_function(forward, backward, name="xsin", forward_mode=True)
    x = jnp.array([0.3, -1.2, 2.0])
    _close(maybe_jit(second(lambda x: f(x).sum()))(x), second(lambda x: (jnp.sin(x) * x).sum())(x))


def test_the_gate_keeps_an_x64_context_of_the_callers_thread():
    """The offset check runs in a thread of its own; a ``jax.enable_x64`` context (a per-thread
    setting) must reach it, or float64 values would meet float32 ones there. Run with x64 off
    globally, as a user's process is."""
    script = (
        "import jax, jax.numpy as jnp, numpy as np, jaxfn\n"
        "assert not jax.config.jax_enable_x64\n"
        "def forward(ctx, x):\n"
        "    ctx.save_for_backward(x)\n"
        "    return x * x\n"
        "f = jaxfn.autograd_function(forward, lambda ctx, g: g * 2 * ctx.saved_tensors[0], forward_mode=True)\n"
        "with jax.enable_x64(True):\n"
        "    x = jnp.arange(3.0, dtype=jnp.float64)\n"
        "    t = jax.jit(lambda x: jax.jvp(f, (x,), (x,))[1])(x)\n"
        "    assert t.dtype == jnp.float64 and np.allclose(t, [0.0, 2.0, 8.0])\n"
        "    assert jaxfn.gradcheck(f, np.arange(3.0))\n"
        "print('OK')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stderr[-2000:]
