"""jaxfn.compare never says yes about what it did not check: every array argument counts however it
is passed, an exception the port raises is a disagreement, and known causes are named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import make_mul_with_jvp

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
    assert {r.check for r in report.rows} == {"jvp", "jvp of 'x' alone", "jvp of 'w' alone"}, str(report)


def test_a_port_without_forward_mode_is_listed_as_not_compared():
    report = jaxfn.compare(_scale_port(), Scale, X, W)
    assert report and "jvp" not in report.checks
    assert "jvp not compared: the port has no forward-mode rule" in str(report)


def test_a_raising_port_forward_is_a_disagreement():
    boom = jaxfn.autograd_function(lambda ctx, x, w: (_ for _ in ()).throw(RuntimeError("boom")), lambda ctx, g: g)
    report = jaxfn.compare(boom, Scale, X, W)
    assert not report and report.rows[0].port == "raised RuntimeError: boom"
    assert "1 disagreement\n" in str(report)  # one row: the singular
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


class SinTimes(torch.autograd.Function):  # sin(x) * y
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return torch.sin(x) * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * torch.cos(x) * y, g * torch.sin(x)


def _sin_times_port(wrong_without_y):
    class Port(jaxfn.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return jnp.sin(x) * y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            if wrong_without_y and not ctx.needs_input_grad[1]:  # right at first order, flat at second
                return g * jnp.cos(jax.lax.stop_gradient(x)) * y, None
            return g * jnp.cos(x) * y, g * jnp.sin(x)

    return Port


def test_a_second_derivative_wrong_only_where_an_argument_is_not_differentiated_disagrees():
    wrong = _sin_times_port(wrong_without_y=True)
    assert jaxfn.compare(wrong, SinTimes, X, W)  # first order cannot see it
    report = jaxfn.compare(wrong, SinTimes, X, W, order=2)
    assert not report and {r.check for r in report.rows} == {"second derivative needs_input_grad=(True, False)"}, str(
        report
    )
    assert [r.where for r in report.rows] == ["parameter 'x'"], str(report)
    report = jaxfn.compare(_sin_times_port(wrong_without_y=False), SinTimes, X, W, order=2)
    assert report, str(report)
    assert [c for c in report.checks if c.startswith("second")] == [
        "second derivative",
        "second derivative needs_input_grad=(True, False)",
        "second derivative needs_input_grad=(False, True)",
    ]
    assert not any("second" in line for line in report.not_compared), str(report)


class CosOnce(torch.autograd.Function):  # cos, differentiable once only
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.cos(x)

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("CosOnce has no second derivative")


class SinTimesOnceWithoutY(torch.autograd.Function):  # sin(x) * y; no second derivative where y is not differentiated
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return torch.sin(x) * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return g * CosOnce.apply(x) * y, None
        return g * torch.cos(x) * y, g * torch.sin(x)


def test_a_second_derivative_the_original_refuses_for_one_set_is_listed_and_the_others_compared():
    report = jaxfn.compare(_sin_times_port(wrong_without_y=False), SinTimesOnceWithoutY, X, W, order=2)
    assert report, str(report)
    assert "second derivative" in report.checks and "second derivative needs_input_grad=(False, True)" in report.checks
    assert "second derivative needs_input_grad=(True, False)" not in report.checks
    assert (
        "second derivative needs_input_grad=(True, False) not compared: the original raised RuntimeError (CosOnce has "
        "no second derivative)" in report.not_compared
    ), str(report)


def test_order_must_be_1_or_2():
    with pytest.raises(ValueError, match=r"'Scale': jaxfn.compare's order must be 1 or 2, but got 3"):
        jaxfn.compare(_scale_port(), Scale, X, W, order=3)


# -- vmap: each array argument batched alone, and at a non-zero axis, as well as all at axis 0 ------


class MulV(torch.autograd.Function):  # x * w with a vmap rule right for every in_dims
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
        x = x.movedim(in_dims[0], 0) if in_dims[0] is not None else x
        w = w.movedim(in_dims[1], 0) if in_dims[1] is not None else w
        return x * w, 0


class DotV(torch.autograd.Function):  # (x * w).sum() with a vmap rule right for every in_dims
    @staticmethod
    def forward(x, w):
        return (x * w).sum()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, g * x

    @staticmethod
    def vmap(info, in_dims, x, w):
        x = x.movedim(in_dims[0], 0) if in_dims[0] is not None else x
        w = w.movedim(in_dims[1], 0) if in_dims[1] is not None else w
        return (x * w).sum(-1), 0


def _mul_port(rule, forward=lambda x, w: x * w):
    class Port(jaxfn.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return forward(x, w)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g * w, g * x

        vmap = staticmethod(rule)

    return Port


def _moved(in_dims, *arrays):
    return [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(arrays, in_dims)]


def test_a_vmap_rule_wrong_for_an_unbatched_argument_disagrees():
    def assumes_w_batched(info, in_dims, x, w):  # indexes w's batch axis, which an unbatched w lacks
        x, w = _moved(in_dims, x, w)
        return x * w[:, :1] * 0 + x * w, 0

    report = jaxfn.compare(_mul_port(assumes_w_batched), MulV, X, W)
    assert not report, str(report)
    assert all(r.check.startswith("vmap") for r in report.rows), str(report)
    assert any("w=None" in r.check for r in report.rows), str(report)

    def sums_after_x_s_batch_axis(info, in_dims, x, w):  # reads x's ndim as if x were batched
        x, w = _moved(in_dims, x, w)
        return (x * w).sum(axis=tuple(range(1, x.ndim))), 0

    report = jaxfn.compare(_mul_port(sums_after_x_s_batch_axis, lambda x, w: (x * w).sum()), DotV, X, W)
    assert not report, str(report)
    assert "vmap in_dims=(x=None, w=0)" in [r.check for r in report.rows], str(report)
    assert all("x=None" in r.check for r in report.rows), str(report)


def test_a_vmap_rule_wrong_for_a_non_zero_batch_axis_disagrees():
    def flips_unless_axis_0(info, in_dims, x, w):  # treats a batch axis other than 0 as data
        out = jnp.multiply(*_moved(in_dims, x, w))
        return (out if set(in_dims) <= {0, None} else jnp.flip(out, -1)), 0

    def ignores_in_dims(info, in_dims, x, w):  # right only where every array is batched at 0
        return x * w, 0

    for rule in (flips_unless_axis_0, ignores_in_dims):
        x, w = X.reshape(2, 2), W.reshape(2, 2) + 3
        report = jaxfn.compare(_mul_port(rule), MulV, x, w)
        assert not report, str(report)
        assert "vmap in_dims=(x=0, w=0)" in report.checks
        assert all(r.check != "vmap in_dims=(x=0, w=0)" for r in report.rows), str(report)
        assert any(r.check.startswith("vmap") and "=2" in r.check for r in report.rows), str(report)


def test_a_vmap_rule_right_for_every_in_dims_agrees_and_each_batching_is_a_check():
    def right(info, in_dims, x, w):
        x, w = _moved(in_dims, x, w)
        return x * w, 0

    x, w = X.reshape(2, 2), W.reshape(2, 2)
    report = jaxfn.compare(_mul_port(right), MulV, x, w)
    assert report, str(report)
    vmaps = [c for c in report.checks if c.startswith("vmap")]
    assert {"vmap in_dims=(x=0, w=0)", "vmap in_dims=(x=0, w=None)", "vmap in_dims=(x=None, w=0)"} <= set(vmaps)
    assert {"vmap in_dims=(x=2, w=2)", "vmap in_dims=(x=1, w=1)", "vmap in_dims=(x=2, w=None)"} <= set(vmaps)
    assert jaxfn.compare(_mul_port(right), MulV, X, W)


class NoneMulV(torch.autograd.Function):  # (None, x * w) with a vmap rule right for every in_dims
    @staticmethod
    def forward(x, w):
        return None, x * w

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g_none, g):
        x, w = ctx.saved_tensors
        return g * w, g * x

    @staticmethod
    def vmap(info, in_dims, x, w):
        x = x.movedim(in_dims[0], 0) if in_dims[0] is not None else x
        w = w.movedim(in_dims[1], 0) if in_dims[1] is not None else w
        return NoneMulV.apply(x, w), (None, 0)


def test_a_vmap_rule_of_a_function_with_a_none_output_is_compared():
    """torch.func.vmap takes only tensors as outputs: the original's None output is kept apart, so
    the vmap checks run (not listed as not compared), and a wrong port's rule disagrees."""

    def port(flip):
        class Port(jaxfn.Function):
            @staticmethod
            def forward(ctx, x, w):
                ctx.save_for_backward(x, w)
                return None, x * w

            @staticmethod
            def backward(ctx, g_none, g):
                x, w = ctx.saved_tensors
                return g * w, g * x

            @staticmethod
            def vmap(info, in_dims, x, w):
                out = jnp.multiply(*_moved(in_dims, x, w))
                return (None, jnp.flip(out, -1) if flip else out), (None, 0)

        return Port

    report = jaxfn.compare(port(False), NoneMulV, X, W)
    assert report and "vmap in_dims=(x=0, w=0)" in report.checks, str(report)
    assert not any(n.startswith("vmap") for n in report.not_compared), str(report)
    report = jaxfn.compare(port(True), NoneMulV, X, W)
    assert not report and any(r.check.startswith("vmap") for r in report.rows), str(report)


