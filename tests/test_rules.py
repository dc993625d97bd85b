"""A user's jvp and vmap rules, and the vjp alias (PyTorch's Function beyond forward/backward).

Every derivative is compared with JAX's differentiation of the plain math, or with finite
differences; every batched result with ``jax.vmap`` of the plain math, or one example at a time.
"""

import os
import pickle
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import run_on_8_devices

import jaxfn

X = jnp.array([0.5, -1.25, 2.0])
XS = jnp.array([[0.5, -1.25, 2.0], [1.5, 0.25, -0.75]])


def _close(got, want, tol=1e-10):
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


# -- PyTorch's examples ("Extending torch.func with autograd.Function"), ported ------------------


class MyCube(jaxfn.Function):
    """PyTorch's MyCube: forward returns x**3 and its derivative; jvp and backward use both."""

    @staticmethod
    def forward(x):
        result = x**3
        dx = 3 * x**2
        return result, dx

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        result, dx = output
        ctx.save_for_backward(x, dx)
        ctx.save_for_forward(x, dx)

    @staticmethod
    def backward(ctx, grad_output, grad_dx):
        x, dx = ctx.saved_tensors
        return grad_output * dx + grad_dx * 6 * x

    @staticmethod
    def jvp(ctx, x_t):
        x, dx = ctx.saved_tensors
        return dx * x_t, 6 * x * x_t


def plain_cube(x):
    return x**3, 3 * x**2


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: jax.jvp(f, (X,), (jnp.array([1.0, -2.0, 0.5]),)),
        lambda f: jax.jacfwd(f)(X),
        lambda f: jax.jacrev(f)(X),
        lambda f: jax.hessian(lambda x: f(x)[0].sum() + f(x)[1].sum())(X),
        lambda f: jax.grad(lambda x: jax.grad(lambda x: f(x)[0].sum())(x).sum())(X),
        lambda f: jax.linearize(f, X)[1](jnp.array([1.0, 2.0, 3.0])),
        lambda f: jax.vmap(f)(XS),
        lambda f: jax.vmap(jax.jacfwd(f))(XS),
        lambda f: jax.jacfwd(jax.vmap(f))(XS),
        lambda f: jax.vmap(jax.grad(lambda x: f(x)[0].sum()))(XS),
        lambda f: jax.grad(lambda x: jax.vmap(f)(x)[1].sum())(XS),
        lambda f: jax.lax.scan(lambda c, x: (c + f(x)[0].sum(), jax.jvp(f, (x,), (x,))[1]), 0.0, XS),
        lambda f: jax.grad(jax.checkpoint(lambda x: f(x)[0].sum()))(X),
        lambda f: jax.jvp(jax.checkpoint(lambda x: f(x)[0].sum()), (X,), (X,)),
    ],
    ids=[
        "jvp",
        "jacfwd",
        "jacrev",
        "hessian",
        "grad-grad",
        "linearize",
        "vmap",
        "vmap-jacfwd",
        "jacfwd-vmap",
        "vmap-grad",
        "grad-vmap",
        "scan",
        "grad-checkpoint",
        "jvp-checkpoint",
    ],
)
def test_pytorch_mycube_under_every_transformation(maybe_jit, transform):
    _close(maybe_jit(lambda: transform(MyCube.apply))(), transform(plain_cube))


class NumpySort(jaxfn.Function):
    """PyTorch's NumpySort: NumPy code (host=True) with a vmap rule that sorts a whole batch at once."""

    host = True
    calls: list = []

    @staticmethod
    def forward(ctx, x, dim):
        NumpySort.calls.append((x.shape, bool(np.all(x == 1))))  # (shape, a probe on ones)
        ind = np.argsort(x, axis=dim)
        ind_inv = np.argsort(ind, axis=dim)
        result = np.take_along_axis(x, ind, axis=dim)
        ctx.mark_non_differentiable(ind, ind_inv)
        ctx.save_for_backward(ind, ind_inv)
        ctx.dim = dim
        return result, ind, ind_inv

    @staticmethod
    def backward(ctx, grad_output, _0, _1):
        ind, ind_inv = ctx.saved_tensors
        return np.take_along_axis(grad_output, ind_inv, axis=ctx.dim), None

    @staticmethod
    def vmap(info, in_dims, x, dim):
        x_bdim, _ = in_dims
        x = jnp.moveaxis(x, x_bdim, 0)
        logical_dim = dim if dim >= 0 else dim + x.ndim - 1
        return NumpySort.apply(x, logical_dim + 1), (0, 0, 0)


