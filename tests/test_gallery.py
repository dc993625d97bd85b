"""The gallery (examples/gallery): each entry's backward, forward and qualitative claim.

Backwards are gradchecked against finite differences (or, for the deliberately "wrong" gradients
of the straight-through estimator and gradient reversal, against ``jax.grad`` of the surrogate
they stand for); forwards against the plain math; claims by XLA's memory report, NaN vs finite,
and loss curves. Timings stay out of the tests.
"""

import importlib
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxfn

pytestmark = pytest.mark.slow  # compiles the gallery's programs and trains small models

GALLERY = Path(__file__).resolve().parent.parent / "examples" / "gallery"
if str(GALLERY) not in sys.path:
    sys.path.insert(0, str(GALLERY))

gallery = importlib.import_module("_gallery")
lce = importlib.import_module("linear_cross_entropy")
deq = importlib.import_module("deq_fixed_point")
nan_free = importlib.import_module("nan_free_gradients")
ste = importlib.import_module("straight_through")
reversal = importlib.import_module("gradient_reversal")
clipping = importlib.import_module("gradient_clipping")
silu = importlib.import_module("memory_saving_silu")
ports = importlib.import_module("pytorch_ports")

f32 = jnp.float32


def _temp_bytes(f, *args):
    return gallery.memory(gallery.compiled(f, *args))["temp"]


# 1. Linear + cross-entropy without the logits


def test_linear_cross_entropy_gradcheck():
    x, w, t = lce.example_inputs(tokens=8, hidden=3, vocab=6)
    assert jaxfn.gradcheck(lce.linear_cross_entropy, x, w, t, 4, 2)  # 2 x 3 blocks of 4 tokens x 2 vocab


def _assert_linear_cross_entropy_matches_plain(transform, argnums, cotangent=1.0):
    x, w, t = lce.example_inputs(tokens=64, hidden=16, vocab=100)

    def loss(x, w):
        return cotangent * lce.linear_cross_entropy(x, w, t, 16, 25)  # 4 x 4 blocks

    value, grads = transform(jax.value_and_grad(loss, argnums))(x, w)
    plain = jax.jit(jax.value_and_grad(lambda x, w: cotangent * lce.plain_loss(x, w, t), argnums))
    plain_value, plain_grads = plain(x, w)
    assert value.dtype == f32
    np.testing.assert_allclose(value, plain_value, rtol=1e-5)
    for g, p in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(plain_grads), strict=True):
        assert g.dtype == f32
        np.testing.assert_allclose(g, p, rtol=1e-4, atol=1e-7 * abs(cotangent))
    np.testing.assert_allclose(lce.linear_cross_entropy(x, w, t, 16, 25), plain_value / cotangent, rtol=1e-5)  # no grad


def test_linear_cross_entropy_matches_plain_float32(maybe_jit):
    _assert_linear_cross_entropy_matches_plain(maybe_jit, (0, 1))


@pytest.mark.parametrize("argnums", [0, 1])
def test_linear_cross_entropy_one_gradient(argnums):
    """Only the gradient asked for is computed (needs_input_grad in backward) and it is right."""
    _assert_linear_cross_entropy_matches_plain(jax.jit, argnums)


def test_linear_cross_entropy_scales_by_the_cotangent(maybe_jit):
    """Backward folds grad_output into its blocks: a loss scaled by 3 gets 3 times the gradients."""
    _assert_linear_cross_entropy_matches_plain(maybe_jit, (0, 1), cotangent=3.0)


def test_linear_cross_entropy_default_chunks_fit_small_inputs():
    x, w, t = lce.example_inputs(tokens=8, hidden=4, vocab=10)  # smaller than the default blocks
    np.testing.assert_allclose(lce.linear_cross_entropy(x, w, t), lce.plain_loss(x, w, t), rtol=1e-6)


def test_linear_cross_entropy_contenders_agree():
    """Every layout in the entry's table computes the same loss and gradients as plain autodiff."""
    x, w, t = lce.example_inputs(tokens=64, hidden=16, vocab=100)
    plain_value, plain_grads = jax.jit(lce.loss_and_grads(lce.plain_loss))(x, w, t)
    for name, loss in lce.contenders(chunk=16, vocab_chunks=[25, 50], token_chunk=16).items():
        value, grads = jax.jit(lce.loss_and_grads(loss))(x, w, t)
        np.testing.assert_allclose(value, plain_value, rtol=1e-5, err_msg=name)
        assert lce.relative_error(grads, plain_grads) < 1e-5, name