class AddMulV(torch.autograd.Function):  # x * y + z with a vmap rule right for every in_dims
    @staticmethod
    def forward(x, y, z):
        return x * y + z

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:2])

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x, g

    @staticmethod
    def vmap(info, in_dims, x, y, z):
        x, y, z = (a if d is None else a.movedim(d, 0) for a, d in zip((x, y, z), in_dims))
        return x * y + z, 0


def _add_mul_port(wrong_where):
    class Port(jaxfn.Function):
        @staticmethod
        def forward(ctx, x, y, z):
            ctx.save_for_backward(x, y)
            return x * y + z

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y, g * x, g

        @staticmethod
        def vmap(info, in_dims, x, y, z):
            out = jnp.multiply(*_moved(in_dims[:2], x, y)) + _moved(in_dims[2:], z)[0]
            batched = tuple(d is not None for d in in_dims)
            return (out + 1.0 if batched == wrong_where else out), 0

    return Port


def test_a_vmap_rule_wrong_for_one_set_of_batched_arguments_disagrees_and_every_set_is_a_check():
    z = RNG.standard_normal(4)
    report = jaxfn.compare(_add_mul_port(wrong_where=(False, True, True)), AddMulV, X, W, z)
    assert not report, str(report)
    assert {r.check for r in report.rows} == {"vmap in_dims=(x=None, y=0, z=0)", "vmap in_dims=(x=None, y=1, z=1)"}
    report = jaxfn.compare(_add_mul_port(wrong_where=None), AddMulV, X, W, z)
    assert report, str(report)
    masks = [(0, None, None), (None, 0, None), (None, None, 0), (0, 0, None), (0, None, 0), (None, 0, 0), (0, 0, 0)]
    last = [tuple(None if d is None else d + 1 for d in m) for m in masks]  # 1-D arrays: the last axis is 1
    want = {f"vmap in_dims=(x={a}, y={b}, z={c})" for a, b, c in masks + last}
    assert {c for c in report.checks if c.startswith("vmap")} == want, str(report)
    assert not any(line.startswith("vmap") for line in report.not_compared), str(report)