def test_pytorch_numpy_sort_vmap_rule_makes_one_host_call_per_batch(maybe_jit):
    xs = jnp.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0], [9.0, 7.0, 8.0]])
    NumpySort.calls.clear()
    out, ind, _ = maybe_jit(jax.vmap(lambda row: NumpySort.apply(row, 0)))(xs)
    np.testing.assert_array_equal(out, np.sort(np.asarray(xs), axis=1))
    np.testing.assert_array_equal(ind, np.argsort(np.asarray(xs), axis=1))
    rows = [shape for shape, probe in NumpySort.calls if not probe]
    assert rows and all(shape == (3, 3) for shape in rows)  # the whole batch at once, never one call per row


def test_pytorch_numpy_sort_gradients_under_vmap(maybe_jit):
    xs = jnp.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
    weights = jnp.array([1.0, 10.0, 100.0])

    def loss(row):
        return (NumpySort.apply(row, 0)[0] * weights).sum()

    want = jax.vmap(jax.grad(lambda row: (jnp.sort(row) * weights).sum()))(xs)
    _close(maybe_jit(jax.vmap(jax.grad(loss)))(xs), want)
    _close(maybe_jit(jax.grad(lambda xs: jax.vmap(loss)(xs).sum()))(xs), want)


# -- jvp --------------------------------------------------------------------------------------


def _clipped(ctx, g):
    """A backward that is not linear in grad_output (gradient clipping): forward mode can't be
    derived from it, and a jvp rule is used instead."""
    return jnp.clip(g, -1.0, 1.0) * jnp.cos(ctx.saved_tensors[0])


def _sin_forward(ctx, x):
    ctx.save_for_backward(x)
    ctx.save_for_forward(cos=jnp.cos(x))
    return jnp.sin(x)


clip_sin = jaxfn.autograd_function(
    _sin_forward, _clipped, jvp=lambda ctx, t: ctx.saved_variables.cos * t, name="clip_sin"
)


def test_jvp_and_backward_each_used_for_its_own_mode(maybe_jit):
    x, big = jnp.array([0.1, 0.2]), jnp.array([5.0, -5.0])
    # forward mode: the jvp rule, the true derivative
    _close(maybe_jit(lambda: jax.jvp(clip_sin, (x,), (big,)))(), jax.jvp(jnp.sin, (x,), (big,)))
    # reverse mode: backward, clipped
    _, pullback = jax.vjp(clip_sin, x)
    _close(pullback(big), (jnp.clip(big, -1, 1) * jnp.cos(x),))


def test_jvp_sees_one_tangent_per_argument_and_needs_input_grad():
    seen = {}

    def forward(ctx, params, x, n, scale):
        ctx.save_for_forward(x=x, w=params["w"])
        return params["w"] * x * scale + params["b"] + n

    def jvp(ctx, params_t, x_t, n_t, scale_t):
        seen.update(params=params_t, x=x_t, n=n_t, scale=scale_t, needs=tuple(ctx.needs_input_grad))
        s = ctx.saved_variables
        return (params_t["w"] * s.x + s.w * x_t) * 2.0 + params_t["b"]

    f = jaxfn.autograd_function(forward, lambda ctx, g: None, jvp=jvp, name="affine")
    params = {"w": jnp.array([1.0, 2.0]), "b": jnp.array([0.5, 0.5])}
    x = jnp.array([3.0, 4.0])
    out, tangent = jax.jvp(lambda x: f(params, x, jnp.int32(1), 2.0), (x,), (jnp.ones(2),))
    _close((out, tangent), jax.jvp(lambda x: params["w"] * x * 2.0 + params["b"] + 1, (x,), (jnp.ones(2),)))
    assert seen["n"] is None and seen["scale"] is None  # an integer array, a static float
    _close(seen["params"], {"w": jnp.zeros(2), "b": jnp.zeros(2)})  # not differentiated: zeros
    assert seen["needs"] == (False, True, False, False)


def test_jvp_gets_none_for_undifferentiated_inputs_without_materialized_grads():
    seen = []

    def forward(ctx, x, y):
        ctx.set_materialize_grads(False)
        ctx.save_for_forward(x, y)
        return x * y

    def jvp(ctx, x_t, y_t):
        seen.append((x_t is None, y_t is None))
        x, y = ctx.saved_tensors
        return (0.0 if x_t is None else x_t * y) + (0.0 if y_t is None else x * y_t)

    f = jaxfn.autograd_function(forward, lambda ctx, g: (g, g), jvp=jvp)
    _close(jax.jvp(lambda x: f(x, X), (X,), (X,))[1], X * X)
    assert seen == [(False, True)]