def _lce_temps(tokens, hidden, vocab, loss, scaled=False):
    """Compiled loss+grad temporaries (nothing runs); ``scaled``: the loss times a runtime scalar."""
    shapes = lce.example_shapes(tokens, hidden, vocab)
    if not scaled:
        return _temp_bytes(lce.loss_and_grads(loss), *shapes)
    scaled_loss = jax.grad(lambda x, w, t, s: s * loss(x, w, t), argnums=(0, 1))
    return _temp_bytes(scaled_loss, *shapes, jax.ShapeDtypeStruct((), f32))


def test_linear_cross_entropy_memory_small():
    """Less than the best plain-JAX layout (a vocab-chunked scan) at the same vocab chunk, and less
    than one copy of the weight in all, also when the cotangent is not the constant 1."""
    tokens, hidden, vocab = 1024, 128, 16000
    weight_bytes = vocab * hidden * 4
    contenders = lce.contenders(chunk=128, vocab_chunks=[500, 1000], token_chunk=128)
    temps = {name: _lce_temps(tokens, hidden, vocab, f) for name, f in contenders.items()}
    plain_jax = min(temp for name, temp in temps.items() if not name.startswith("jaxfn"))
    assert plain_jax == temps["lax.scan over vocab chunks of 500"]
    for v in (500, 1000):
        assert temps[f"jaxfn, blocks of 128 tokens x {v} vocab"] <= temps[f"lax.scan over vocab chunks of {v}"]
    fused = temps["jaxfn, blocks of 128 tokens x 500 vocab"]
    scaled = _lce_temps(tokens, hidden, vocab, contenders["jaxfn, blocks of 128 tokens x 500 vocab"], scaled=True)
    assert fused < weight_bytes / 4 and scaled < weight_bytes / 4
    assert temps["plain autodiff"] > tokens * vocab * 4  # the logits


def test_linear_cross_entropy_memory_at_the_issue_size():
    """Compiled only (nothing runs): tokens 4096, hidden 512, vocab 32000, float32."""
    temps = {name: _lce_temps(4096, 512, 32000, f) for name, f in lce.contenders(vocab_chunks=[500, 2000]).items()}
    fused = temps["jaxfn, blocks of 1024 tokens x 500 vocab"]
    assert temps["plain autodiff"] > 1e9  # the (tokens, vocab) logits and their gradient
    assert fused * 100 <= temps["plain autodiff"]
    assert fused < temps["lax.scan over token chunks of 128"]
    assert fused <= temps["lax.scan over vocab chunks of 500"]
    assert temps["jaxfn, blocks of 1024 tokens x 2000 vocab"] <= temps["lax.scan over vocab chunks of 2000"]
    assert fused < 32000 * 512 * 4 / 4  # nothing weight-sized


def test_linear_cross_entropy_compiles_like_a_hand_written_custom_vjp():
    """The memory is the algorithm's: jaxfn's gradient needs what jax.custom_vjp of the same passes needs."""

    @jax.custom_vjp
    def hand_written(x, w, t):
        return hand_written_fwd(x, w, t)[0]

    def hand_written_fwd(x, w, t):
        lse, picked = lce._loss_terms(x, w, t, 128, 500)
        return jnp.sum(lse - picked) / x.shape[0], (x, w, t, lse)

    def hand_written_bwd(residuals, g):
        x, w, t, lse = residuals
        return (*lce._gradients(x, w, t, lse, g / x.shape[0], 128, 500, True, True), None)

    hand_written.defvjp(hand_written_fwd, hand_written_bwd)
    ours = _lce_temps(1024, 128, 16000, lambda x, w, t: lce.linear_cross_entropy(x, w, t, 128, 500))
    assert ours == _lce_temps(1024, 128, 16000, hand_written)


def test_linear_cross_entropy_chunk_must_divide():
    x, w, t = lce.example_inputs(tokens=10, hidden=3, vocab=6)
    with pytest.raises(ValueError, match="tokens \\(10\\) must be a multiple of chunk \\(4\\)"):
        lce.linear_cross_entropy(x, w, t, 4)
    with pytest.raises(ValueError, match="vocab \\(6\\) must be a multiple of vocab_chunk \\(4\\)"):
        lce.linear_cross_entropy(x, w, t, 5, 4)