class Sum7V(torch.autograd.Function):  # a0 + ... + a6 with a vmap rule right for every in_dims
    @staticmethod
    def forward(*a):
        return sum(a[1:], a[0] * 1.0)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return tuple(g for _ in range(7))

    @staticmethod
    def vmap(info, in_dims, *a):
        a = [v if d is None else v.movedim(d, 0) for v, d in zip(a, in_dims)]
        return sum(a[1:], a[0] * 1.0), 0


def _sum_vmap_port(wrong_where):
    def forward(ctx, *a):
        return sum(a[1:], a[0] * 1.0)

    def backward(ctx, g):
        return (g,) * 7

    def vmap(info, in_dims, *a):
        out = sum(_moved(in_dims[1:], *a[1:]), _moved(in_dims[:1], a[0])[0] * 1.0)
        batched = tuple(i for i, d in enumerate(in_dims) if d is not None)
        return (out * 5 if batched == wrong_where else out), 0

    return jaxfn.autograd_function(forward, backward, vmap=vmap, name="sum7")


def test_with_seven_arguments_the_batchings_not_compared_are_listed():
    report = jaxfn.compare(_sum_vmap_port(wrong_where=(0, 1)), Sum7V, *SEVEN)
    assert not report, str(report)
    assert {r.check for r in report.rows} == {
        f"vmap in_dims=(args[0]={d}, args[1]={d}, args[2]=None, args[3]=None, args[4]=None, args[5]=None, args[6]=None)"
        for d in (0, 1)
    }, str(report)
    report = jaxfn.compare(_sum_vmap_port(wrong_where=()), Sum7V, *SEVEN)
    assert report and sum(c.startswith("vmap") for c in report.checks) == 2 * (7 + 21 + 7 + 1), str(report)
    assert any(
        line.startswith("vmap not compared for 91 of the 127 sets of batched arrays") and "3 to 5" in line
        for line in report.not_compared
    ), str(report)
    report = jaxfn.compare(_sum_vmap_port(wrong_where=(0, 1, 2)), Sum7V, *SEVEN)  # one not compared: listed
    assert report and "vmap not compared for 91 of the 127" in str(report)


