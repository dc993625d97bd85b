"""host=True: NumPy/SciPy forward and backward through jax.pure_callback, under jit, grad and vmap."""

import datetime
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from seeds import StaticNode

import jaxfn


def _jv_forward(ctx, x, order):
    assert isinstance(x, np.ndarray)  # host code sees NumPy arrays
    ctx.save_for_backward(x=x)
    ctx.order = order
    return scipy.special.jv(order, x)  # Bessel J of real order: JAX has no such function


def _jv_backward(ctx, grad_output):
    assert isinstance(grad_output, np.ndarray)
    return {"x": grad_output * scipy.special.jvp(ctx.order, ctx.saved_variables.x)}


bessel_jv = jaxfn.autograd_function(_jv_forward, _jv_backward, host=True, name="bessel_jv")
X = jnp.linspace(0.5, 6.0, 7)


def _reference(x, order=1.5, derivative=False):
    f = scipy.special.jvp if derivative else scipy.special.jv
    return f(order, np.asarray(x))


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit])
def test_values_and_gradients_under_jit(transform):
    np.testing.assert_allclose(transform(lambda x: bessel_jv(x, 1.5))(X), _reference(X), rtol=1e-12)
    grad = transform(jax.grad(lambda x: bessel_jv(x, 1.5).sum()))(X)
    np.testing.assert_allclose(grad, _reference(X, derivative=True), rtol=1e-12)


def test_vmap_calls_the_host_once_per_element():
    got = jax.vmap(lambda x: bessel_jv(x, 2.5))(X.reshape(7, 1))
    np.testing.assert_allclose(got.ravel(), _reference(X, 2.5), rtol=1e-12)
    grads = jax.jit(jax.vmap(jax.grad(lambda x: bessel_jv(x, 2.5))))(X)
    np.testing.assert_allclose(grads, _reference(X, 2.5, derivative=True), rtol=1e-12)


def test_gradcheck_against_finite_differences():
    assert jaxfn.gradcheck(lambda x: bessel_jv(x, 0.7), X)
    wrong = jaxfn.autograd_function(
        _jv_forward, lambda ctx, g: {"x": g * scipy.special.jv(ctx.order, ctx.saved_variables.x)}, host=True
    )
    assert not jaxfn.gradcheck(lambda x: wrong(x, 0.7), X, raise_exception=False)


def test_second_derivative_is_refused_in_jaxfn_words():
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'bessel_jv': it runs code on the host"):
        jax.grad(lambda x: jax.grad(lambda x: bessel_jv(x, 1.5).sum())(x).sum())(X)


class Stats(jaxfn.Function):
    """Two outputs, one marked non-differentiable, and a Python number saved on ctx."""

    host = True

    @staticmethod
    def forward(ctx, x, w):
        count = int(np.sum(x > 0))
        ctx.save_for_backward(x, w)
        ctx.count = count
        out = np.tanh(x) * w
        ctx.mark_non_differentiable(count)
        return out, count

    @staticmethod
    def backward(ctx, grad_out, grad_count):
        assert not np.any(grad_count) and isinstance(ctx.count, int)  # a count computed on the host: an array
        x, w = ctx.saved_tensors
        return grad_out * w * (1 - np.tanh(x) ** 2), (grad_out * np.tanh(x)).sum(0)


def test_class_style_two_parameters_broadcast_gradient_and_python_values():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 3)))
    w = jnp.asarray([0.5, -1.0, 2.0])
    grads = jax.jit(jax.grad(lambda x, w: Stats.apply(x, w)[0].sum(), (0, 1)))(x, w)
    want = jax.grad(lambda x, w: (jnp.tanh(x) * w).sum(), (0, 1))(x, w)
    for g, r in zip(grads, want):
        np.testing.assert_allclose(g, r, rtol=1e-12)
    out, count = Stats.apply(x, w)
    assert int(count) == int(np.sum(np.asarray(x) > 0))


def test_declared_output_is_checked():
    spec = jax.ShapeDtypeStruct((7,), jnp.float64)
    declared = jaxfn.autograd_function(_jv_forward, _jv_backward, host=True, output=spec, name="declared")
    np.testing.assert_allclose(declared(X, 1.5), _reference(X), rtol=1e-12)
    wrong = jaxfn.autograd_function(
        _jv_forward, _jv_backward, host=True, output=jax.ShapeDtypeStruct((3,), jnp.float64), name="wrong_output"
    )
    with pytest.raises(
        jaxfn.AutogradFunctionError, match=r"'wrong_output': output= declares \[\(\(3,\), 'float64'\)\]"
    ):
        wrong(X, 1.5)


def test_host_forward_must_return_numbers():
    f = jaxfn.autograd_function(lambda ctx, x: "text", lambda ctx, g: None, host=True, name="texty")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'texty': a host forward \(host=True\) must return NumPy"):
        f(X)


