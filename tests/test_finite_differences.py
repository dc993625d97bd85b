"""backward="finite_differences" (host=True): a black box differentiated by central differences,
checked against jax.grad of the same math written plainly, under jit, grad, jvp and vmap."""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate

import jaxfn

# The accuracy docs/host.md states: about eps^(2/3) relative to the Jacobian's scale (measured
# 2e-11 in float64, 1e-5 in float32 on these functions); the tests allow a margin over that.
TOLERANCE = {np.float64: 1e-8, np.float32: 2e-3}


def _close(got, want, dtype):
    """Agreement relative to the reference's largest entry (a Jacobian's scale)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want))))
    assert np.max(np.abs(got - want)) <= TOLERANCE[dtype] * scale, (got, want)


def _plain(x):
    return jnp.sin(x) * jnp.exp(x[::-1] / 3) + x**2


def _forward(ctx, x):
    assert isinstance(x, np.ndarray)  # host code: NumPy arrays
    return np.sin(x) * np.exp(x[::-1] / 3) + x**2


box = jaxfn.autograd_function(_forward, "finite_differences", host=True, name="box")


def _x(dtype, n=6):
    return jnp.linspace(-2.0, 3.0, n, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_gradient_matches_the_plain_math(dtype, transform):
    x = _x(dtype)
    got = transform(jax.grad(lambda x: box(x).sum()))(x)
    assert got.dtype == dtype
    _close(got, jax.grad(lambda x: _plain(x).sum())(x.astype(np.float64)), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_jvp_matches_the_plain_math(dtype, transform):
    x, t = _x(dtype), jnp.linspace(1.0, -0.5, 6, dtype=dtype)
    out, tangent = transform(lambda x, t: jax.jvp(box, (x,), (t,)))(x, t)
    want_out, want_tangent = jax.jvp(_plain, (x.astype(np.float64),), (t.astype(np.float64),))
    assert tangent.dtype == dtype
    _close(out, want_out, dtype)
    _close(tangent, want_tangent, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("jacobian", [jax.jacfwd, jax.jacrev])
def test_jacobians_match_the_plain_math(dtype, jacobian):
    x = _x(dtype)
    want = jax.jacfwd(_plain)(x.astype(np.float64))
    _close(jacobian(box)(x), want, dtype)
    _close(jax.jit(jacobian(box))(x), want, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_vmap_of_gradients_and_values(dtype):
    xs = jnp.stack([_x(dtype), _x(dtype) * 0.5, _x(dtype) + 1])
    plain = jax.vmap(jax.grad(lambda x: _plain(x).sum()))(xs.astype(np.float64))
    _close(jax.vmap(jax.grad(lambda x: box(x).sum()))(xs), plain, dtype)
    _close(jax.jit(jax.vmap(jax.grad(lambda x: box(x).sum())))(xs), plain, dtype)
    _close(jax.vmap(box)(xs), jax.vmap(_plain)(xs.astype(np.float64)), dtype)
    _, tangents = jax.jit(jax.vmap(lambda x: jax.jvp(box, (x,), (x,))))(xs)
    _close(tangents, jax.vmap(lambda x: jax.jvp(_plain, (x,), (x,))[1])(xs.astype(np.float64)), dtype)


@pytest.mark.xfail(
    jax.config.jax_custom_vjp3,
    reason="jax 0.10's hijax batching with jax_custom_vjp3 on fails on a vmap of a vmapped jvp (any host function "
    "with a jvp rule, not finite differences alone: TypeError in hijax batch_dim_rule); jax 0.12 passes",
    strict=False,
)
def test_vmap_of_jacfwd():
    xs = jnp.stack([_x(np.float64), _x(np.float64) * 0.5])
    _close(jax.jit(jax.vmap(jax.jacfwd(box)))(xs), jax.vmap(jax.jacfwd(_plain))(xs), np.float64)


def test_the_step_scales_with_the_value():
    """cbrt(eps)·max(1, |x|): large inputs keep the relative accuracy; below 1 the step is
    absolute, so near a singularity (log at 1e-3) the truncation error h²·|f(3)|/6 shows."""
    log = jaxfn.autograd_function(lambda ctx, x: np.log(x), "finite_differences", host=True)
    x = jnp.array([0.5, 3.0, 2e4, 7e8])
    np.testing.assert_allclose(jax.grad(lambda x: log(x).sum())(x), 1 / x, rtol=1e-8)
    np.testing.assert_allclose(jnp.diag(jax.jacfwd(log)(x)), 1 / x, rtol=1e-8)  # one element at a time
    # along one tangent, one step serves every element: here s·|t| = cbrt(eps)·|x|, each element's own step
    np.testing.assert_allclose(jax.jvp(log, (x,), (x,))[1], jnp.ones(4), rtol=1e-8)
    near_zero, h = 1e-3, np.cbrt(np.finfo(np.float64).eps)
    error = float(jax.grad(log)(near_zero)) - 1 / near_zero
    assert 0 < error <= 1.1 * h**2 * (2 / near_zero**3) / 6


@pytest.mark.parametrize("narrow", [np.float32, np.float16])
def test_the_step_is_for_the_coarser_of_the_input_and_the_output(narrow):
    """An output rounded coarser than its input (float64 in, float32 out; float32 in, float16 out)
    rounds the differences at its own precision: the step is chosen for it, so the gradient and the
    tangent keep about eps^(2/3) of the output's dtype (a step for the input's dtype gave 30-70
    times that)."""
    wide = np.float64 if narrow is np.float32 else np.float32
    f = jaxfn.autograd_function(lambda ctx, x: np.sin(x).astype(narrow), "finite_differences", host=True, name="f")
    x = jnp.array([0.3, 1.2, -0.7], wide)
    bound = 3 * float(np.finfo(narrow).eps) ** (2 / 3)
    gradient = jax.grad(lambda x: f(x).astype(wide).sum())(x)
    tangent = jax.jvp(f, (x,), (jnp.ones(3, wide),))[1]
    for derivative in (gradient, tangent):
        np.testing.assert_allclose(np.asarray(derivative, np.float64), np.cos(np.asarray(x, np.float64)), rtol=bound)


class _Counts:
    """Host calls (jax.pure_callback's callbacks run) and runs of the user's forward."""

    def __init__(self, monkeypatch):
        self.host_calls = self.runs = 0
        original = jax.pure_callback

        def counting(callback, *args, **kwargs):
            def counted(*arrays):
                self.host_calls += 1
                return callback(*arrays)

            return original(counted, *args, **kwargs)

        monkeypatch.setattr(jax, "pure_callback", counting)

    def reset(self):
        self.host_calls = self.runs = 0


@pytest.mark.parametrize("n", [5, 40])
def test_one_gradient_is_one_batch_of_host_calls_whatever_the_size(monkeypatch, n):
    counts = _Counts(monkeypatch)

    def forward(ctx, x):
        counts.runs += 1
        return np.sum(np.cos(x) * x)

    f = jaxfn.autograd_function(forward, "finite_differences", host=True)
    grad = jax.jit(jax.grad(f))
    x = jnp.linspace(0.0, 1.0, n)
    grad(x)  # the probe and the compilation
    counts.reset()
    np.testing.assert_allclose(grad(x), jnp.cos(x) - x * jnp.sin(x), rtol=1e-8)
    assert (counts.host_calls, counts.runs) == (2, 2 * n + 1)  # forward, then backward's 2n runs at once
    counts.reset()
    jax.jit(lambda x, t: jax.jvp(f, (x,), (t,)))(x, x)
    counts.reset()
    jax.jit(lambda x, t: jax.jvp(f, (x,), (t,)))(x, x)
    # the primal, then one call running forward at x (the jvp rule's context) and at x ± s·t
    assert (counts.host_calls, counts.runs) == (2, 4)


def test_inputs_not_differentiated_cost_nothing(monkeypatch):
    counts = _Counts(monkeypatch)

    def forward(ctx, a, b, steps):
        counts.runs += 1
        assert steps.dtype.kind == "i"  # an integer input: passed, never perturbed
        return np.sum(a**2) * np.sum(np.sin(b)) * steps.sum()

    f = jaxfn.autograd_function(forward, "finite_differences", host=True)
    a, b, steps = jnp.arange(1.0, 4.0), jnp.linspace(0.1, 1.0, 20), jnp.array([1, 2])
    grad_a = jax.jit(jax.grad(f))
    grad_a(a, b, steps)
    counts.reset()
    got = grad_a(a, b, steps)
    assert counts.runs == 2 * a.size + 1  # b's 20 elements are not perturbed
    np.testing.assert_allclose(got, 2 * a * jnp.sin(b).sum() * 3, rtol=1e-8)
    both = jax.grad(f, argnums=(0, 1))(a, b, steps)
    np.testing.assert_allclose(both[1], jnp.sum(a**2) * jnp.cos(b) * 3, rtol=1e-8)


def test_pytrees_keywords_static_values_and_varargs():
    def forward(ctx, params, *shifts, scale=2.0, kind="sin"):
        base = np.sin(params["w"]) if kind == "sin" else np.cos(params["w"])
        return scale * np.sum(base * params["b"]) + sum(np.sum(s**3) for s in shifts)

    def plain(params, *shifts, scale=2.0):
        return scale * jnp.sum(jnp.sin(params["w"]) * params["b"]) + sum(jnp.sum(s**3) for s in shifts)

    f = jaxfn.autograd_function(forward, "finite_differences", host=True)
    params = {"w": jnp.array([0.3, -1.2]), "b": jnp.array([2.0, 0.5])}
    shifts = (jnp.array(0.7), jnp.array([1.5, -2.0]))
    for transform in (lambda g: g, jax.jit):
        got = transform(jax.grad(lambda p, *s: f(p, *s, scale=3.0), argnums=(0, 1, 2)))(params, *shifts)
        want = jax.grad(lambda p, *s: plain(p, *s, scale=3.0), argnums=(0, 1, 2))(params, *shifts)
        jax.tree_util.tree_map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-8), got, want)
    tangent = jax.jvp(lambda w: f({"w": w, "b": params["b"]}, kind="sin"), (params["w"],), (jnp.ones(2),))[1]
    np.testing.assert_allclose(tangent, 2.0 * jnp.sum(jnp.cos(params["w"]) * params["b"]), rtol=1e-8)


def test_integer_outputs_carry_no_gradient_and_tuple_outputs_are_contracted():
    def forward(ctx, x):
        return np.exp(x), np.sum(x > 0), np.sum(x**2)

    f = jaxfn.autograd_function(forward, "finite_differences", host=True)
    x = jnp.array([-0.5, 0.25, 1.5])
    grad = jax.jit(jax.grad(lambda x: f(x)[0].sum() + 3 * f(x)[2]))(x)
    np.testing.assert_allclose(grad, jnp.exp(x) + 6 * x, rtol=1e-8)
    _, tangents = jax.jvp(f, (x,), (jnp.ones(3),))
    np.testing.assert_allclose(tangents[0], jnp.exp(x), rtol=1e-8)
    assert tangents[1].dtype == jax.dtypes.float0  # an integer output's tangent, as JAX gives it
    np.testing.assert_allclose(tangents[2], 2 * x.sum(), rtol=1e-8)


def test_a_scipy_ode_solve_as_a_black_box():
    """y' = -k y, y(0) = y0, solved by SciPy; d y(T) / d(k, y0) against the closed form."""

    def forward(ctx, k, y0):
        solution = scipy.integrate.solve_ivp(lambda t, y: -k * y, (0.0, 2.0), y0, rtol=1e-12, atol=1e-14)
        return solution.y[:, -1]

    decay = jaxfn.autograd_function(forward, "finite_differences", host=True, name="decay")
    k, y0 = jnp.array([0.5, 1.0, 2.0]), jnp.array([1.0, -2.0, 0.5])
    jac_k, jac_y0 = jax.jit(jax.jacrev(decay, argnums=(0, 1)))(k, y0)
    np.testing.assert_allclose(jnp.diag(jac_k), -2.0 * y0 * jnp.exp(-2.0 * k), rtol=1e-5)
    np.testing.assert_allclose(jnp.diag(jac_y0), jnp.exp(-2.0 * k), rtol=1e-5)
    np.testing.assert_allclose(jac_k - jnp.diag(jnp.diag(jac_k)), 0.0, atol=1e-9)


class Sim(jaxfn.Function):
    host = True
    backward = "finite_differences"

    @staticmethod
    def forward(ctx, x, power):
        ctx.power = power  # the user's own ctx use still works
        return np.abs(x) ** power


def test_class_style_and_pickling():
    x = jnp.array([0.5, 2.0])
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: Sim.apply(x, 3).sum()))(x), 3 * x**2, rtol=1e-8)
    again = pickle.loads(pickle.dumps(box))
    np.testing.assert_allclose(
        jax.grad(lambda x: again(x).sum())(_x(np.float64)), jax.grad(lambda x: box(x).sum())(_x(np.float64))
    )