# -- gradients for every needs_input_grad subset, or the ones left out listed ---------------------


class Sum7(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *a):
        return sum(a[1:], a[0] * 1.0)

    @staticmethod
    def backward(ctx, g):
        return tuple(g for _ in range(7))


def _sum_port(wrong_for):
    def forward(ctx, a0, a1, a2, a3, a4, a5, a6):
        return a0 + a1 + a2 + a3 + a4 + a5 + a6

    def backward(ctx, g):
        chosen = tuple(i for i, n in enumerate(ctx.needs_input_grad) if n)
        return (g * 5 if chosen == wrong_for else g,) + (g,) * 6

    return jaxfn.autograd_function(forward, backward, name="sum7")


SEVEN = [np.full(2, float(i)) for i in range(7)]


def test_with_seven_arguments_a_port_wrong_for_one_pair_disagrees():
    report = jaxfn.compare(_sum_port(wrong_for=(0, 1)), Sum7, *SEVEN)
    assert not report, str(report)
    assert {r.check for r in report.rows} == {
        "gradient needs_input_grad=(True, True, False, False, False, False, False)"
    }


def test_with_seven_arguments_the_subsets_not_compared_are_listed():
    report = jaxfn.compare(_sum_port(wrong_for=()), Sum7, *SEVEN)
    assert report, str(report)
    assert sum(c.startswith("gradient") for c in report.checks) == 7 + 21 + 7 + 1
    assert any(
        line.startswith("gradients not compared for 91 of the 127 needs_input_grad subsets") and "3 to 5" in line
        for line in report.not_compared
    ), str(report)
    # one wrong for all but one is compared; one wrong for three (not compared) is listed, never "all"
    assert not jaxfn.compare(_sum_port(wrong_for=(0, 1, 2, 3, 4, 5)), Sum7, *SEVEN)
    report = jaxfn.compare(_sum_port(wrong_for=(0, 1, 2)), Sum7, *SEVEN)
    assert report and "91 of the 127" in str(report)