def test_host_with_forward_mode_is_refused():
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'f': host=True runs NumPy code"):
        jaxfn.autograd_function(_jv_forward, _jv_backward, host=True, forward_mode=True, name="f")


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_python_value_forward_computes_from_the_data_is_this_calls_own(transform):
    """A branch forward took, saved on ctx, reaches backward as this call saved it (it is kept per
    call on the host), never as the probe run saved it, also under jit(grad)."""

    def forward(ctx, x):
        ctx.branch = "pos" if x.sum() > 0 else "neg"
        ctx.save_for_backward(x=x)
        return x**2 if x.sum() > 0 else x**3

    def backward(ctx, g):
        x = ctx.saved_variables.x
        return g * (2 * x if ctx.branch == "pos" else 3 * x**2)

    f = jaxfn.autograd_function(forward, backward, host=True, name="branchy")
    grad = transform(jax.grad(lambda x: f(x).sum()))
    np.testing.assert_allclose(grad(jnp.array([-1.0, -2.0])), [3.0, 12.0])  # the "neg" branch: 3 x**2
    np.testing.assert_allclose(grad(jnp.array([1.0, 2.0])), [2.0, 4.0])  # the "pos" branch: 2 x


def test_saved_python_numbers_come_back_exactly_without_x64():
    seen = []

    def forward(ctx, x):
        ctx.big, ctx.tenth = 2**40 + 1, 0.1
        return x * 2

    def backward(ctx, g):
        seen.append((ctx.big, ctx.tenth))
        return g * 2

    f = jaxfn.autograd_function(forward, backward, host=True, name="exact")
    with jax.enable_x64(False):
        jax.grad(lambda x: f(x).sum())(jnp.ones(2, jnp.float32))
    assert seen == [(2**40 + 1, 0.1)]


def test_a_forward_that_fails_on_ones_is_probed_again_and_values_dependent_shapes_are_refused():
    solve = jaxfn.autograd_function(
        lambda ctx, a, b: np.linalg.solve(a, b), lambda ctx, g: None, host=True, name="solve"
    )
    a = jnp.array([[2.0, 1.0], [0.5, 3.0]])
    np.testing.assert_allclose(solve(a, jnp.ones(2)), np.linalg.solve(np.asarray(a), np.ones(2)), rtol=1e-12)
    positive = jaxfn.autograd_function(lambda ctx, x: x[x > 0], lambda ctx, g: {}, host=True, name="positive")
    x = jnp.array([1.0, -1.0, 2.0])
    np.testing.assert_array_equal(positive(x), [1.0, 2.0])  # eagerly, forward runs on the values themselves
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'positive': under a JAX transformation .* returned shape \(3,\), but on this call's values it "
        r"returned shape \(2,\): the output's shape depends on the input values .* jnp.nonzero\(mask, size=n",
    ):
        jax.grad(lambda x: positive(x).sum())(x)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"'positive': under a JAX transformation"):
        jax.jit(positive)(x)


def test_saved_numpy_values_cross_to_backward_exactly_without_x64():
    """float64 arrays and NumPy scalars saved on ctx are not narrowed to 32 bits on the way."""
    seen = []

    def forward(ctx, x):
        wide = np.asarray(x, np.float64)
        ctx.save_for_backward(x=wide, e=np.exp(-wide * wide))  # exp(-144) underflows float32
        ctx.n, ctx.tiny, ctx.flag = np.int64(3_000_000_000), np.float64(1e-50), np.bool_(True)
        return np.log(np.exp(-wide * wide) + 1e-300).astype(x.dtype)  # -x**2

    def backward(ctx, g):
        s = ctx.saved_variables
        seen.append((ctx.n, ctx.tiny, ctx.flag, s.x.dtype))
        return {"x": g * (-2 * s.x * np.exp(-(s.x**2)) / s.e)}

    f = jaxfn.autograd_function(forward, backward, host=True, name="wide")
    x = jnp.array([1.0, 12.0], jnp.float32)
    with jax.enable_x64(False):
        grad = jax.grad(lambda x: f(x).sum())(x)
    np.testing.assert_allclose(grad, jax.grad(lambda x: -(x**2).sum())(x), rtol=1e-6)
    ((n, tiny, flag, dtype),) = seen
    assert (type(n), n, type(tiny), tiny, type(flag), flag, dtype) == (
        np.int64,
        3_000_000_000,
        np.float64,
        1e-50,
        np.bool_,
        True,
        np.float64,
    )


def test_a_saved_array_whose_dtype_changes_is_refused():
    def forward(ctx, x):
        ctx.save_for_backward(x=x if x.sum() > 0 else x.astype(np.float16))
        return x * 2

    f = jaxfn.autograd_function(forward, lambda ctx, g: 2 * g, host=True, name="drift")
    with pytest.raises(
        jaxfn.AutogradFunctionError, match=r"'drift': a host forward \(host=True\) must give each saved"
    ):
        jax.grad(lambda x: f(x).sum())(jnp.array([-1.0, -2.0]))