def test_linear_cross_entropy_plot(plot_png, capsys):
    """``--plot`` draws temporaries against vocabulary size and prints the plotted numbers."""
    png = plot_png
    lce.main([*"--small --memory-only --vocab-chunks 500 1000 --plot-vocabs 2000 4000 --plot".split(), str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "| 4,000 |" in out and "(chunk 500)" in out


# 2. Implicit differentiation of a fixed point


def test_fixed_point_plot(plot_png, capsys):
    """``--plot`` draws temporaries against iterations: autodiff's grow, jaxfn's stay flat."""
    png = plot_png
    deq.main([*"--batch 4 --width 16 --features 4 --plot-iterations 10 100 --plot".split(), str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| 10 |", "| 100 |"))]
    (unrolled_10, jaxfn_10), (unrolled_100, jaxfn_100) = [
        [float(c.split()[0]) for c in r.split("|")[2:4]] for r in rows
    ]
    assert unrolled_100 > unrolled_10 and jaxfn_100 == jaxfn_10


def test_fixed_point_gradcheck():
    x, w, u, _ = deq.example_inputs(batch=3, width=4, features=2, dtype=jnp.float64)
    assert jaxfn.gradcheck(deq.deq_layer, x, w, u, 60)


def test_fixed_point_matches_unrolled_at_convergence(maybe_jit):
    args = deq.example_inputs(batch=8, width=16, features=4)
    plain = jax.jit(jax.grad(deq.loss(deq.plain_fixed_point, 100), (0, 1, 2)))(*args)
    implicit = maybe_jit(jax.grad(deq.loss(deq.deq_layer, 100), (0, 1, 2)))(*args)
    np.testing.assert_allclose(deq.deq_layer(*args[:3], 100), deq.plain_fixed_point(*args[:3], 100))
    z = deq.deq_layer(*args[:3], 100)
    np.testing.assert_allclose(z, jnp.tanh(z @ args[1].T + args[0] @ args[2].T), atol=1e-6)  # a fixed point
    for g, p in zip(implicit, plain):
        np.testing.assert_allclose(g, p, atol=1e-4)


def test_fixed_point_of_an_equinox_layer_matches_unrolled():
    """The layer as an Equinox module (a pytree: its arrays are the argument's leaves) instead of a closure."""
    eqx = pytest.importorskip("equinox")

    class Layer(eqx.Module):
        weight: jax.Array
        injection: jax.Array

        def __call__(self, z):
            return jnp.tanh(z @ self.weight.T + self.injection)

    x, w, u, target = deq.example_inputs(batch=8, width=16, features=4)

    def loss(x, w, u):
        layer = Layer(w, x @ u.T)
        z = deq.fixed_point(layer, jnp.zeros((x.shape[0], w.shape[0]), x.dtype), 100)
        return 0.5 * jnp.sum((z - target) ** 2)

    got = jax.grad(loss, (0, 1, 2))(x, w, u)
    want = jax.grad(deq.loss(deq.plain_fixed_point, 100), (0, 1, 2))(x, w, u, target)
    for g, p in zip(got, want):
        np.testing.assert_allclose(g, p, atol=1e-4)


def test_fixed_point_memory_flat_while_unrolled_grows():
    args = deq.example_inputs(batch=16, width=32, features=8)
    temps = {
        (name, n): _temp_bytes(jax.grad(deq.loss(solve, n), (0, 1, 2)), *args)
        for name, solve in [("unrolled", deq.plain_fixed_point), ("jaxfn", deq.deq_layer)]
        for n in (10, 1000)
    }
    assert temps["jaxfn", 1000] == temps["jaxfn", 10]
    assert temps["unrolled", 1000] > 50 * temps["unrolled", 10]
    assert temps["unrolled", 1000] > 50 * temps["jaxfn", 1000]


# 3. Gradients that autodiff gets wrong at a point


def test_nan_free_gradcheck_and_forward():
    x = jnp.array([0.3, -1.2, 2.0], f32)
    assert jaxfn.gradcheck(nan_free.safe_norm, x)
    assert jaxfn.gradcheck(nan_free.xlogx, jnp.abs(x))
    np.testing.assert_allclose(nan_free.safe_norm(x), nan_free.plain_norm(x), rtol=1e-6)
    np.testing.assert_allclose(nan_free.xlogx(jnp.abs(x)), nan_free.plain_xlogx(jnp.abs(x)), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(nan_free.safe_norm)(x), jax.grad(nan_free.plain_norm)(x), rtol=1e-6)


def test_nan_free_at_the_bad_point(maybe_jit):
    zeros = jnp.zeros(3, f32)
    assert jnp.isnan(jax.grad(nan_free.plain_norm)(zeros)).all()
    np.testing.assert_array_equal(maybe_jit(jax.grad(nan_free.safe_norm))(zeros), zeros)
    assert jnp.isnan(jax.grad(nan_free.plain_xlogx)(f32(0)))
    got = maybe_jit(jax.grad(nan_free.xlogx))(f32(0))
    np.testing.assert_allclose(got, np.log(np.finfo(np.float32).tiny) + 1, rtol=1e-6)
    assert nan_free.xlogx(f32(0)) == 0


def test_nan_free_training():
    plain, fixed = nan_free.train(nan_free.plain_norm, 50), nan_free.train(nan_free.safe_norm, 50)
    assert jnp.isfinite(plain[0]) and jnp.isnan(plain[1:]).all()
    assert jnp.isfinite(fixed).all() and fixed[-1] < fixed[0] / 5


# 4. Straight-through estimators


def test_straight_through_forward_is_the_quantizer():
    w = jnp.asarray(np.random.default_rng(0).uniform(-1.5, 1.5, 50), f32)
    np.testing.assert_array_equal(ste.quantize(w, 3), ste.plain_quantize(w, 3))
    assert set(np.unique(np.asarray(ste.quantize(w, 3)) * 3).tolist()) <= {-3, -2, -1, 0, 1, 2, 3}
    np.testing.assert_array_equal(ste.binarize(w), jnp.sign(w))


@pytest.mark.parametrize("kind", ["quantize", "binarize"])
def test_straight_through_backward_is_the_clip_gradient(maybe_jit, kind):
    rng = np.random.default_rng(0)
    w, c = jnp.asarray(rng.uniform(-1.5, 1.5, 50), f32), jnp.asarray(rng.standard_normal(50), f32)
    quantizer, plain = {
        "quantize": (lambda w: ste.quantize(w, 3), lambda w: ste.plain_quantize(w, 3)),
        "binarize": (ste.binarize, ste.plain_binarize),
    }[kind]
    got = maybe_jit(jax.grad(lambda w: jnp.vdot(quantizer(w), c)))(w)
    np.testing.assert_array_equal(got, jax.grad(lambda w: jnp.vdot(jnp.clip(w, -1, 1), c))(w))
    assert not jnp.any(jax.grad(lambda w: jnp.vdot(plain(w), c))(w))  # plain autodiff: zero everywhere


def test_straight_through_gradcheck():
    """The backward is the exact gradient of clip(w, -1, 1), and (on purpose) not of round."""
    w = jnp.array([-1.4, -0.63, 0.12, 0.51, 1.3], f32)
    clip = jaxfn.autograd_function(
        lambda ctx, w: (ctx.save_for_backward(w=w), jnp.clip(w, -1, 1))[1], ste.straight_through_backward
    )
    assert jaxfn.gradcheck(clip, w)
    assert not jaxfn.gradcheck(ste.quantize, w, 3, raise_exception=False)


@pytest.mark.parametrize(
    "network", [0, 1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)]
)
def test_straight_through_trains_where_autodiff_is_flat(network):
    name, quantizers = list(ste.networks(4).items())[network]
    losses, _ = jax.jit(ste.train, static_argnums=(0, 1))(quantizers, 100)
    if "plain autodiff" in name:
        np.testing.assert_array_equal(losses, losses[0])
    else:
        assert losses[-1] < 0.8 * losses[0], name


# 5. Gradient reversal


def test_gradient_reversal_gradcheck_surrogate():
    """The backward is the exact gradient of -lambda * x (not of the identity it computes)."""
    x = jnp.array([0.5, -2.0, 3.0], f32)
    negate = jaxfn.autograd_function(
        lambda ctx, x, lambda_: (ctx.save_for_backward(lambda_=lambda_), -lambda_ * x)[1], reversal._backward
    )
    assert jaxfn.gradcheck(lambda x: negate(x, 0.7), x)  # lambda_ closed over: gradcheck perturbs Python floats
    np.testing.assert_array_equal(reversal.reverse_gradient(x, 0.7), x)


def test_gradient_reversal_under_jit_and_vmap():
    rng = np.random.default_rng(0)
    xs, cs = jnp.asarray(rng.standard_normal((4, 3)), f32), jnp.asarray(rng.standard_normal((4, 3)), f32)
    per_example = jax.grad(lambda x, c: jnp.vdot(reversal.reverse_gradient(x, 0.5), c))
    np.testing.assert_allclose(jax.jit(jax.vmap(per_example))(xs, cs), -0.5 * cs)
    np.testing.assert_allclose(jax.vmap(per_example)(xs, cs), -0.5 * cs)
    np.testing.assert_array_equal(jax.vmap(lambda x: reversal.reverse_gradient(x, 0.5))(xs), xs)
    assert all(row[-1] for row in reversal.transform_rows(0.5))


def test_gradient_reversal_in_a_domain_adversarial_loss():
    for _, error, _ in reversal.dann_rows([0.5]):
        assert float(error) < 1e-5


# 6. Gradient clipping inside the graph


def test_gradient_clipping_gradcheck_when_inactive():
    x = jnp.array([[0.5, -2.0], [1.0, 3.0]], f32)
    assert jaxfn.gradcheck(lambda x: clipping.clip_gradient(x, 1e6), x)


def test_gradient_clipping_clips_each_example(maybe_jit):
    x, weight, y = clipping.regression()
    plain = np.asarray(jax.jit(jax.grad(lambda x: clipping.loss(lambda x: x, x, weight, y)))(x))
    got = maybe_jit(jax.grad(lambda x: clipping.loss(lambda x: clipping.clip_gradient(x, 25.0), x, weight, y)))(x)
    norms = np.linalg.norm(plain, axis=1, keepdims=True)
    assert (norms > 25).any() and (norms < 25).any()
    np.testing.assert_allclose(got, plain * np.minimum(1, 25 / norms), rtol=1e-5)
    assert clipping.nonlinearity(25.0) > 1


def test_gradient_clipping_refuses_forward_mode():
    x = jnp.ones((2, 3), f32)
    with pytest.raises(jaxfn.AutogradFunctionError, match="linear in grad_output"):
        jax.jvp(lambda x: clipping.clip_gradient_forward_mode(x, 1.0), (x,), (x,))
    with pytest.raises(jaxfn.AutogradFunctionError):
        jax.jvp(lambda x: clipping.clip_gradient(x, 1.0), (x,), (x,))


# 7. Memory-saving activation


def test_silu_gradcheck_and_matches_plain(maybe_jit):
    x = jnp.linspace(-4, 4, 9, dtype=f32)
    assert jaxfn.gradcheck(silu.silu, x)
    np.testing.assert_allclose(silu.silu(x), jax.nn.silu(x), rtol=1e-6)
    got = maybe_jit(jax.grad(lambda x: jnp.sum(silu.silu(x) ** 2)))(x)
    np.testing.assert_allclose(got, jax.grad(lambda x: jnp.sum(silu.plain_silu(x) ** 2))(x), rtol=1e-5, atol=1e-6)


def test_silu_memory_eager_saves_jit_does_not():
    weights, x = silu.example_inputs(batch=64, width=32, layers=2)
    activations = {"plain": silu.plain_silu, "jaxfn": silu.silu}
    held = {name: silu.pullback_bytes(f, weights, x) for name, f in activations.items()}
    assert held["jaxfn"] < held["plain"]
    temps = {name: _temp_bytes(jax.grad(silu.mlp_loss(f)), weights, x) for name, f in activations.items()}
    assert temps["jaxfn"] == temps["plain"]  # XLA already recomputes the sigmoid on its own


# 9. Three PyTorch Functions, ported


JIT = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])


def _maybe_jit(f, jit, static):
    return jax.jit(f, static_argnums=static) if jit else f


@JIT
@pytest.mark.parametrize("v", [0.0, 1.0, 2.5])
def test_ive_matches_scipy_and_its_backward_finite_differences(jit, v):
    """Forward is SciPy's ive (i0e, i1e at orders 0 and 1); backward, which calls the Function at
    v - 1, matches central differences of SciPy in float64; v static under jit."""
    special = pytest.importorskip("scipy.special")
    z = np.array([0.5, 2.0, 7.5])
    np.testing.assert_allclose(_maybe_jit(ports.ive, jit, 0)(v, jnp.asarray(z, f32)), special.ive(v, z), rtol=1e-5)
    grad = _maybe_jit(jax.grad(lambda z, v: ports.ive(v, z).sum()), jit, 1)(jnp.asarray(z, f32), v)
    h = 1e-6
    numeric = (special.ive(v, z + h) - special.ive(v, z - h)) / (2 * h)
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-6)