def test_with_seven_arguments_the_second_derivative_subsets_not_compared_are_listed():
    def port(wrong_for):
        def forward(ctx, a0, a1, a2, a3, a4, a5, a6):
            return a0 + a1 + a2 + a3 + a4 + a5 + a6

        def backward(ctx, g):  # g where wrong too, but then with a derivative of its own along a0
            chosen = tuple(i for i, n in enumerate(ctx.needs_input_grad) if n)
            a0 = ctx.saved_tensors[0]
            return (g * (1 + a0 - jax.lax.stop_gradient(a0)) if chosen == wrong_for else g,) + (g,) * 6

        def save(ctx, a0, *rest):
            ctx.save_for_backward(a0)
            return forward(ctx, a0, *rest)

        return jaxfn.autograd_function(save, backward, name="sum7")

    report = jaxfn.compare(port(wrong_for=(0, 1)), Sum7, *SEVEN, order=2)
    assert not report, str(report)
    assert {r.check for r in report.rows} == {
        "second derivative needs_input_grad=(True, True, False, False, False, False, False)"
    }, str(report)
    report = jaxfn.compare(port(wrong_for=()), Sum7, *SEVEN, order=2)
    assert report and sum(c.startswith("second") for c in report.checks) == 7 + 21 + 7 + 1, str(report)
    assert any(
        line.startswith("second derivatives not compared for 91 of the 127 needs_input_grad subsets")
        and "3 to 5" in line
        for line in report.not_compared
    ), str(report)
    report = jaxfn.compare(port(wrong_for=(0, 1, 2)), Sum7, *SEVEN, order=2)  # one of those not compared: listed
    assert report and "second derivatives not compared for 91 of the 127" in str(report)


def test_with_six_arguments_every_subset_is_compared():
    class Sum6(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *a):
            return sum(a[1:], a[0] * 1.0)

        @staticmethod
        def backward(ctx, g):
            return tuple(g for _ in range(6))

    def forward(ctx, a0, a1, a2, a3, a4, a5):
        return a0 + a1 + a2 + a3 + a4 + a5

    def backward(ctx, g):
        chosen = tuple(i for i, n in enumerate(ctx.needs_input_grad) if n)
        return (g * 5 if chosen == (0, 2, 4) else g,) + (g,) * 5

    report = jaxfn.compare(jaxfn.autograd_function(forward, backward, name="sum6"), Sum6, *SEVEN[:6])
    assert not report and sum(c.startswith("gradient") for c in report.checks) == 63, str(report)
    assert not any("subsets" in line for line in report.not_compared)


# -- a narrower dtype: per output, never loosening the others -------------------------------------


class WithHalfAux(torch.autograd.Function):  # a float64 result beside a float16 side output
    @staticmethod
    def forward(ctx, x):
        return x * 3.0, (x * 0).half()

    @staticmethod
    def backward(ctx, g, g_aux):
        return g * 3.0


def _aux_port(factor):
    return jaxfn.autograd_function(
        lambda ctx, x: (x * 3.0, (x * 0).astype(jnp.float16)), lambda ctx, g, g_aux: g * 3.0 * factor, name="aux"
    )


def test_a_narrow_side_output_loosens_only_itself():
    x = np.linspace(1, 2, 4)
    with jax.enable_x64(True):
        wrong = jaxfn.compare(_aux_port(1.004), WithHalfAux, x)  # 0.4% wrong in float64
        right = jaxfn.compare(_aux_port(1.0), WithHalfAux, x)
    assert not wrong, str(wrong)
    assert [(r.check, r.where) for r in wrong.rows] == [
        ("gradient needs_input_grad=(True,) from output 0", "parameter 'x'")
    ], str(wrong)
    assert right, str(right)
    note = next(n for n in right.notes if "float16" in n)
    assert "the original computes in float16 though its inputs are float64" in note and "output 1" in note, note
    assert "every value" not in note


def test_a_0_d_output_is_compared():
    def right(info, in_dims, x, w):
        x, w = _moved(in_dims, x, w)
        return (x * w).sum(-1), 0

    assert jaxfn.compare(_mul_port(right, lambda x, w: (x * w).sum()), DotV, X, W)
    assert not jaxfn.compare(_mul_port(right, lambda x, w: (x * w).sum() * 1.01), DotV, X, W)


# -- the ways a rule is called in normal use: integer batches, one tangent, one cotangent ---------


class Take(torch.autograd.Function):  # x[..., idx], PyTorch's vmap rule generated
    generate_vmap_rule = True

    @staticmethod
    def forward(x, idx):
        return x[..., idx]

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, idx = inputs
        ctx.save_for_backward(idx)
        ctx.n = x.shape[-1]

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        return torch.zeros(ctx.n, dtype=g.dtype).index_add(0, idx, g), None