def _product(ctx, p):
    ctx.save_for_backward(b=p["b"])
    return p["a"] * p["b"]


@pytest.mark.parametrize("host", [False, True])
def test_host_gradients_are_read_as_any_backward_s(host):
    """A missing dict key is no gradient; a static argument's needs_input_grad is False."""
    flags = []

    def backward(ctx, g):
        flags.append(tuple(ctx.needs_input_grad))
        return {"p": {"a": g * ctx.saved_variables.b}}

    f = jaxfn.autograd_function(_product, backward, host=host, name="product")
    p = {"a": jnp.ones(2), "b": jnp.full(2, 3.0)}
    grad = jax.grad(lambda p: f(p).sum())(p)
    np.testing.assert_array_equal(grad["a"], [3.0, 3.0])
    np.testing.assert_array_equal(grad["b"], [0.0, 0.0])
    assert flags == [(True,)]

    def scaled(ctx, x, c):
        return x * c

    def scaled_backward(ctx, g):
        flags.append(tuple(ctx.needs_input_grad))
        return g * 2.0, None

    g = jaxfn.autograd_function(scaled, scaled_backward, host=host, name="scaled")
    np.testing.assert_array_equal(jax.grad(lambda x: g(x, 2.0).sum())(jnp.ones(2)), [2.0, 2.0])
    assert flags[-1] == (True, False)


@pytest.mark.parametrize("host", [False, True])
@pytest.mark.parametrize(
    "returned, message",
    [
        (lambda g: (g, 1.0), r"for 'c', but it is a static argument"),
        (lambda g: (g * 1j, None), r"for 'x' with complex dtype complex\d+, but 'x' is real"),
        (lambda g: (np.ones(2, np.int32), None), r"for 'x' with dtype int32, but 'x' has dtype float32"),
        (lambda g: (np.array([1, "a"], dtype=object), None), r"for 'x' with dtype object, but 'x' has dtype float32"),
        (lambda g: ((g, g), None), r"a tuple as the gradient for 'x', but a gradient must be an array"),
    ],
)
def test_host_gradients_are_checked_as_any_backward_s(host, returned, message):
    def forward(ctx, x, c):
        return x * c

    f = jaxfn.autograd_function(forward, lambda ctx, g: returned(g), host=host, name="checked")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'checked': backward returned (a gradient )?" + message):
        jax.grad(lambda x: f(x, 2.0).sum())(jnp.ones(2, jnp.float32))


def test_objects_saved_on_ctx_are_kept_per_call_and_other_numpy_values_cross_exactly():
    def keeps(ctx, x):
        ctx.ns = types.SimpleNamespace(v=x * 2)  # data of this call inside an object: kept per call
        return x**2

    f = jaxfn.autograd_function(keeps, lambda ctx, g: g * ctx.ns.v, host=True, name="keeps")
    x = jnp.arange(3.0)
    for grad in (jax.grad, lambda h: jax.jit(jax.grad(h))):
        np.testing.assert_allclose(grad(lambda x: f(x).sum())(x), 2 * x)
    np.testing.assert_allclose(jax.jacrev(f)(x), np.diag(2 * x))  # one backward per row, one object
    np.testing.assert_allclose(jax.vmap(jax.grad(lambda x: f(x).sum()))(x[:, None] + 1), 2 * (x[:, None] + 1))
    _, pullback = jax.vjp(f, x)
    pullback(jnp.ones(3))
    jax.grad(lambda x: f(x).sum())(x)  # another call: the first call's object is freed, as PyTorch frees it
    freed = (jaxfn.AutogradFunctionError, jax.errors.JaxRuntimeError, ValueError)  # the pullback may run compiled
    with pytest.raises(freed, match=r"'keeps': its host backward .* that object was freed"):
        pullback(jnp.ones(3))
    seen = []

    def labels(ctx, x):
        ctx.names, ctx.when = np.array(["a", "bc"]), np.array(["2026-11-23"], dtype="datetime64[D]")
        ctx.record = np.array([(1, 2.5)], dtype=[("i", "<i4"), ("f", "<f8")])
        return x * 2

    def backward(ctx, g):
        seen.append((ctx.names, ctx.when, ctx.record))
        return g * 2

    g = jaxfn.autograd_function(labels, backward, host=True, name="labels")
    jax.grad(lambda x: g(x).sum())(jnp.ones(2))
    ((names, when, record),) = seen
    assert names.tolist() == ["a", "bc"] and when.tolist() == [datetime.date(2026, 11, 23)]
    assert record.dtype.names == ("i", "f") and record.tolist() == [(1, 2.5)]