def test_jvp_reads_attributes_and_named_saves_of_a_multi_output_function(maybe_jit):
    def forward(ctx, x):
        ctx.power = 3
        ctx.save_for_forward(x=x)
        ctx.save_for_backward(x=x)
        n = jnp.int32(x.shape[0])
        ctx.mark_non_differentiable(n)
        return {"pow": x**ctx.power, "sin": jnp.sin(x), "n": n}

    def backward(ctx, g):
        x = ctx.saved_variables.x
        return g["pow"] * 3 * x**2 + g["sin"] * jnp.cos(x)

    def jvp(ctx, t):
        x = ctx.saved_variables.x
        return {"pow": ctx.power * x ** (ctx.power - 1) * t, "sin": jnp.cos(x) * t, "n": None}

    f = jaxfn.autograd_function(forward, backward, jvp=jvp)

    def plain(x):
        return {"pow": x**3, "sin": jnp.sin(x), "n": jnp.int32(3)}

    got = maybe_jit(lambda x: jax.jvp(f, (x,), (x + 1,)))(X)
    want = jax.jvp(plain, (X,), (X + 1,))
    _close(got[0], want[0])
    _close({k: got[1][k] for k in ("pow", "sin")}, {k: want[1][k] for k in ("pow", "sin")})
    _close(jax.jacfwd(lambda x: f(x)["pow"])(X), jax.jacfwd(lambda x: plain(x)["pow"])(X))
    _close(jax.hessian(lambda x: f(x)["sin"].sum())(X), jax.hessian(lambda x: plain(x)["sin"].sum())(X))


def test_jvp_and_vmap_through_the_autograd_function_form_and_pickling():
    def vmap(info, in_dims, x):
        return cube(jnp.moveaxis(x, in_dims[0], 0)), 0

    cube = jaxfn.autograd_function(
        lambda ctx, x: (ctx.save_for_backward(x), x**3)[1],
        lambda ctx, g: g * 3 * ctx.saved_tensors[0] ** 2,
        jvp=lambda ctx, t: 3 * ctx.saved_tensors[0] ** 2 * t if ctx.saved_tensors else None,
        vmap=vmap,
        name="cube",
    )
    again = pickle.loads(pickle.dumps(MyCube._jaxfn))
    _close(jax.jacfwd(lambda x: again(x)[0])(X), jax.jacfwd(lambda x: x**3)(X))
    _close(jax.vmap(jax.grad(lambda x: cube(x).sum()))(XS), 3 * XS**2)


def test_jit_true_compiles_a_function_with_rules():
    class Square(jaxfn.Function):
        jit = True

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            ctx.save_for_forward(x)
            return x * x

        @staticmethod
        def vjp(ctx, g):
            return 2 * ctx.saved_tensors[0] * g

        @staticmethod
        def jvp(ctx, t):
            return 2 * ctx.saved_tensors[0] * t

    _close(Square.apply(X), X * X)
    _close(jax.jvp(Square.apply, (X,), (X,)), (X * X, 2 * X * X))
    _close(jax.grad(lambda x: Square.apply(x).sum())(X), 2 * X)


def test_forward_mode_true_with_a_vmap_rule_derives_jvp_from_backward(maybe_jit):
    class Scale(jaxfn.Function):
        forward_mode = True

        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x=x, w=w)
            return jnp.sin(x) * w

        @staticmethod
        def backward(ctx, g):
            s = ctx.saved_variables
            return g * jnp.cos(s.x) * s.w, (g * jnp.sin(s.x)).sum()

        @staticmethod
        def vmap(info, in_dims, x, w):
            assert in_dims[1] is None
            return Scale.apply(jnp.moveaxis(x, in_dims[0], 0), w), 0

    w = jnp.array(2.0)

    def plain(x, w):
        return jnp.sin(x) * w

    _close(
        maybe_jit(jax.jacfwd(lambda w: jax.vmap(Scale.apply, in_axes=(0, None))(XS, w)))(w),
        jax.jacfwd(lambda w: jax.vmap(plain, in_axes=(0, None))(XS, w))(w),
    )
    _close(
        maybe_jit(jax.grad(lambda x, w: jax.vmap(Scale.apply, in_axes=(0, None))(x, w).sum(), (0, 1)))(XS, w),
        jax.grad(lambda x, w: jax.vmap(plain, in_axes=(0, None))(x, w).sum(), (0, 1))(XS, w),
    )
    _close(jax.hessian(lambda x: Scale.apply(x, w).sum())(X), jax.hessian(lambda x: plain(x, w).sum())(X))