def _take_port(first_only):
    def rule(info, in_dims, x, idx):
        x, idx = _moved(in_dims, x, idx)
        x = x if in_dims[0] is not None else jnp.broadcast_to(x, (info.batch_size, *x.shape))
        if in_dims[1] is None:
            return x[:, idx], 0
        if first_only:  # example 0's indices for every example
            return x[:, idx[0]], 0
        return jnp.take_along_axis(x, idx, axis=1), 0

    return jaxfn.autograd_function(
        lambda ctx, x, idx: (ctx.save_for_backward(idx), x[idx])[1],
        lambda ctx, g: (jnp.zeros(4, g.dtype).at[ctx.saved_tensors[0]].add(g), None),
        vmap=rule,
        name="take",
    )


def test_a_vmap_rule_reading_example_0_s_integer_argument_for_all_disagrees():
    x, idx = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 2])
    report = jaxfn.compare(_take_port(first_only=True), Take, x, idx)
    assert not report, str(report)
    assert any(r.check == "vmap in_dims=(x=None, idx=0)" for r in report.rows), str(report)
    assert all(r.check.startswith("vmap") and "idx=None" not in r.check for r in report.rows), str(report)
    assert jaxfn.compare(_take_port(first_only=False), Take, x, idx)


def test_an_integer_argument_holding_one_value_is_listed():
    report = jaxfn.compare(_take_port(first_only=True), Take, np.array([1.0, 2.0, 3.0, 4.0]), np.array([2, 2]))
    assert report and "'idx' holds one value only" in str(report), str(report)


class Masked(torch.autograd.Function):  # where(mask, x, 0)
    @staticmethod
    def forward(x, mask):
        return torch.where(mask, x, torch.zeros_like(x))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return torch.where(mask, g, torch.zeros_like(g)), None

    @staticmethod
    def vmap(info, in_dims, x, mask):
        x = x.movedim(in_dims[0], 0) if in_dims[0] is not None else x
        mask = mask.movedim(in_dims[1], 0) if in_dims[1] is not None else mask
        return torch.where(mask, x, torch.zeros_like(x)), 0


class Relu(torch.autograd.Function):  # max(x, 0), with a vmap rule right for every in_dims
    @staticmethod
    def forward(x):
        return x.clamp(min=0)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x > 0)

    @staticmethod
    def vmap(info, in_dims, x):
        return x.movedim(in_dims[0], 0).clamp(min=0), 0


def test_a_vmap_rule_reading_example_0_s_boolean_argument_for_all_disagrees():
    def masked(first_only):
        def rule(info, in_dims, x, mask):
            x, mask = _moved(in_dims, x, mask)
            x = x if in_dims[0] is not None else jnp.broadcast_to(x, (info.batch_size, *x.shape))
            return jnp.where(mask[0] if first_only and in_dims[1] is not None else mask, x, 0), 0

        return jaxfn.autograd_function(
            lambda ctx, x, mask: (ctx.save_for_backward(mask), jnp.where(mask, x, 0))[1],
            lambda ctx, g: (jnp.where(ctx.saved_tensors[0], g, 0), None),
            vmap=rule,
            name="masked",
        )

    mask = np.array([True, False, True, True])
    report = jaxfn.compare(masked(first_only=True), Masked, X, mask)
    assert not report and all(r.check.startswith("vmap") and "mask=None" not in r.check for r in report.rows)
    assert "vmap in_dims=(x=None, mask=0)" in [r.check for r in report.rows], str(report)
    assert jaxfn.compare(masked(first_only=False), Masked, X, mask)


def test_a_vmap_rule_mixing_float_examples_disagrees():
    def sign_of_example_0(info, in_dims, x):  # the decision (x > 0) of example 0 for every example
        x = jnp.moveaxis(x, in_dims[0], 0)
        return x * (x[0] > 0), 0

    def right(info, in_dims, x):
        return jnp.maximum(jnp.moveaxis(x, in_dims[0], 0), 0), 0

    def relu(rule):
        return jaxfn.autograd_function(
            lambda ctx, x: (ctx.save_for_backward(x), jnp.maximum(x, 0))[1],
            lambda ctx, g: g * (ctx.saved_tensors[0] > 0),
            vmap=rule,
            name="relu",
        )

    x = np.array([0.3, -0.2, 0.25, -0.4, 0.1, -0.15])
    assert not jaxfn.compare(relu(sign_of_example_0), Relu, x)
    assert jaxfn.compare(relu(right), Relu, x)