def test_a_saved_array_wider_than_the_probe_s_is_refused_without_x64():
    def forward(ctx, x):
        ctx.v = x.astype(np.int64) * 3_000_000_000 if x[0] > 1 else x.astype(np.int32)  # ones: int32
        return x * 1.0

    f = jaxfn.autograd_function(forward, lambda ctx, g: g, host=True, name="widens")
    with jax.enable_x64(False):
        with pytest.raises(jaxfn.AutogradFunctionError, match=r"'widens': .* saved value the same dtype .* int64"):
            jax.grad(lambda x: f(x).sum())(jnp.full(2, 2.0, jnp.float32))


# -- exceptions raised in host code reach the caller as themselves ------------------------------
class HostFailure(Exception):
    """A user's own exception class."""


_LONG = "the input is out of range:\n" + "\n".join(f"  element {i} is too large" for i in range(40))


def _raising(forward_error=None, backward_error=None):
    """A host function whose forward raises ``forward_error`` for inputs above 10 (a probe on ones or
    normals passes), and whose backward raises ``backward_error``."""

    def forward(ctx, x):
        if forward_error is not None and x.max() > 10:
            raise forward_error
        ctx.save_for_backward(x=x)
        return x * 3

    def backward(ctx, g):
        if backward_error is not None:
            raise backward_error
        return g * 3

    return jaxfn.autograd_function(forward, backward, host=True, name="raising")


@pytest.mark.parametrize("make", [lambda: ValueError(_LONG), lambda: HostFailure("custom\nmessage"), KeyboardInterrupt])
@pytest.mark.parametrize(
    "call",
    [
        lambda f, x: f(x),
        lambda f, x: jax.grad(lambda x: f(x).sum())(x),
        lambda f, x: jax.vjp(f, x),
        lambda f, x: jax.vmap(f)(x[None]),
    ],
    ids=["eager", "grad", "vjp", "vmap"],
)
def test_an_exception_in_host_forward_is_raised_as_itself(make, call, request):
    raised = make()
    f = _raising(forward_error=raised)
    if "vmap" in request.node.callspec.id and os.environ.get("JAX_CUSTOM_VJP3", "").lower() in ("1", "true"):
        # with jax_custom_vjp3 on, JAX batches the call into a program it runs later, as under jit
        with pytest.raises(jax.errors.JaxRuntimeError, match=type(raised).__name__):
            call(f, jnp.full(3, 20.0))
        return
    with pytest.raises(type(raised)) as caught:
        call(f, jnp.full(3, 20.0))
    assert caught.value is raised and str(caught.value) == str(raised)


@pytest.mark.parametrize("make", [lambda: ValueError(_LONG), lambda: HostFailure("custom\nmessage"), KeyboardInterrupt])
@pytest.mark.parametrize(
    "call",
    [
        lambda f, x: jax.grad(lambda x: f(x).sum())(x),
        lambda f, x: jax.vjp(f, x)[1](jnp.ones_like(x)),
        lambda f, x: jax.vmap(jax.grad(lambda x: f(x).sum()))(x[None]),
    ],
    ids=["grad", "vjp", "vmap-grad"],
)
def test_an_exception_in_host_backward_is_raised_as_itself_without_jit(make, call):
    raised = make()
    f = _raising(backward_error=raised)
    with pytest.raises(type(raised)) as caught:
        call(f, jnp.ones(3))
    assert caught.value is raised and str(caught.value) == str(raised)
    np.testing.assert_array_equal(jax.grad(lambda x: _raising()(x).sum())(jnp.ones(3)), [3.0, 3.0, 3.0])


def test_under_jit_jax_reports_a_host_exception_at_the_call_with_its_message():
    """Under jax.jit the host code runs when the compiled program runs, outside jaxfn: JAX raises its
    JaxRuntimeError there, whose text holds the host code's exception and message."""
    f = _raising(backward_error=HostFailure("custom message"))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"HostFailure: custom message"):
        jax.jit(jax.grad(lambda x: f(x).sum()))(jnp.ones(3))


def test_a_forward_that_fails_on_every_probe_raises_its_own_exception():
    raised = HostFailure("always")

    def forward(ctx, x):
        raise raised

    f = jaxfn.autograd_function(forward, lambda ctx, g: g, host=True, name="always")
    for call in (f, jax.jit(f), jax.grad(lambda x: f(x).sum())):
        with pytest.raises(HostFailure) as caught:
            call(jnp.ones(2))
        assert caught.value is raised


def test_a_forward_that_fails_differently_on_both_probes_is_refused_naming_both():
    def forward(ctx, x):
        raise ValueError(f"no good at {float(x.flat[0]):.3f}")

    f = jaxfn.autograd_function(forward, lambda ctx, g: g, host=True, name="picky")
    with pytest.raises(ValueError, match=r"^no good at 2\.000$"):
        f(jnp.full(2, 2.0))  # eager: the call's own exception, before any probe
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'picky': under a JAX transformation a host forward \(host=True\) is run once .* "
        r"failed on both \(ValueError: no good at "
        r"1\.000; ValueError: no good at",
    ):
        jax.grad(lambda x: f(x).sum())(jnp.full(2, 2.0))


