"""jaxfn.from_torch and jaxfn.compare: PyTorch's own NumPy Functions (autograd_function_db) run
inside JAX under jit, grad and vmap and agree with PyTorch; compare locates wrong ports."""

import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn

torch = pytest.importorskip("torch", reason="from_torch and compare need PyTorch (pip install torch==2.13.0)")
# PyTorch's forward-mode AD loads its decompositions through the deprecated torch.jit.script once
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch.jit.script` is deprecated:DeprecationWarning")


# -- the five NumPy classes of torch/testing/_internal/autograd_function_db.py, as written there --
def to_numpy(tensor):
    return tensor.cpu().numpy()


class NumpyCube(torch.autograd.Function):
    @staticmethod
    def forward(input):
        input_np = to_numpy(input)
        dinput = torch.tensor(3 * input_np**2, device=input.device)
        return torch.tensor(input_np**3, device=input.device), dinput

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], output[1])
        ctx.save_for_forward(inputs[0], output[1])

    @staticmethod
    def backward(ctx, grad_output, grad_saved):
        input, dinput = ctx.saved_tensors
        return NumpyMul.apply(grad_output, dinput) + 6 * NumpyMul.apply(grad_saved, input)

    @staticmethod
    def vmap(info, in_dims, input):
        result = NumpyCube.apply(input)
        return result, (in_dims[0], in_dims[0])

    @staticmethod
    def jvp(ctx, input_tangent):
        input, dinput = ctx.saved_tensors
        return NumpyMul.apply(input_tangent, dinput), 6 * NumpyMul.apply(input_tangent, input)


class NumpyMul(torch.autograd.Function):
    @staticmethod
    def forward(x, y):
        return torch.tensor(to_numpy(x) * to_numpy(y), device=x.device)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def backward(ctx, grad_output):
        x, y = ctx.saved_tensors
        gx = NumpyMul.apply(grad_output, y) if ctx.needs_input_grad[0] else None
        gy = NumpyMul.apply(grad_output, x) if ctx.needs_input_grad[1] else None
        return gx, gy

    @staticmethod
    def vmap(info, in_dims, x, y):
        x_bdim, y_bdim = in_dims
        x = x.movedim(x_bdim, -1) if x_bdim is not None else x.unsqueeze(-1)
        y = y.movedim(y_bdim, -1) if y_bdim is not None else y.unsqueeze(-1)
        return NumpyMul.apply(x, y).movedim(-1, 0), 0

    @staticmethod
    def jvp(ctx, x_tangent, y_tangent):
        x, y = ctx.saved_tensors
        return x_tangent * y + y_tangent * x


class NumpyExp_(torch.autograd.Function):
    @staticmethod
    def forward(x):
        x_np = to_numpy(x)
        np.exp(x_np, x_np)
        return x

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.mark_dirty(x)
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx, grad_output):
        (output,) = ctx.saved_tensors
        return NumpyMul.apply(grad_output, output)

    @staticmethod
    def vmap(info, in_dims, x):
        NumpyExp_.apply(x)
        return x, in_dims[0]

    @staticmethod
    def jvp(ctx, x_tangent):
        (output,) = ctx.saved_tensors
        x_tangent.mul_(output)
        return x_tangent


class NumpySort(torch.autograd.Function):
    @staticmethod
    def forward(x, dim):
        device = x.device
        x = to_numpy(x)
        ind = np.argsort(x, axis=dim)
        ind_inv = np.argsort(ind, axis=dim)
        return torch.tensor(x, device=device), torch.tensor(ind, device=device), torch.tensor(ind_inv, device=device)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _x, dim = inputs
        _, ind, ind_inv = output
        ctx.mark_non_differentiable(ind, ind_inv)
        ctx.save_for_backward(ind, ind_inv)
        ctx.save_for_forward(ind, ind_inv)
        ctx.dim = dim

    @staticmethod
    def backward(ctx, grad_output, _0, _1):
        ind, ind_inv = ctx.saved_tensors
        return NumpyTake.apply(grad_output, ind_inv, ind, ctx.dim), None

    @staticmethod
    def vmap(info, in_dims, x, dim):
        x_bdim, _ = in_dims
        x = x.movedim(x_bdim, 0)
        dim = dim if dim >= 0 else dim + x.dim() - 1
        return NumpySort.apply(x, dim + 1), (0, 0, 0)

    @staticmethod
    def jvp(ctx, x_tangent, _):
        ind, ind_inv = ctx.saved_tensors
        return NumpyTake.apply(x_tangent, ind, ind_inv, ctx.dim), None, None


class NumpyTake(torch.autograd.Function):
    @staticmethod
    def forward(x, ind, ind_inv, dim):
        device = x.device
        x = to_numpy(x)
        ind = to_numpy(ind)
        return torch.tensor(np.take_along_axis(x, ind, dim), device=device)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _x, ind, ind_inv, dim = inputs
        ctx.save_for_backward(ind, ind_inv)
        ctx.save_for_forward(ind, ind_inv)
        ctx.dim = dim

    @staticmethod
    def backward(ctx, grad_output):
        ind, ind_inv = ctx.saved_tensors
        return NumpyTake.apply(grad_output, ind_inv, ind, ctx.dim), None, None, None

    @staticmethod
    def vmap(info, in_dims, x, ind, ind_inv, dim):
        x_bdim, ind_bdim, ind_inv_bdim, _ = in_dims
        logical_dim = x.dim() if x_bdim is None else x_bdim - 1
        dim = dim if dim >= 0 else dim + logical_dim

        def expand_bdim(x, x_bdim):
            if x_bdim is None:
                return x.expand(info.batch_size, *x.shape)
            return x.movedim(x_bdim, 0)

        x, ind, ind_inv = expand_bdim(x, x_bdim), expand_bdim(ind, ind_bdim), expand_bdim(ind_inv, ind_inv_bdim)
        return NumpyTake.apply(x, ind, ind_inv, dim + 1), 0

    @staticmethod
    def jvp(ctx, x_tangent, ind_tangent, ind_inv_tangent, _):
        assert ind_tangent is None and ind_inv_tangent is None
        ind, ind_inv = ctx.saved_tensors
        return NumpyTake.apply(x_tangent, ind, ind_inv, ctx.dim)


X = np.array([[0.3, -1.2, 0.8, 2.0, -0.5], [1.1, 0.4, -0.7, 0.2, 1.5], [-0.9, 0.6, 0.1, -1.4, 0.9]])
IND = np.argsort(X, axis=1)
IND_INV = np.argsort(IND, axis=1)
COT = np.random.default_rng(1).standard_normal(X.shape)


def _torch_grad(function, args, index, cotangent=COT):
    """PyTorch's gradient of sum(out[0] * COT) for argument ``index``: the reference."""
    tensors = [
        torch.tensor(a, requires_grad=i == index) if isinstance(a, np.ndarray) else a for i, a in enumerate(args)
    ]
    given = [t.clone() if getattr(t, "requires_grad", False) else t for t in tensors]
    out = function.apply(*given)
    first = out[0] if isinstance(out, tuple) else out
    (first * torch.tensor(cotangent)).sum().backward()
    return tensors[index].grad.numpy()


def _torch_out(function, args):
    with torch.no_grad():
        out = function.apply(*[torch.tensor(a) if isinstance(a, np.ndarray) else a for a in args])
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


DB = [
    (NumpyCube, (X,)),
    (NumpyMul, (X, X[::-1].copy())),
    (NumpyExp_, (X,)),
    (NumpySort, (X, 1)),
    (NumpyTake, (X, IND, IND_INV, 1)),
]


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("function, args", DB, ids=[f.__name__ for f, _ in DB])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_autograd_function_db_runs_through_from_torch_and_agrees_with_pytorch(function, args, jit):
    f = jaxfn.from_torch(function)
    statics = {i: a for i, a in enumerate(args) if not isinstance(a, np.ndarray) or a.dtype.kind == "i"}
    arrays = [jnp.asarray(a) if i not in statics else a for i, a in enumerate(args)]

    def loss(x, *rest):
        return jnp.sum(_first(f(x, *rest)) * COT)

    wrap = jax.jit if jit else (lambda g, **_: g)
    for ours, theirs in zip(
        jax.tree_util.tree_leaves(wrap(f, static_argnums=(1,) if function is NumpySort else ())(*arrays)),
        _torch_out(function, args),
    ):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    grad = wrap(jax.grad(loss), static_argnums=(1,) if function is NumpySort else ())(*arrays)
    np.testing.assert_allclose(grad, _torch_grad(function, args, 0), rtol=1e-12)
    # vmap over rows (each a (1, 5) array): the Function's own vmap rule, then per-row gradients
    rows = [a[:, None] if isinstance(a, np.ndarray) else a for a in args]
    axes = tuple(0 if isinstance(a, np.ndarray) else None for a in args)
    batched = wrap(jax.vmap(lambda *a: _first(f(*a)), in_axes=axes))
    expected = np.stack(
        [_torch_out(function, [r[i] if ax == 0 else r for r, ax in zip(rows, axes)])[0] for i in range(3)]
    )
    np.testing.assert_allclose(batched(*[jnp.asarray(r) if ax == 0 else r for r, ax in zip(rows, axes)]), expected)
    per_row = wrap(jax.vmap(jax.grad(lambda *a: jnp.sum(_first(f(*a)) * COT[0])), in_axes=axes))
    expected = np.stack(
        [_torch_grad(function, [r[i] if ax == 0 else r for r, ax in zip(rows, axes)], 0, COT[0]) for i in range(3)]
    )
    np.testing.assert_allclose(per_row(*[jnp.asarray(r) if ax == 0 else r for r, ax in zip(rows, axes)]), expected)


@pytest.mark.parametrize("function, args", DB, ids=[f.__name__ for f, _ in DB])
def test_from_torch_jvp_is_the_function_s_own_and_compare_agrees_with_itself(function, args):
    f = jaxfn.from_torch(function)
    tangent = np.ones_like(X)
    rest = args[1:]
    _, out_tangent = jax.jvp(lambda x: _first(f(x, *rest)), (jnp.asarray(X),), (jnp.asarray(tangent),))
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(torch.tensor(X), torch.tensor(tangent))
        rest_t = [torch.tensor(a) if isinstance(a, np.ndarray) else a for a in rest]
        expected = torch.autograd.forward_ad.unpack_dual(_first(function.apply(dual, *rest_t))).tangent.numpy()
    np.testing.assert_allclose(out_tangent, expected, rtol=1e-12)
    report = jaxfn.compare(f, function, *args)
    assert report, str(report)


def test_from_torch_under_scan_and_the_ctx_first_form():
    class Clip(torch.autograd.Function):  # ctx-first form, a Python value saved on ctx
        @staticmethod
        def forward(ctx, x, bound):
            ctx.save_for_backward(x)
            ctx.bound = bound
            return x.clamp(-bound, bound)

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return grad_output * (x.abs() <= ctx.bound), None

    clip = jaxfn.from_torch(Clip)
    xs = jnp.asarray(X)

    def total(xs):
        return jax.lax.scan(lambda c, row: (c + clip(row, 1.0).sum(), None), 0.0, xs)[0]

    np.testing.assert_allclose(jax.jit(jax.grad(total))(xs), (np.abs(X) <= 1.0) * 1.0)
    assert sys.modules.get("torch") is not None


def test_from_torch_refuses_what_is_not_a_function():
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'apply': jaxfn.from_torch takes a torch.autograd.Function"):
        jaxfn.from_torch(NumpyMul.apply)


# -- compare: three real Functions, each with a right port and a deliberately wrong one -------------
class LinearFunction(torch.autograd.Function):  # PyTorch's "Extending torch.autograd" example
    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        output = input.mm(weight.t())
        if bias is not None:
            output += bias.unsqueeze(0).expand_as(output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.mm(weight)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output.t().mm(input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(0)
        return grad_input, grad_weight, grad_bias


class BinarizeSTE(torch.autograd.Function):  # straight-through sign, gradient cut outside [-1, 1]
    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return input.sign()

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        grad_input = grad_output.clone()
        grad_input[input.abs() > 1] = 0
        return grad_input


class GradReverse(torch.autograd.Function):  # DANN's gradient reversal layer
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.neg() * ctx.alpha, None


def _linear_port(wrong_bias=False, wrong_forward=False):
    def forward(ctx, input, weight, bias):
        ctx.save_for_backward(input, weight)
        out = input @ weight.T + bias
        return out.at[1, 2].add(0.5) if wrong_forward else out

    def backward(ctx, g):
        input, weight = ctx.saved_tensors
        grad_bias = g.sum(0)
        return g @ weight, g.T @ input, grad_bias.at[2].multiply(2.0) if wrong_bias else grad_bias

    return jaxfn.autograd_function(forward, backward, name="linear")


def _ste_port(wrong=False):
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ((jnp.abs(x) < 1) if wrong else (jnp.abs(x) <= 1))  # wrong: cuts at |x| == 1 too

    def forward(ctx, x):
        ctx.save_for_backward(x)
        return jnp.sign(x)

    return jaxfn.autograd_function(forward, backward, name="ste")


def _reverse_port(wrong=False):
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x

    return jaxfn.autograd_function(forward, lambda ctx, g: (-g if wrong else -g * ctx.alpha, None), name="reverse")


RNG = np.random.default_rng(0)
INPUT, WEIGHT, BIAS = RNG.standard_normal((4, 3)), RNG.standard_normal((5, 3)), RNG.standard_normal(5)
SIGNS = np.array([0.5, 1.0, -2.0, -0.25])  # |x| == 1 at index 1


def test_compare_accepts_right_ports():
    assert jaxfn.compare(_linear_port(), LinearFunction, INPUT, WEIGHT, BIAS)
    assert jaxfn.compare(_ste_port(), BinarizeSTE, SIGNS)
    report = jaxfn.compare(_reverse_port(), GradReverse, INPUT, 0.3)
    assert (
        report and "agrees" in str(report) and report.checks == ["forward", "gradient needs_input_grad=(True, False)"]
    )


@pytest.mark.parametrize(
    "port, original, args, check, where, index",
    [
        (
            _linear_port(wrong_bias=True),
            LinearFunction,
            (INPUT, WEIGHT, BIAS),
            "(False, False, True)",
            "parameter 'bias'",
            (2,),
        ),
        (_ste_port(wrong=True), BinarizeSTE, (SIGNS,), "(True,)", "parameter 'input'", (1,)),
        (_reverse_port(wrong=True), GradReverse, (INPUT, 0.3), "(True, False)", "parameter 'x'", (0, 0)),
        (_linear_port(wrong_forward=True), LinearFunction, (INPUT, WEIGHT, BIAS), None, "output 0", (1, 2)),
    ],
    ids=["linear-bias", "ste", "reverse", "linear-forward"],
)
def test_compare_locates_a_wrong_port(port, original, args, check, where, index):
    report = jaxfn.compare(port, original, *args)
    assert not report
    row = report.rows[0]
    assert (row.where, row.index) == (where, index), str(report)
    assert row.check == ("forward" if check is None else f"gradient needs_input_grad={check}")
    assert f"| {row.check} | {where} | {index} |" in str(report)
    with pytest.raises(
        jaxfn.AutogradFunctionError, match=rf"'{original.__name__}': the port disagrees with the original"
    ):
        jaxfn.compare(port, original, *args, raise_exception=True)


def test_compare_names_jax_s_32_bit_default_instead_of_failing():
    with jax.enable_x64(False):
        report = jaxfn.compare(_linear_port(), LinearFunction, INPUT, WEIGHT, BIAS)
    assert report, str(report)
    assert any("float32 where the original has float64, JAX's 32-bit default" in note for note in report.notes)


def test_compare_refuses_what_is_not_a_torch_function():
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"jaxfn.compare takes the original torch.autograd.Function"):
        jaxfn.compare(_ste_port(), _ste_port(), SIGNS)


def test_from_torch_backward_runs_again_on_one_call_for_jacrev_and_a_second_pullback():
    """jax.jacrev runs backward once per output element on the same call, and a pullback may be
    called twice: PyTorch's graph is kept for that (it freed it after the first backward)."""

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**3

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return 3 * x**2 * grad_output

    cube = jaxfn.from_torch(Cube)
    x = jnp.array([0.3, -1.2, 2.0])
    np.testing.assert_allclose(jax.jacrev(cube)(x), np.diag(3 * np.asarray(x) ** 2), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.jacrev(cube))(x), np.diag(3 * np.asarray(x) ** 2), rtol=1e-6)
    _, pullback = jax.vjp(cube, x)
    for _ in range(2):
        np.testing.assert_allclose(pullback(jnp.ones(3))[0], 3 * np.asarray(x) ** 2, rtol=1e-6)


def test_a_torch_forward_returning_a_numpy_array_is_refused_where_a_gradient_reaches_it():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a.numpy() * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    f = jaxfn.from_torch(Double)
    np.testing.assert_allclose(f(jnp.arange(3.0)), [0.0, 2.0, 4.0])  # nothing differentiated: as PyTorch gives it
    with pytest.raises(
        jaxfn.AutogradFunctionError,
        match=r"'Double': a gradient reaches output 0, which its PyTorch forward returned as a NumPy",
    ):
        jax.grad(lambda a: f(a).sum())(jnp.arange(3.0))


def test_compare_reports_outputs_of_other_shapes_and_names_arguments_the_original_refuses():
    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return (a * b)[:2]

        @staticmethod
        def backward(ctx, g):
            return None, None

    port = jaxfn.autograd_function(lambda ctx, a, b: a * b, lambda ctx, g: (g, g), name="mul")
    report = jaxfn.compare(port, Mul, np.ones(3), np.ones(3))
    assert not report and "shape (3,)" in str(report) and "gradients not compared" in str(report)
    double = jaxfn.autograd_function(lambda ctx, a: a * 2, lambda ctx, g: g * 2, name="double")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'Mul': jaxfn.compare calls the port and the original "):
        jaxfn.compare(double, Mul, np.ones(3))
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"takes the port first"):
        jaxfn.compare(3, Mul, np.ones(3), np.ones(3))


def test_torch_tensors_passed_to_a_jaxfn_function_or_gradcheck_are_named():
    double = jaxfn.autograd_function(lambda ctx, a: a * 2, lambda ctx, g: g * 2, name="double")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'double': argument 'a' is a torch.Tensor"):
        double(torch.ones(3))
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'double': argument 'a' is a torch.Tensor"):
        jaxfn.gradcheck(double, torch.ones(3))


def test_from_torch_names_an_instance_or_a_module_class_given_for_the_function():
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    with warnings.catch_warnings():  # PyTorch warns that a Function should not be instantiated
        warnings.simplefilter("ignore")
        instance = Twice()
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'Twice': .*an instance of Twice"):
        jaxfn.from_torch(instance)
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'ReLU': .*torch.nn.modules.activation.ReLU.*an nn.Module"):
        jaxfn.from_torch(torch.nn.ReLU)


class _CMul(torch.autograd.Function):
    """A complex product with PyTorch's convention: backward takes and gives conjugated gradients."""

    @staticmethod
    def forward(ctx, z, w):
        ctx.save_for_backward(z, w)
        return z * w

    @staticmethod
    def backward(ctx, g):
        z, w = ctx.saved_tensors
        return g * w.conj(), g * z.conj()


_Z = np.array([1.0 + 2.0j, -0.5 + 0.3j], np.complex64)
_W = np.array([0.7 - 1.1j, 2.0 + 0.5j], np.complex64)


def test_from_torch_gives_jaxs_complex_gradients():
    f = jaxfn.from_torch(_CMul)
    loss = lambda g: lambda z: (jnp.abs(g(z, _W)) ** 2).sum()
    np.testing.assert_allclose(jax.grad(loss(f))(_Z), jax.grad(loss(lambda a, b: a * b))(_Z), rtol=1e-5)
    pull = jax.vjp(lambda z: f(z, _W), _Z)[1]
    np.testing.assert_allclose(pull(jnp.asarray(1j * np.ones(2), np.complex64))[0], 1j * _W, rtol=1e-5)


def test_compare_reads_complex_gradients_in_jaxs_convention():
    def forward(ctx, z, w):
        ctx.save_for_backward(z, w)
        return z * w

    right = jaxfn.autograd_function(forward, lambda ctx, g: (g * ctx.saved_tensors[1], g * ctx.saved_tensors[0]))
    kept = jaxfn.autograd_function(  # PyTorch's .conj() kept: wrong in JAX
        forward, lambda ctx, g: (g * ctx.saved_tensors[1].conj(), g * ctx.saved_tensors[0].conj())
    )
    assert jaxfn.compare(right, _CMul, _Z, _W)
    assert not jaxfn.compare(kept, _CMul, _Z, _W)


def test_from_torch_takes_bfloat16_and_numpy_inputs_under_vmap():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x * 2

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, g):
            return 2 * g

        @staticmethod
        def vmap(info, in_dims, x):
            return Double.apply(x), in_dims[0]

    f = jaxfn.from_torch(Double)
    ones = jnp.ones(3, jnp.bfloat16)
    assert f(ones).dtype == jnp.bfloat16 and float(f(ones)[0]) == 2.0
    np.testing.assert_array_equal(jax.jit(jax.grad(lambda a: f(a).sum().astype(jnp.float32)))(ones), [2.0] * 3)
    batch = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(jax.vmap(f)(batch), 2 * batch)


def test_compare_notes_a_vmap_rule_that_refuses_some_batched_arguments():
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(x, w):
            return x * w

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g * w, g * x

        @staticmethod
        def vmap(info, in_dims, x, w):
            if in_dims[1] is not None:
                raise NotImplementedError("Scale: batching over w is not supported")
            return Scale.apply(x, w), in_dims[0]

    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    port = jaxfn.autograd_function(forward, lambda ctx, g: (g * ctx.saved_tensors[1], g * ctx.saved_tensors[0]))
    report = jaxfn.compare(port, Scale, np.ones(3), np.full(3, 2.0))
    assert report and "vmap not compared: the original raised NotImplementedError" in str(report)


def test_a_numpy_output_beside_tensors_is_fine_where_no_gradient_reaches_it_and_compare_keeps_own_errors():
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, np.array([float(x.max())])

        @staticmethod
        def backward(ctx, g, g_max):
            return g * 2

    f = jaxfn.from_torch(Scale)
    np.testing.assert_allclose(jax.grad(lambda x: f(x)[0].sum())(jnp.array([1.0, -3.0])), [2.0, 2.0])

    class Broken(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.sin(x) + None  # the original's own TypeError

        @staticmethod
        def backward(ctx, g):
            return g

    class Sine(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.sin(x)

        @staticmethod
        def backward(ctx, g):
            return g * torch.cos(ctx.saved_tensors[0])

    def sine(ctx, x):
        ctx.save_for_backward(x)
        return jnp.sin(x)

    port = jaxfn.autograd_function(sine, lambda ctx, g: g * jnp.cos(ctx.saved_tensors[0]), name="port")
    with pytest.raises(TypeError, match="unsupported operand") as info:
        jaxfn.compare(port, Broken, np.ones(3))
    assert not isinstance(info.value, jaxfn.AutogradFunctionError)
    assert jaxfn.compare(port, Sine, np.ones(3), atol=jnp.float32(1e-4))  # a JAX scalar tolerance


def test_forward_mode_through_a_numpy_output_is_refused_and_compare_names_an_arity_mismatch():
    class Pair(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, (x * 3).detach().numpy()

        @staticmethod
        def backward(ctx, g, g2):
            return g * 2

        @staticmethod
        def jvp(ctx, t):
            return t * 2, None

    f = jaxfn.from_torch(Pair)
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'Pair': forward mode reaches output 1, which its PyTorch"):
        jax.jvp(f, (jnp.ones(3),), (jnp.ones(3),))

    class One(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    two = jaxfn.autograd_function(lambda ctx, x, y: x * y, lambda ctx, g: (g, g), name="two")
    with pytest.raises(jaxfn.AutogradFunctionError, match=r"'One': jaxfn.compare calls the port and the original"):
        jaxfn.compare(two, One, np.ones(3), np.ones(3))


def test_a_generated_vmap_rule_with_none_and_number_outputs():
    """torch.func.vmap takes tensor outputs only: a None output is dropped and a number is the same
    for every element, as everywhere else."""

    class SinCos(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x, b, w):
            return None, torch.sin(x) * w, torch.cos(x) * w, 3

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0], inputs[2])

        @staticmethod
        def backward(ctx, g_none, gy, gz, g3):
            x, w = ctx.saved_tensors
            return gy * torch.cos(x) * w - gz * torch.sin(x) * w, None, (gy * torch.sin(x) + gz * torch.cos(x)).sum()

    port = jaxfn.from_torch(SinCos)
    xs, w = jnp.array([[0.3, -0.7, 1.1], [0.6, -1.4, 2.2]]), jnp.array(1.7)
    for run in (jax.vmap, lambda f: jax.jit(jax.vmap(f))):
        none, y, z, three = run(lambda x: port(x, None, w))(xs)
        assert none is None
        np.testing.assert_allclose(y, jnp.sin(xs) * w, rtol=1e-6)
        np.testing.assert_allclose(z, jnp.cos(xs) * w, rtol=1e-6)
        np.testing.assert_array_equal(three, [3, 3])
    grads = jax.vmap(jax.grad(lambda x: port(x, None, w)[1].sum()))(xs)
    np.testing.assert_allclose(grads, jnp.cos(xs) * w, rtol=1e-6)
