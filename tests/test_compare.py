"""jaxfn.compare never says yes about what it did not check: every array argument counts however it
is passed, an exception the port raises is a disagreement, and known causes are named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn

torch = pytest.importorskip("torch", reason="compare needs PyTorch (pip install torch==2.13.0)")

RNG = np.random.default_rng(1)
X, W = RNG.standard_normal(4), RNG.standard_normal(4)


class Scale(torch.autograd.Function):  # x * w, w passed however the caller likes
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, g * x

    @staticmethod
    def jvp(ctx, tx, tw):
        x, w = ctx.saved_tensors
        return tx * w + x * tw


def _scale_port(w_factor=1.0, jvp=None):
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)
        return x * w

    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, w_factor * g * x

    return jaxfn.autograd_function(forward, backward, jvp=jvp, name="scale")


@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_a_wrong_gradient_is_caught_however_the_argument_is_passed(how):
    wrong = _scale_port(w_factor=3.0)
    report = jaxfn.compare(wrong, Scale, X, W) if how == "positional" else jaxfn.compare(wrong, Scale, X, w=W)
    assert not report
    assert any(r.where == "parameter 'w'" and r.check.startswith("gradient") for r in report.rows), str(report)
    assert jaxfn.compare(_scale_port(), Scale, X, w=W)


class PairSum(torch.autograd.Function):  # a dict argument: PyTorch gives its tensors no gradient
    @staticmethod
    def forward(ctx, p):
        return p["a"] * 2 + p["b"]

    @staticmethod
    def backward(ctx, g):
        return None


def test_array_leaves_inside_a_pytree_are_compared_by_key_path():
    wrong = jaxfn.autograd_function(lambda ctx, p: p["a"] * 2 + p["b"] * 1.5, lambda ctx, g: None, name="pair")
    report = jaxfn.compare(wrong, PairSum, {"a": X, "b": W})
    assert not report and report.rows[0].where == "output 0", str(report)
    right = jaxfn.autograd_function(
        lambda ctx, p: p["a"] * 2 + p["b"], lambda ctx, g: {"p": {"a": 2 * g, "b": g}}, name="pair"
    )
    report = jaxfn.compare(right, PairSum, {"a": X, "b": W})
    assert not report
    assert [r.where for r in report.rows][:2] == ["parameter 'p['a']'", "parameter 'p['b']'"], str(report)
    assert "PyTorch gives no gradient to a tensor inside a tuple, list or dict argument" in str(report)


def test_an_exception_in_the_port_s_jvp_rule_is_a_disagreement_with_its_message():
    def bad_jvp(ctx, tx, tw):
        x, w = ctx.saved_tensors
        return jnp.concatenate([tx * w, tx * w])  # a tangent of the wrong shape

    report = jaxfn.compare(_scale_port(jvp=bad_jvp), Scale, X, W)
    assert not report, str(report)
    row = next(r for r in report.rows if r.check == "jvp")
    assert row.where == "the port" and str(row.port).startswith("raised ") and "shape" in str(row.port)
    assert "1 disagreement\n" in str(report)  # one row: the singular


def test_a_port_without_forward_mode_is_listed_as_not_compared():
    report = jaxfn.compare(_scale_port(), Scale, X, W)
    assert report and "jvp" not in report.checks
    assert "jvp not compared: the port has no forward-mode rule" in str(report)


def test_a_raising_port_forward_is_a_disagreement():
    boom = jaxfn.autograd_function(lambda ctx, x, w: (_ for _ in ()).throw(RuntimeError("boom")), lambda ctx, g: g)
    report = jaxfn.compare(boom, Scale, X, W)
    assert not report and report.rows[0].port == "raised RuntimeError: boom"
    assert "gradients not compared: the port's forward raised" in str(report)


def test_bfloat16_inputs_are_compared():
    x, w = jnp.asarray(X, jnp.bfloat16), jnp.asarray(W, jnp.bfloat16)
    assert jaxfn.compare(_scale_port(), Scale, x, w)
    assert not jaxfn.compare(_scale_port(w_factor=3.0), Scale, x, w)


class ScalePort(jaxfn.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, g * x

    @staticmethod
    def jvp(ctx, tx, tw):
        x, w = ctx.saved_tensors
        return tx * w + x * tw


def test_a_function_class_is_accepted_as_the_port():
    report = jaxfn.compare(ScalePort, Scale, X, W)
    assert report and "jvp" in report.checks, str(report)


class Float32Inside(torch.autograd.Function):  # torch.Tensor(ndarray): float32 whatever the input
    @staticmethod
    def forward(ctx, x):
        return torch.Tensor(x.detach().numpy()) * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_an_original_computing_in_a_narrower_dtype_is_named_with_the_tolerance():
    port = jaxfn.autograd_function(lambda ctx, x: x * 2, lambda ctx, g: g * 2, name="double")
    report = jaxfn.compare(port, Float32Inside, X + 1 / 3)
    assert report, str(report)
    assert "the original computes in float32 though its inputs are float64" in str(report)
    assert "rtol 0.0001, atol 1e-05" in str(report)


class ExpInPlace(torch.autograd.Function):  # writes its input and saves the written value
    @staticmethod
    def forward(ctx, x):
        x.exp_()
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


def test_an_in_place_write_that_backward_reads_back_is_named():
    def forward(ctx, x):
        ctx.save_for_backward(x)  # the value before the write: the port's backward is then wrong
        return jnp.exp(x)

    port = jaxfn.autograd_function(forward, lambda ctx, g: g * ctx.saved_tensors[0], name="exp")
    report = jaxfn.compare(port, ExpInPlace, X)
    assert not report and "writes 'x' in place (ctx.mark_dirty)" in str(report), str(report)


class CubeSavingSquare(torch.autograd.Function):  # backward reads x**2 that forward computed
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x * x)
        return x**3

    @staticmethod
    def backward(ctx, g):
        (square,) = ctx.saved_tensors
        return 3 * g * square


def test_a_second_derivative_pytorch_does_not_take_is_named():
    def forward(ctx, x):
        ctx.save_for_backward(x * x)
        return x**3

    port = jaxfn.autograd_function(forward, lambda ctx, g: 3 * g * ctx.saved_tensors[0], name="cube")
    assert jaxfn.compare(port, CubeSavingSquare, X)
    report = jaxfn.compare(port, CubeSavingSquare, X, order=2)
    assert not report and report.rows[0].check == "second derivative", str(report)
    assert "PyTorch does not differentiate through it at second order" in str(report)
    # the port's second derivative is the true one: jax.grad of the plain math
    u = np.ones(4)
    want = jax.grad(lambda x: jnp.vdot(jax.grad(lambda x: jnp.vdot(u, x**3))(x), u))(X)
    np.testing.assert_allclose(want, 6 * X)


def test_order_must_be_1_or_2():
    with pytest.raises(ValueError, match=r"'Scale': jaxfn.compare's order must be 1 or 2, but got 3"):
        jaxfn.compare(_scale_port(), Scale, X, W, order=3)