def test_exceptions_stay_with_their_thread():
    import threading

    def backward(ctx, g):
        raise HostFailure(ctx.tag)

    def forward(ctx, x, tag):
        ctx.tag = tag
        return x * 2

    f = jaxfn.autograd_function(forward, backward, host=True, name="threads")
    caught = {}

    def run(tag):
        for _ in range(20):
            try:
                jax.grad(lambda x: f(x, tag).sum())(jnp.ones(3))
            except HostFailure as err:
                caught.setdefault(tag, set()).add(str(err))

    threads = [threading.Thread(target=run, args=(tag,)) for tag in ("a", "b", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert caught == {"a": {"a"}, "b": {"b"}, "c": {"c"}}


# -- the builder: no plumbing in ctx, one run per call, exact saves --------------------------------
def test_backward_s_ctx_holds_only_what_forward_set():
    seen = {}

    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        ctx.scale = 2.0
        return x * w * 2.0

    def backward(ctx, g):
        seen["names"] = [n for n in dir(ctx) if not n.startswith("_")]
        seen["attrs"] = {n: hasattr(ctx, n) for n in ("probe", "args", "flags", "input_specs", "scale")}
        seen["saved"] = (len(ctx.saved_tensors), dict(ctx.saved_variables), tuple(ctx.needs_input_grad))
        x, w = ctx.saved_tensors
        return g * w * ctx.scale, g * x * ctx.scale

    host = jaxfn.autograd_function(forward, backward, host=True, name="clean")
    x, w = jnp.arange(1.0, 4.0), jnp.full(3, 0.5)
    grads = jax.jit(jax.grad(lambda x, w: host(x, w).sum(), (0, 1)))(x, w)
    want = jax.grad(lambda x, w: (x * w * 2.0).sum(), (0, 1))(x, w)
    for g, r in zip(grads, want):
        np.testing.assert_allclose(g, r, rtol=1e-12)
    plain = jaxfn.autograd_function(forward, backward, name="plain")
    host_seen = dict(seen)
    jax.grad(lambda x, w: plain(x, w).sum(), (0, 1))(x, w)
    assert host_seen["names"] == seen["names"]
    assert host_seen["attrs"] == {"probe": False, "args": False, "flags": False, "input_specs": False, "scale": True}
    assert host_seen["saved"] == (2, {}, (True, True))


def test_eager_calls_run_forward_once_on_numpy_without_a_callback_and_return_jax_arrays():
    calls = []

    def forward(ctx, x, n):
        calls.append(type(x))
        return {"y": x * 2, "count": np.int64(n), "pair": (x.sum(), 1.5)}

    f = jaxfn.autograd_function(forward, lambda ctx, g: None, host=True, name="eager")
    x = jnp.arange(3.0)
    out = f(x, 3)  # the first call of a signature also probes forward once
    calls.clear()
    out = f(x, 3)
    assert calls == [np.ndarray]
    traced = jax.jit(lambda x: f(x, 3))(x)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(traced)
    for got, want in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(traced)):
        assert isinstance(got, jax.Array) and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_saved_float64_crosses_exactly_with_x64_off_under_jit_and_vmap():
    """1 + 2**-40 is not a float32: a narrowing on the way would make backward see 1.0."""
    seen = []

    def forward(ctx, x):
        ctx.save_for_backward(fine=np.full(x.shape, 1 + 2.0**-40, np.float64))
        return x * 2

    def backward(ctx, g):
        fine = ctx.saved_variables.fine
        seen.append((fine.dtype, float(fine[0]) - 1.0))
        return g * 2

    f = jaxfn.autograd_function(forward, backward, host=True, name="fine")
    with jax.enable_x64(False):
        x = jnp.ones((2, 3), jnp.float32)
        grads = jax.jit(jax.vmap(jax.grad(lambda x: f(x).sum())))(x)
    np.testing.assert_array_equal(grads, np.full((2, 3), 2.0, np.float32))
    assert seen == [(np.float64, 2.0**-40)] * 2


def test_vmap_jit_and_grad_agree_with_the_plain_math_and_backward_runs():
    ran = []

    def forward(ctx, x, w):
        ctx.save_for_backward(x=x, w=w)
        return np.tanh(x @ w)

    def backward(ctx, g):
        ran.append(tuple(ctx.needs_input_grad))
        s = ctx.saved_variables
        local = g * (1 - np.tanh(s.x @ s.w) ** 2)
        return {"x": np.outer(local, s.w) if s.x.ndim == 1 else local[..., None] * s.w, "w": s.x.T @ local}

    f = jaxfn.autograd_function(forward, backward, host=True, name="layer")
    xs = jnp.asarray(np.random.default_rng(1).standard_normal((5, 4)))
    w = jnp.asarray(np.random.default_rng(2).standard_normal(4))
    loss = lambda w, xs: jax.vmap(lambda x: f(x[None], w))(xs).sum()  # noqa: E731
    plain = lambda w, xs: jax.vmap(lambda x: jnp.tanh(x[None] @ w))(xs).sum()  # noqa: E731
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(w, xs), jax.grad(plain)(w, xs), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(loss, (0, 1))(w, xs)[1], jax.grad(plain, 1)(w, xs), rtol=1e-12)
    assert ran and set(ran) <= {(False, True), (True, True)}