def test_setup_context_form_and_a_jvp_rule_of_ones_own():
    called = []

    def jvp(ctx, tangent):
        called.append("jvp")
        return tangent * 3 * ctx.saved_tensors[0] ** 2

    cube = jaxfn.autograd_function(
        lambda x: x**3,
        "finite_differences",
        setup_context=lambda ctx, inputs, output: ctx.save_for_forward(inputs[0]),
        host=True,
        jvp=jvp,
    )
    x = jnp.array([1.0, -2.0])
    np.testing.assert_allclose(jax.grad(lambda x: cube(x).sum())(x), 3 * x**2, rtol=1e-8)
    np.testing.assert_allclose(jax.jvp(cube, (x,), (jnp.ones(2),))[1], 3 * x**2)
    assert called == ["jvp"]  # forward mode is the user's jvp; reverse mode the differences


def test_eager_calls_run_forward_once_without_a_callback(monkeypatch):
    counts = _Counts(monkeypatch)

    def forward(ctx, x):
        counts.runs += 1
        return x * 2

    f = jaxfn.autograd_function(forward, "finite_differences", host=True)
    f(jnp.ones(3))
    counts.reset()
    np.testing.assert_allclose(f(jnp.ones(3)), 2.0)
    assert (counts.host_calls, counts.runs) == (0, 1)