class MulJ(torch.autograd.Function):  # x * y with a jvp rule
    @staticmethod
    def forward(x, y):
        return x * y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x

    @staticmethod
    def jvp(ctx, tx, ty):
        x, y = ctx.saved_tensors
        return tx * y + ty * x


def test_a_jvp_rule_wrong_for_one_tangent_alone_disagrees():
    def wrong_for_none(ctx, tx, ty):  # set_materialize_grads(False): a tangent not given is None
        x, y = ctx.saved_tensors
        if ty is None:
            return 2 * tx * y
        return ty * x if tx is None else tx * y + ty * x

    report = jaxfn.compare(make_mul_with_jvp(wrong_for_none, materialize=False), MulJ, X, W)
    assert [r.check for r in report.rows] == ["jvp of 'x' alone"], str(report)

    def wrong_for_y_constant(ctx, tx, ty):  # reads needs_input_grad: y not differentiated
        x, y = ctx.saved_tensors
        return 3 * tx * y if not ctx.needs[1] else tx * y + ty * x

    report = jaxfn.compare(make_mul_with_jvp(wrong_for_y_constant), MulJ, X, W)
    assert not report and all(r.check == "jvp of 'x' alone" for r in report.rows), str(report)

    def right(ctx, tx, ty):
        x, y = ctx.saved_tensors
        return (0 if tx is None else tx * y) + (0 if ty is None else ty * x)

    report = jaxfn.compare(make_mul_with_jvp(right, materialize=False), MulJ, X, W)
    assert report and {"jvp", "jvp of 'x' alone", "jvp of 'y' alone"} <= set(report.checks), str(report)


class TwoOut(torch.autograd.Function):  # (2x + y, x * y)
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * 2.0 + y, x * y

    @staticmethod
    def backward(ctx, g0, g1):
        x, y = ctx.saved_tensors
        return g0 * 2.0 + g1 * y, g0 + g1 * x


def _two_out_port(wrong_when):
    def forward(ctx, x, y):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, y)
        return x * 2.0 + y, x * y

    def backward(ctx, g0, g1):
        x, y = ctx.saved_tensors
        if g1 is None:
            return g0 * (3.0 if wrong_when == 1 else 2.0), g0
        if g0 is None:
            return g1 * y, g1 * x * (3.0 if wrong_when == 0 else 1.0)
        return g0 * 2.0 + g1 * y, g0 + g1 * x

    return jaxfn.autograd_function(forward, backward, name="two")


@pytest.mark.parametrize("wrong_when", [0, 1])
def test_a_backward_wrong_when_another_output_has_no_cotangent_disagrees(wrong_when):
    report = jaxfn.compare(_two_out_port(wrong_when), TwoOut, X, W)
    assert not report, str(report)
    alone = 1 - wrong_when
    assert all(r.check.endswith(f" from output {alone}") for r in report.rows), str(report)
    assert f"gradient needs_input_grad=(True, True) from output {alone}" in [r.check for r in report.rows]
    right = jaxfn.compare(_two_out_port(None), TwoOut, X, W)
    assert right and "gradient needs_input_grad=(True, False) from output 1" in right.checks, str(right)


class Gather2(torch.autograd.Function):  # x[idx[:, 0], idx[:, 1]], PyTorch's vmap rule generated
    generate_vmap_rule = True

    @staticmethod
    def forward(x, idx):
        return x[idx[:, 0], idx[:, 1]]

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return None, None


def test_a_batch_the_original_refuses_far_apart_is_compared_near_and_listed():
    port = jaxfn.autograd_function(
        lambda ctx, x, idx: x[idx[:, 0], idx[:, 1]], lambda ctx, g: (None, None), name="gather"
    )
    x, idx = RNG.standard_normal((1, 4)), np.array([[0, 3]])  # idx's values permuted: row 3 of 1, out of range
    report = jaxfn.compare(port, Gather2, x, idx)
    assert report and "vmap in_dims=(x=None, idx=0)" in report.checks, str(report)
    assert (
        "vmap with in_dims=(x=None, idx=0) compared only on a batch of two examples (integers and booleans the "
        "same): the original raised IndexError" in str(report)
    ), str(report)