def test_ive_fits_the_von_mises_fisher_concentration():
    kappa, losses = ports.fit_kappa(r_bar=0.8, m=5, steps=30)
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(ports.ive(2.5, kappa) / ports.ive(1.5, kappa), 0.8, atol=1e-3)  # the MLE
    for m in (3, 4, 5):  # orders 0.5, 1 (i1e, backward through i0e) and 1.5
        grad = jax.grad(ports.vmf_nll)(jnp.array(1.0), 0.8, m)
        np.testing.assert_allclose(grad, ports.vmf_nll_finite_difference(1.0, 0.8, m), rtol=1e-4, atol=1e-5)


def _original_quick_cumsum(x, geom_feats, ranks):
    """lift-splat-shoot's forward in NumPy, boolean-mask compaction and all (the reference)."""
    x = x.cumsum(0)
    kept = np.ones(x.shape[0], dtype=bool)
    kept[:-1] = ranks[1:] != ranks[:-1]
    x, geom_feats = x[kept], geom_feats[kept]
    return np.concatenate((x[:1], x[1:] - x[:-1])), geom_feats


@JIT
def test_quick_cumsum_is_the_original_padded(jit):
    feats, geom, ranks, _ = ports.voxel_points()
    x, g = _maybe_jit(ports.quick_cumsum, jit, 3)(feats, geom, ranks, feats.shape[0])
    want_x, want_g = _original_quick_cumsum(np.asarray(feats), np.asarray(geom), np.asarray(ranks))
    n = want_x.shape[0]
    np.testing.assert_allclose(x[:n], want_x, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(g[:n], want_g)
    np.testing.assert_array_equal(x[n:], 0)
    np.testing.assert_array_equal(g[n:], -1)
    assert g.dtype == geom.dtype


def test_quick_cumsum_trains_and_its_gradient_is_segment_sum_s():
    weight, losses = ports.train_voxels(steps=30)
    assert losses[-1] < losses[0] / 10
    feats, geom, ranks, target = ports.voxel_points()
    args = (feats, geom, ranks, target, feats.shape[0])
    for w in (weight, jnp.ones_like(weight)):
        np.testing.assert_allclose(
            jax.grad(ports.pooled_loss)(w, *args), jax.grad(ports.plain_pooled_loss)(w, *args), rtol=1e-4, atol=1e-4
        )


@JIT
@pytest.mark.parametrize("num_bits", [2, 4, 8])
def test_pact_is_the_straight_through_estimator_of_its_clip(jit, num_bits):
    params = ports.init_pact_params()
    x, y = ports.regression_data()
    ours = _maybe_jit(jax.grad(ports.quantized_loss), jit, (3, 4))(params, x, y, num_bits, False)
    plain = jax.grad(ports.surrogate_loss)(params, x, y, num_bits)
    for name in params:
        np.testing.assert_allclose(ours[name], plain[name], rtol=1e-5, atol=1e-6)


def test_pact_inplace_reads_the_overwritten_values_as_pytorch_does():
    """With inplace=True the original's backward reads the quantized values: no gradient where
    rounding reached 0 or alpha, though the input itself lay inside (0, alpha)."""
    x = jnp.array([0.1, 0.5, 1.8, 2.5])  # alpha 2, 2 bits: 0.1 rounds to 0, 1.8 to 2
    alpha = jnp.array([2.0])
    grad = jax.grad(lambda x, a, inplace: ports.pact(x, a, 2, True, inplace).sum(), argnums=(0, 1))
    np.testing.assert_array_equal(grad(x, alpha, False)[0], [1.0, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(grad(x, alpha, True)[0], [0.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(grad(x, alpha, False)[1], [1.0])
    np.testing.assert_array_equal(grad(x, alpha, True)[1], [2.0])


def test_pact_trains_its_clip():
    params, losses = ports.train_pact(steps=30)
    assert losses[-1] < losses[0] / 2
    assert float(params["alpha"][0]) != 1.0


# Every entry's main runs and prints a markdown table (small sizes)


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, argv",
    [
        (lce, ["--small", "--repeats", "1"]),
        (deq, ["--batch", "4", "--width", "8", "--features", "2", "--iterations", "10", "100", "--repeats", "1"]),
        (nan_free, ["--steps", "20"]),
        (ste, ["--steps", "20"]),
        (reversal, []),
        (clipping, []),
        (silu, ["--batch", "16", "--width", "16", "--layers", "2", "--repeats", "1"]),
        (ports, ["--steps", "3"]),
    ],
)
def test_main_prints_a_table(module, argv, capsys):
    module.main(argv)
    out = capsys.readouterr().out
    assert "|---|" in out and "jax " in out