def test_mark_dirty_accepts_the_host_forward_s_own_inputs():
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x + 1

    f = jaxfn.autograd_function(forward, lambda ctx, g: g, host=True, name="dirty")
    np.testing.assert_array_equal(jax.grad(lambda x: f(x).sum())(jnp.ones(2)), [1.0, 1.0])


def test_gradcheck_of_a_host_function_leaves_out_its_non_differentiable_output():
    """gradcheck asks the function which outputs carry a gradient: for a host function the probe
    answers (forward's NumPy code never sees a tracer)."""

    def forward(ctx, x):
        ctx.save_for_backward(x=x)
        above = (x > 1).astype(np.float64)
        ctx.mark_non_differentiable(above)
        return np.sinh(x), above

    def backward(ctx, grad_out, grad_above):
        assert not np.any(grad_above)
        return grad_out * np.cosh(ctx.saved_variables.x)

    f = jaxfn.autograd_function(forward, backward, host=True, name="sinh")
    assert f.output_differentiable(X) == (True, False)
    assert jaxfn.gradcheck(f, X)
    np.testing.assert_allclose(jax.grad(lambda x: f(x)[0].sum())(X), jnp.cosh(X), rtol=1e-12)


def test_a_host_forward_writing_into_its_dict_argument_is_refused():
    """The host builder runs forward through the rule's own forward_with_context, so a write into
    a container argument (which would never reach the caller) is refused as for any forward."""

    def forward(ctx, d):
        d["extra"] = d["x"] * 2
        return d["x"] * 3

    f = jaxfn.autograd_function(forward, lambda ctx, g: {"d": {"x": g * 3}}, host=True, name="writes")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'writes': forward must leave its arguments as it"):
        f({"x": jnp.ones(2)})


def test_host_combines_with_setup_context_and_a_jvp_rule():
    """A NumPy Function in PyTorch 2's form with its own jvp ports as it is (autograd_function_db's NumpyCube)."""
    called = []

    class Cube(jaxfn.Function):
        host = True

        @staticmethod
        def forward(x):
            assert isinstance(x, np.ndarray)
            return x**3, 3 * x**2

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0], output[1])
            ctx.save_for_forward(inputs[0], output[1])

        @staticmethod
        def backward(ctx, grad_output, grad_saved):
            x, dx = ctx.saved_tensors
            called.append("backward")
            return grad_output * dx + 6 * grad_saved * x

        @staticmethod
        def jvp(ctx, tangent):
            assert isinstance(tangent, np.ndarray)
            x, dx = ctx.saved_tensors
            called.append("jvp")
            return tangent * dx, 6 * tangent * x

    x = jnp.arange(1.0, 4.0)
    for wrap in (lambda g: g, jax.jit):
        np.testing.assert_allclose(wrap(jax.grad(lambda x: Cube.apply(x)[0].sum()))(x), 3 * x**2)
        np.testing.assert_allclose(wrap(jax.jacfwd(lambda x: Cube.apply(x)[1]))(x), np.diag(6 * x))
        np.testing.assert_allclose(
            wrap(jax.vmap(jax.grad(lambda x: Cube.apply(x)[0].sum())))(x[:, None]), 3 * x[:, None] ** 2
        )
    assert {"backward", "jvp"} <= set(called)


def test_under_jit_grad_a_host_forward_runs_even_when_its_output_is_unused():
    """jax.jit(jax.grad(f)) uses no output of forward: its callback still runs (backward's
    depends on it), so its errors are raised and backward reads this call's saves, not the probe's."""

    def forward(ctx, x):
        ctx.extra = None if x.max() <= 1 else 5.0  # data-dependent structure: None on the probe's ones
        return x * 2

    def backward(ctx, g):
        return g * (2.0 if ctx.extra is None else ctx.extra)

    f = jaxfn.autograd_function(forward, backward, name="f", host=True)
    x = jnp.array([0.5, 2.0, 2.0])
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"'f': a host forward \(host=True\) must save the same"):
        jax.jit(jax.grad(lambda x: f(x).sum()))(x)

    def failing(ctx, x):
        if x.max() > 1:
            raise HostFailure("domain error in forward")
        return x * 2

    g = jaxfn.autograd_function(failing, lambda ctx, g: g * 2, name="g", host=True)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"HostFailure: domain error in forward"):
        jax.jit(jax.grad(lambda x: g(x).sum()))(x)
    np.testing.assert_array_equal(jax.jit(jax.grad(lambda x: g(x).sum()))(jnp.ones(3) * 0.5), [2.0, 2.0, 2.0])