class Three(torch.autograd.Function):  # (x + 2y + 3z, x * y, y * z), with a jvp rule
    @staticmethod
    def forward(x, y, z):
        return x + 2 * y + 3 * z, x * y, y * z

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def backward(ctx, g0, g1, g2):
        x, y, z = ctx.saved_tensors
        return g0 + g1 * y, 2 * g0 + g1 * x + g2 * z, 3 * g0 + g2 * y

    @staticmethod
    def jvp(ctx, tx, ty, tz):
        x, y, z = ctx.saved_tensors
        return tx + 2 * ty + 3 * tz, tx * y + x * ty, ty * z + y * tz


def _three_port(wrong_jvp=False, wrong_backward=False):
    def forward(ctx, x, y, z):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, y, z)
        ctx.save_for_forward(x, y, z)
        return x + 2 * y + 3 * z, x * y, y * z

    def zero(v):
        return 0 if v is None else v

    def backward(ctx, g0, g1, g2):
        x, y, z = ctx.saved_tensors
        if wrong_backward and g2 is None and g0 is not None and g1 is not None:
            return g0 + g1 * y, 2 * g0 + g1 * x, 0 * g0  # forgets z's part of output 0
        g0, g1, g2 = zero(g0), zero(g1), zero(g2)
        return g0 + g1 * y, 2 * g0 + g1 * x + g2 * z, 3 * g0 + g2 * y

    def jvp(ctx, tx, ty, tz):
        x, y, z = ctx.saved_tensors
        if wrong_jvp and tz is None and tx is not None and ty is not None:
            return tx + 2 * ty, tx * y + 2 * x * ty, ty * z  # wrong where z alone is not perturbed
        tx, ty, tz = zero(tx), zero(ty), zero(tz)
        return tx + 2 * ty + 3 * tz, tx * y + x * ty, ty * z + y * tz

    return jaxfn.autograd_function(forward, backward, jvp=jvp, name="three")


def test_a_jvp_rule_wrong_when_all_but_one_argument_is_perturbed_disagrees():
    z = RNG.standard_normal(4)
    report = jaxfn.compare(_three_port(wrong_jvp=True), Three, X, W, z)
    assert not report and {r.check for r in report.rows} == {"jvp of 'x', 'y' alone"}, str(report)
    report = jaxfn.compare(_three_port(), Three, X, W, z)
    assert report and "jvp of 'z' alone" in report.checks and "jvp of 'y', 'z' alone" in report.checks


def test_a_backward_wrong_when_one_of_three_outputs_has_no_cotangent_disagrees():
    z = RNG.standard_normal(4)
    report = jaxfn.compare(_three_port(wrong_backward=True), Three, X, W, z)
    assert not report and all(r.check.endswith(" from outputs 0, 1") for r in report.rows), str(report)
    report = jaxfn.compare(_three_port(), Three, X, W, z)
    assert report and "gradient needs_input_grad=(True, True, True) from output 2" in report.checks, str(report)
    assert "not compared for 3 of the 7 needs_input_grad subsets" not in str(report)


class XOnly(torch.autograd.Function):  # x * y whose backward gives no gradient for y (None)
    @staticmethod
    def forward(ctx, x, y):
        return x * y.detach()

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, None


def test_a_none_gradient_of_the_original_is_a_zero_of_the_port_s_dtype_with_x64_off():
    """Where the original gives no gradient (None), the port's is compared with zeros of its own
    dtype: no note of a float32 port against float64 where the original gave nothing."""
    port = jaxfn.autograd_function(lambda ctx, x, y: x * y, lambda ctx, g: (g * 2.0, None), name="xonly")
    with jax.enable_x64(False):
        report = jaxfn.compare(port, XOnly, np.linspace(1, 2, 4, dtype=np.float32), np.full(4, 2.0, np.float32))
    assert report, str(report)
    assert not any("where the original has float64" in n for n in report.notes), str(report)