# -- vmap ---------------------------------------------------------------------------------------


class Dot(jaxfn.Function):
    """A vmap rule that sees in_dims for two arguments and an unbatched one."""

    seen: list = []

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x=x, w=w)
        return jnp.dot(x, w), x.shape[0]

    @staticmethod
    def backward(ctx, g, _):
        s = ctx.saved_variables
        return g * s.w, g * s.x

    @staticmethod
    def vmap(info, in_dims, x, w):
        Dot.seen.append((info.batch_size, info.randomness, in_dims))
        x_dim, w_dim = in_dims
        x = jnp.moveaxis(x, x_dim, 0) if x_dim is not None else jnp.broadcast_to(x, (info.batch_size, *x.shape))
        if w_dim is None:
            return (x @ w, x.shape[1]), (0, None)
        return (jnp.einsum("bi,bi->b", x, jnp.moveaxis(w, w_dim, 0)), x.shape[1]), (0, None)


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (1, 0), (0, 1)])
def test_vmap_rule_gets_in_dims_and_its_gradient_comes_from_backward(maybe_jit, in_axes):
    x = XS if in_axes[0] != 1 else XS.T
    w = XS if in_axes[1] is not None else X
    w = w.T if in_axes[1] == 1 else w
    x = X if in_axes[0] is None else x

    def loss(x, w):
        return jax.vmap(lambda a, b: Dot.apply(a, b)[0], in_axes=in_axes)(x, w).sum()

    def plain(x, w):
        return jax.vmap(jnp.dot, in_axes=in_axes)(x, w).sum()

    Dot.seen.clear()
    out = maybe_jit(jax.vmap(Dot.apply, in_axes=in_axes))(x, w)
    _close(out[0], jax.vmap(jnp.dot, in_axes=in_axes)(x, w))
    np.testing.assert_array_equal(out[1], 3)  # a Python value in the output, unbatched
    assert Dot.seen == [(2, "error", in_axes)]
    _close(maybe_jit(jax.grad(loss, (0, 1)))(x, w), jax.grad(plain, (0, 1))(x, w))