def test_under_jit_grad_a_host_forward_saving_only_zero_size_arrays_still_runs():
    def forward(ctx, x):
        if (x < 0).any():
            raise HostFailure("forward refuses negative input")
        ctx.save_for_backward(e=np.zeros((0,), np.float32))  # carries no data: XLA could drop it
        return np.sin(x)

    f = jaxfn.autograd_function(forward, lambda ctx, g: g * 2.0, name="h", host=True)
    grad = jax.jit(jax.grad(lambda x: f(x).sum()))
    np.testing.assert_array_equal(grad(jnp.ones(4)), [2.0] * 4)
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError), match=r"HostFailure: forward refuses negative"):
        grad(-jnp.ones(4))  # (JAX raises it as a ValueError here on jax 0.10)


def test_jax_export_of_a_host_function_is_refused_naming_it():
    hsin = jaxfn.autograd_function(lambda ctx, x: np.sin(x), lambda ctx, g: {}, host=True, name="hsin")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'hsin': it runs code on the host .* jax.export serializes"):
        jax.export.export(jax.jit(lambda x: hsin(x) * 2))(jax.ShapeDtypeStruct((3,), jnp.float32))
    np.testing.assert_allclose(jax.jit(hsin)(jnp.ones(3)), np.sin(np.ones(3)), rtol=1e-6)  # a plain jit is fine
    # symbolic shapes: refused before the probe (which would meet a symbolic dimension in NumPy)
    symbolic = jax.ShapeDtypeStruct(jax.export.symbolic_shape("n"), jnp.float32)
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'hsin': it runs code on the host .* jax.export serializes"):
        jax.export.export(jax.jit(hsin))(symbolic)


def test_a_probe_that_fails_says_what_jaxfn_ran():
    def forward(ctx, x, n, mode="a"):
        if np.all(x == 1):
            raise ValueError("all ones")
        if np.any(x < 0):
            raise ValueError("negative")
        return np.sin(x) * n

    picky = jaxfn.autograd_function(forward, lambda ctx, g: {}, host=True, name="picky")
    np.testing.assert_allclose(picky(jnp.zeros(3), 2), np.zeros(3))  # eagerly: forward runs on the values given
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'picky': .* jaxfn ran forward\(x=ones\(\(3,\), float\d+\), n=2, mode='a'\), then "
        r"forward\(x=normal\(\(3,\), float\d+\), n=2, mode='a'\) .* \(ValueError: all ones; ValueError: negative\)",
    ):
        jax.jit(picky, static_argnums=1)(jnp.zeros(3), 2)


def test_a_forward_that_needs_valid_data_fails_on_the_probe_with_its_own_exception_and_a_note():
    chol = jaxfn.autograd_function(lambda ctx, a: np.linalg.cholesky(a), lambda ctx, g: g, host=True, name="chol")
    a = jnp.array([[4.0, 1.0], [1.0, 3.0]])
    np.testing.assert_allclose(chol(a), np.linalg.cholesky(np.asarray(a)), rtol=1e-6)  # eagerly: the values given
    with pytest.raises(np.linalg.LinAlgError) as caught:
        jax.jit(chol)(a)
    (note,) = [n for n in caught.value.__notes__ if n.startswith("jaxfn:")]
    assert "jaxfn: 'chol': this was raised by the host forward (host=True) on example arrays jaxfn made" in note
    assert "forward(a=ones((2, 2), float" in note and "catch the error and return zeros" in note


def test_a_numpy_vmap_rule_of_a_host_function_under_jit_says_the_rule_is_jax_code():
    f = jaxfn.autograd_function(
        lambda ctx, x: np.sin(x),
        lambda ctx, g: g,
        host=True,
        name="hv",
        vmap=lambda info, in_dims, x: (np.sin(x), in_dims[0]),
    )
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'hv': vmap handed an array to NumPy .* a vmap rule runs "
        r"as JAX code on the batched arrays, a host=True function's too .* call the function itself",
    ):
        jax.jit(jax.vmap(f))(jnp.ones((2, 3)))