# -- misuse ------------------------------------------------------------------------------------
def test_finite_differences_without_host_is_refused():
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"^jaxfn: 'f': backward='finite_differences' differentiates a host forward \(NumPy code, host=True\) "
        r"by running it at perturbed inputs, but host is False; pass host=True",
    ):
        jaxfn.autograd_function(_forward, "finite_differences", name="f")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'NotHost': backward='finite_differences' .* host is False"):

        class NotHost(jaxfn.Function):
            backward = "finite_differences"

            @staticmethod
            def forward(ctx, x):
                return x


@pytest.mark.parametrize(
    "given, fix",
    [
        ("finite_difference", r"did you mean 'finite_differences'\?"),
        ("finite-differences", r"did you mean 'finite_differences'\?"),
        (
            "numerical",
            r"pass a backward function, or 'finite_differences' \(with host=True\) to differentiate a host forward "
            "by central differences",
        ),
    ],
)
def test_an_unknown_string_is_refused_naming_the_one_known(given, fix):
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"^jaxfn: 'f': backward must be a function backward\(ctx, \*grad_outputs\) or the string "
        rf"'finite_differences', but it is the string '{given}'; {fix}\.$",
    ) as refused:
        jaxfn.autograd_function(_forward, given, host=True, name="f")
    assert isinstance(refused.value, ValueError)  # a wrong value, as Python's own refusals of one