def test_generate_vmap_rule_means_jax_batching():
    class Exp(jaxfn.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(ctx, x):
            y = jnp.exp(x)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            return g * ctx.saved_tensors[0]

    _close(jax.vmap(jax.grad(lambda x: Exp.apply(x).sum()))(XS), jnp.exp(XS))


def test_no_vmap_rule_batches_the_jvp_rule_and_backward():
    # MyCube has a jvp and no vmap: the batched call is its rules under jax.vmap
    _close(
        jax.vmap(lambda x: jax.jvp(MyCube.apply, (x,), (x,)))(XS),
        jax.vmap(lambda x: jax.jvp(plain_cube, (x,), (x,)))(XS),
    )
    _close(
        jax.grad(lambda w: jax.vmap(lambda x: MyCube.apply(x * w)[0].sum())(XS).sum())(2.0),
        jax.grad(lambda w: jax.vmap(lambda x: plain_cube(x * w)[0].sum())(XS).sum())(2.0),
    )


def test_export_and_sharded_jit():
    f = jax.jit(jax.grad(lambda x: MyCube.apply(x)[0].sum()))
    exported = jax.export.export(f)(X)
    _close(exported.call(X), 3 * X**2)
    _close(jax.export.deserialize(exported.serialize()).call(X), 3 * X**2)


SHARDED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from test_rules import MyCube, plain_cube
    assert jax.device_count() == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    x = jax.device_put(jnp.arange(16.0).reshape(8, 2) / 8, NamedSharding(mesh, P("data")))
    f = lambda x: jax.jvp(lambda x: MyCube.apply(x)[0].sum(), (x,), (x,))[1] + jax.grad(
        lambda x: MyCube.apply(x)[0].sum())(x).sum()
    g = lambda x: jax.jvp(lambda x: plain_cube(x)[0].sum(), (x,), (x,))[1] + jax.grad(
        lambda x: plain_cube(x)[0].sum())(x).sum()
    np.testing.assert_allclose(jax.jit(f)(x), g(x), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.vmap(lambda r: MyCube.apply(r)[1]))(x), 3 * x**2, rtol=1e-6)
    print("OK")
    """
)


@pytest.mark.slow
def test_sharded_jit_over_8_devices():
    result = run_on_8_devices(SHARDED, cwd=os.path.dirname(__file__))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("OK")


# -- gradcheck ------------------------------------------------------------------------------------


def test_gradcheck_checks_forward_ad_and_batched_grad():
    assert jaxfn.gradcheck(lambda x: MyCube.apply(x), X, check_forward_ad=True, check_batched_grad=True)
    assert jaxfn.gradcheck(clip_sin, jnp.array([0.1, 0.2]), check_forward_ad=True)


def test_gradcheck_names_a_wrong_jvp():
    wrong = jaxfn.autograd_function(
        _sin_forward,
        lambda ctx, g: g * jnp.cos(ctx.saved_tensors[0]),
        jvp=lambda ctx, t: ctx.saved_variables.cos * t * jnp.array([1.0, 1.0, 2.0]),
        name="wrong_jvp",
    )
    assert jaxfn.gradcheck(wrong, X, check_forward_ad=False)  # backward is right
    with pytest.raises(jaxfn.GradcheckError, match=r"gradient in forward mode \(jvp\) for 'x'.*worst at index \(2,\)"):
        jaxfn.gradcheck(wrong, X, check_forward_ad=True)


def test_gradcheck_names_a_wrong_vmap_rule():
    class Wrong(jaxfn.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

        @staticmethod
        def vmap(info, in_dims, x):
            return jnp.moveaxis(x, in_dims[0], 0) * 3, 0  # not forward's value

    with pytest.raises(jaxfn.GradcheckError, match=r"the output for output 0 under jax.vmap disagrees.*vmap rule"):
        jaxfn.gradcheck(Wrong.apply, X, check_batched_grad=True)


# -- misuse -------------------------------------------------------------------------------------


def _fwd(ctx, x):
    ctx.save_for_backward(x)
    return x * 2


def _bwd(ctx, g):
    return g * 2


def test_backward_and_vjp_both_defined_is_an_error():
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'Both': it defines both backward and vjp.*keep one"):

        class Both(jaxfn.Function):
            forward, backward, vjp = staticmethod(_fwd), staticmethod(_bwd), staticmethod(_bwd)


def test_vmap_with_generate_vmap_rule_is_an_error():
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'Twice': it sets generate_vmap_rule = True.*drop one"):

        class Twice(jaxfn.Function):
            generate_vmap_rule = True
            forward, backward = staticmethod(_fwd), staticmethod(_bwd)

            @staticmethod
            def vmap(info, in_dims, x):
                return x, 0


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(jvp=lambda ctx, t: t, forward_mode=True), r"'f': it has a jvp rule and forward_mode=True.*drop"),
        (dict(jvp=lambda *, t: t), r"'f': jvp must take the context as its first parameter"),
        (dict(vmap=3), r"'f': vmap must be a function vmap\(info, in_dims, \*args\), but got an int"),
    ],
)
def test_bad_rule_options(options, message):
    with pytest.raises(jaxfn.AutogradFunctionError, match=message):
        jaxfn.autograd_function(_fwd, _bwd, name="f", **options)


def test_forward_mode_without_a_jvp_rule_is_refused_in_jaxfn_words():
    f = jaxfn.autograd_function(_fwd, _bwd, vmap=lambda info, d, x: (x * 2, d[0]), name="f")
    _close(jax.grad(lambda x: f(x).sum())(X), 2 * jnp.ones(3))
    for forward_mode in (lambda: jax.jvp(f, (X,), (X,)), lambda: jax.linearize(f, X), lambda: jax.jacfwd(f)(X)):
        with pytest.raises(jaxfn.AutogradFunctionError, match=r"'f': it was differentiated in forward mode.*jvp"):
            forward_mode()


@pytest.mark.parametrize(
    "jvp, message",
    [
        (
            lambda ctx, t: t[:2],
            r"'f': jvp must return one tangent per output.*output 0 has shape \(2,\) where the output has \(3,\)",
        ),
        (
            lambda ctx, t: (t, t),
            r"'f': jvp must return one tangent per output, an array, but for output 0 it returned a tuple",
        ),
    ],
)
def test_a_wrong_jvp_result_is_named(jvp, message):
    f = jaxfn.autograd_function(_fwd, _bwd, jvp=jvp, name="f")
    with pytest.raises(jaxfn.AutogradFunctionError, match=message):
        jax.jvp(f, (X,), (X,))


def test_jvp_of_a_tuple_output_needs_a_tuple():
    f = jaxfn.autograd_function(lambda ctx, x: (x, x * 2), lambda ctx, a, b: a + 2 * b, jvp=lambda ctx, t: t, name="f")
    with pytest.raises(
        jaxfn.AutogradFunctionError, match=r"'f': forward returns 2 outputs, so jvp must return a tuple of 2"
    ):
        jax.jvp(f, (X,), (X,))


@pytest.mark.parametrize(
    "vmap, message",
    [
        (lambda info, d, x: x * 2, r"'f': vmap must return a pair \(outputs, out_dims\), as in PyTorch"),
        (
            lambda info, d, x: (x[0] * 2, 0),
            r"'f': vmap's output 0 must be forward's output \(3,\) with a batch axis of size 2",
        ),
        (lambda info, d, x: (x * 2, 2), r"'f': vmap's output 0 must be .* out_dim \(2\), but it has shape \(2, 3\)"),
        (lambda info, d, x: (x * 2, -3), r"'f': vmap's output 0 must be .* out_dim \(-3\), but it has shape \(2, 3\)"),
        (lambda info, d, x: (x[0, 0], 0), r"'f': vmap's output 0 must be .* out_dim \(0\), but it has shape \(\)"),
    ],
)
def test_a_wrong_vmap_result_is_named(vmap, message):
    f = jaxfn.autograd_function(_fwd, _bwd, vmap=vmap, name="f")
    with pytest.raises(jaxfn.AutogradFunctionError, match=message):
        jax.vmap(f)(XS)


def test_the_rules_benchmark_runs_and_its_contenders_agree():
    # benchmarks/rules.py checks that every contender trains the same and sorts the same
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    import rules

    per_step, hlo = rules.forward_mode_row(8, 1, 1)
    assert set(per_step) == set(rules.RELUS) and hlo["jaxfn jvp="] == hlo["hand-written hijax"]
    assert set(rules.host_vmap_row(4, 1, n=8)) == {"host, no vmap rule", "host, vmap rule"}


def test_a_jvp_result_in_another_structure_is_named():
    f = jaxfn.autograd_function(
        lambda ctx, x: {"a": x, "b": x * 2},
        lambda ctx, g: g["a"] + 2 * g["b"],
        jvp=lambda ctx, t: {"a": t, "c": t},
        name="f",
    )
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'f': jvp's tangent for output 0 must have that output's "):
        jax.jvp(f, (X,), (X,))


@pytest.mark.parametrize("rule", ["forward_mode", "jvp"])
def test_linearize_of_a_vmap_rule_function_with_an_integer_output(rule):
    """jax.linearize of a function with a vmap rule and a forward-mode rule whose outputs include
    an integer array: the tangent function gives the float output's tangent and the integer
    one's float0 zeros (it raised JAX's bare AssertionError: the integer output's symbolic zero is
    no array leaf; then JAX's own, a NumPy float0 array is no constant a program may hold)."""

    def forward(ctx, x, k):
        return x * 2, k * 2

    def vmap_rule(info, in_dims, x, k):
        return f(x, k), in_dims

    options = {"forward_mode": True} if rule == "forward_mode" else {"jvp": lambda ctx, tx, tk: (tx * 2, None)}
    f = jaxfn.autograd_function(forward, lambda ctx, g, gk: (g * 2, None), vmap=vmap_rule, name="f", **options)
    x, k, t = jnp.ones(3), jnp.arange(3), jnp.array([1.0, 2.0, 3.0])
    for transform in (lambda g: g, jax.jit):
        out, tangent_function = jax.linearize(transform(lambda x: f(x, k)[0]), x)
        np.testing.assert_allclose(tangent_function(t), 2 * t)
        np.testing.assert_allclose(out, 2 * x)
        # both outputs: the integer one's tangent is float0 zeros, as JAX gives for plain code
        (out, out_k), tangent_function = jax.linearize(transform(lambda x: f(x, k)), x)
        tangent, tangent_k = tangent_function(t)
        np.testing.assert_allclose(tangent, 2 * t)
        assert tangent_k.dtype == jax.dtypes.float0 and tangent_k.shape == k.shape
        np.testing.assert_array_equal(out_k, 2 * k)