def test_a_host_argument_whose_pytree_static_data_is_unhashable_is_probed_each_call():
    """A host function's probe is kept per call signature; a signature with no key (a node's
    unhashable static data) is probed again on each call (it raised TypeError: unhashable type)."""

    def forward(ctx, node):
        ctx.save_for_backward(x=node.value)
        return np.sin(node.value)

    def backward(ctx, grad):
        return {"node": StaticNode(grad * np.cos(ctx.saved_variables.x), {"a": 1})}

    h = jaxfn.autograd_function(forward, backward, host=True, name="h")
    x = jnp.array([0.5, 1.0])
    np.testing.assert_allclose(jax.jit(lambda x: h(StaticNode(x, {"a": 1})))(x), np.sin(x), rtol=1e-6)
    grad = jax.grad(lambda x: h(StaticNode(x, {"a": 1})).sum())(x)
    np.testing.assert_allclose(grad, np.cos(x), rtol=1e-6)


@pytest.mark.parametrize(
    "call",
    [
        lambda f, x, keys: f(x, keys),
        lambda f, x, keys: jax.jit(f)(x, keys),
        lambda f, x, keys: jax.grad(lambda x: f(x, keys).sum())(x),
    ],
    ids=["eager", "jit", "grad"],
)
def test_a_prng_key_array_for_host_code_is_refused_naming_the_argument(call):
    """NumPy has no form for JAX's key dtype: refused in jaxfn's words (not NumPy's TypeError or
    JAX's internal dtype error), naming the argument inside its pytree; key data passes."""

    def forward(ctx, x, keys):
        ctx.save_for_backward(x)
        return x * 2

    f = jaxfn.autograd_function(forward, lambda ctx, g: (2 * g, None), host=True, name="noisy")
    x = jnp.ones(3)
    refused = r"^jaxfn: 'noisy': argument 'keys\['b'\]' is an array of JAX's own dtype key<fry> .*key_data\(key\)"
    with pytest.raises(jaxfn.AutogradFunctionError, match=refused):
        call(f, x, {"a": jnp.ones(1), "b": jax.random.key(0)})
    data = {"a": jnp.ones(1), "b": jax.random.key_data(jax.random.key(0))}
    assert np.allclose(call(f, x, data), 2 * np.ones(3))  # the value, or the gradient of its sum: both 2 here


def test_host_code_s_exception_reaches_the_caller_as_itself_after_a_call_that_succeeded():
    """The second call of a signature runs JAX's cached callback, which JAX reports as another
    error type (a ValueError on jax 0.10): still the host code's own exception, under un-jitted
    grad, vjp and vmap, from forward and from backward."""

    class HostFailure(Exception):
        pass

    def forward(ctx, x):
        if x[0] < 0:
            raise HostFailure("forward refuses negative x")
        ctx.save_for_backward(x)
        return np.sin(x)

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if x[1] > 5:
            raise HostFailure("backward refuses x[1] > 5")
        return g * np.cos(x)

    f = jaxfn.autograd_function(forward, backward, host=True, name="h")
    ok, negative, big = jnp.array([0.3, 1.0]), jnp.array([-0.3, 1.0]), jnp.array([0.3, 9.0])
    grad = jax.grad(lambda x: f(x).sum())
    np.testing.assert_allclose(grad(ok), np.cos(ok), rtol=1e-6)
    later = os.environ.get("JAX_CUSTOM_VJP3", "").lower() in ("1", "true")  # vmap runs a program later, as jit
    for call, x, match in [
        (grad, negative, "forward refuses"),
        (grad, big, "backward refuses"),
        (lambda x: jax.vjp(f, x)[0], negative, "forward refuses"),
        (jax.vmap(f), jnp.stack([negative, negative]), "forward refuses"),
    ]:
        kind = jax.errors.JaxRuntimeError if later and call is not grad and x.ndim == 2 else HostFailure
        with pytest.raises(kind, match=match):
            call(x)


def test_a_host_forward_whose_saves_or_output_change_between_calls_is_refused_naming_both():
    """The probe (on ones) fixes what a signature saves and returns; a call that differs is
    refused saying what it saved (or returned) and what the first did."""

    def saves(ctx, x):
        ctx.scale = None if x[0] > 0 else 2.0  # None on the probe's ones: no leaf there
        ctx.save_for_backward(x)
        return np.sin(x)

    f = jaxfn.autograd_function(saves, lambda ctx, g: g, host=True, name="h")
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'h': a host forward .* must save the same structure on every call, but this call saved '0', 'scale', "
        r"where the first one of this signature saved '0'; .*placeholder",
    ):
        jax.grad(lambda x: f(x).sum())(jnp.array([-0.3, 1.0]))

    def returns(ctx, x):
        return (np.sin(x), np.cos(x)) if x[0] < 0 else np.sin(x)

    g = jaxfn.autograd_function(returns, lambda ctx, g: g, host=True, name="h")
    returned = r"must return the same structure .* returned PyTreeDef\(\(\*, \*\)\), where the first .* PyTreeDef\(\*\)"
    with pytest.raises(jaxfn.AutogradFunctionError, match=returned):
        jax.grad(lambda x: jnp.sum(g(x)))(jnp.array([-0.3, 1.0]))