@pytest.mark.parametrize(
    "second",
    [
        lambda f: jax.hessian(f),
        lambda f: jax.grad(jax.grad(f)),
        lambda f: jax.jacfwd(jax.grad(f)),
        lambda f: jax.jit(jax.hessian(f)),
    ],
    ids=["hessian", "grad-grad", "jacfwd-grad", "jit-hessian"],
)
def test_a_second_derivative_is_refused_not_silently_wrong(second):
    cubes = jaxfn.autograd_function(lambda ctx, x: np.sum(x**3), "finite_differences", host=True, name="cubes")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"^jaxfn: 'cubes': it runs code on the host"):
        second(cubes)(jnp.array(1.5))


def test_complex_values_are_refused_when_differentiated():
    square = jaxfn.autograd_function(lambda ctx, z: z * z, "finite_differences", host=True, name="square")
    z = jnp.array([1.0 + 1.0j, 2.0])
    np.testing.assert_allclose(square(z), z * z)  # no derivative asked for: it runs
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'square': .*but input 'z' is complex; pass and return"):
        jax.grad(lambda z: square(z).real.sum(), holomorphic=False)(z)
    to_complex = jaxfn.autograd_function(lambda ctx, x: x * 1j, "finite_differences", host=True, name="rotate")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'rotate': .*but an output of forward is complex"):
        jax.jvp(to_complex, (jnp.ones(2),), (jnp.ones(2),))


def test_outputs_marked_non_differentiable_get_no_tangent_and_no_gradient():
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        doubled = x * 2
        ctx.mark_non_differentiable(doubled)
        return np.exp(x), doubled

    x = jnp.array([0.1, 0.7, 2.0])
    f = jaxfn.autograd_function(forward, "finite_differences", host=True)
    np.testing.assert_allclose(jax.grad(lambda x: f(x)[0].sum())(x), jnp.exp(x), rtol=1e-8)
    _, tangents = jax.jvp(f, (x,), (jnp.ones(3),))
    np.testing.assert_allclose(tangents[0], jnp.exp(x), rtol=1e-8)
    np.testing.assert_allclose(tangents[1], 0.0)
    # the same holds for a host function with a jvp rule of its own (the host builder marks them)
    own = jaxfn.autograd_function(forward, lambda ctx, g, _: g, host=True, jvp=lambda ctx, t: (t, t))
    np.testing.assert_allclose(jax.jvp(own, (x,), (jnp.ones(3),))[1][1], 0.0)
