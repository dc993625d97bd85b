"""Three real PyTorch Functions ported to jaxfn, each trained in jitted steps and its gradient checked.

- s-vae-pytorch's ``IveFunction``: SciPy's exponentially scaled Bessel function ``ive(v, z)`` in a
  host forward (``host=True``), the order ``v`` a Python number, and a backward that calls the
  Function again (d/dz ive(v, z) = ive(v - 1, z) - ive(v, z) (v + z) / z). It fits the
  concentration of a von Mises-Fisher distribution by maximum likelihood.
- lift-splat-shoot's ``QuickCumsum``: two outputs, an integer output marked non-differentiable,
  in-place writes, and a boolean-mask compaction whose size depends on the data, written with a
  fixed size and padding. It pools point features into voxels.
- distiller's PACT quantizer (``LearnedClippedLinearQuantizeSTE``): a straight-through estimator
  with a learned clip ``alpha``, the flags ``num_bits``, ``dequantize`` and ``inplace`` static,
  ``mark_dirty``. It trains a quantized layer and its clip.

Each port's gradient is compared with an independent reference (finite differences of SciPy, or
``jax.grad`` of the plain math), and the script prints the losses of its training:

    python examples/gallery/pytorch_ports.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
from _gallery import Parser, machine, markdown_table, positive_int

import jaxfn


# --8<-- [start:ive]
class Ive(jaxfn.Function):
    """s-vae-pytorch's IveFunction: ive(v, z) = iv(v, z) * exp(-|z|), for a Python number v."""

    host = True  # forward and backward run on the host, on NumPy arrays

    @staticmethod
    def forward(ctx, v, z):
        ctx.save_for_backward(z)
        ctx.v = v  # a Python number: static, kept as it is
        if np.isclose(v, 0):
            return scipy.special.i0e(z)
        if np.isclose(v, 1):
            return scipy.special.i1e(z)
        return scipy.special.ive(v, z)

    @staticmethod
    def backward(ctx, grad_output):
        (z,) = ctx.saved_tensors
        v = ctx.v
        derivative = Ive.apply(v - 1, z) - Ive.apply(v, z) * (v + z) / z  # the Function again
        return None, grad_output * derivative


ive = Ive.apply
# --8<-- [end:ive]


# --8<-- [start:ive-train]
def vmf_nll(log_kappa, r_bar, m):
    """The negative log-likelihood per sample of a von Mises-Fisher distribution on the sphere
    S^(m-1), concentration kappa, mean resultant length r_bar, up to a constant."""
    kappa = jnp.exp(log_kappa)
    v = m / 2 - 1  # a Python number when m is static
    log_bessel = jnp.log(ive(v, kappa)) + kappa  # log iv(v, kappa)
    return -v * log_kappa + log_bessel - kappa * r_bar


def fit_kappa(r_bar, m, steps, learning_rate=1.0):
    """Gradient descent on log kappa, each step one jitted call (m static: it picks Bessel's order)."""
    step = jax.jit(
        lambda log_kappa, r_bar, m: log_kappa - learning_rate * jax.grad(vmf_nll)(log_kappa, r_bar, m),
        static_argnames="m",
    )
    log_kappa, losses = jnp.array(0.0), []
    for _ in range(steps):
        losses.append(float(vmf_nll(log_kappa, r_bar, m)))
        log_kappa = step(log_kappa, r_bar, m=m)
    return jnp.exp(log_kappa), losses


def vmf_nll_finite_difference(log_kappa, r_bar, m, h=1e-5):
    """The NLL's derivative by central differences of the same formula in float64 SciPy."""

    def nll(t):
        v = m / 2 - 1
        return -v * t + np.log(scipy.special.ive(v, np.exp(t))) + np.exp(t) * (1 - r_bar)

    return (nll(log_kappa + h) - nll(log_kappa - h)) / (2 * h)


# --8<-- [end:ive-train]


# --8<-- [start:quick-cumsum]
class QuickCumsum(jaxfn.Function):
    """lift-splat-shoot's QuickCumsum: sums the rows of x over each run of equal ranks (sorted),
    keeping geom_feats of each run's last row; ``size`` rows out, padded (x with 0, geom with -1)."""

    @staticmethod
    def forward(ctx, x, geom_feats, ranks, size):
        x = x.cumsum(0)
        kept = jnp.ones(x.shape[0], dtype=bool)
        kept = kept.at[:-1].set(ranks[1:] != ranks[:-1])  # kept[:-1] = (ranks[1:] != ranks[:-1])

        # x, geom_feats = x[kept], geom_feats[kept]: `size` rows, padded with the last row
        (last,) = jnp.nonzero(kept, size=size, fill_value=x.shape[0] - 1)
        real = (jnp.arange(size) < kept.sum())[:, None]
        x, geom_feats = x[last], jnp.where(real, geom_feats[last], -1)
        x = jnp.concatenate((x[:1], x[1:] - x[:-1]))  # padding rows: last - last = 0

        ctx.save_for_backward(kept)
        ctx.mark_non_differentiable(geom_feats)  # an integer output: never differentiated anyway
        return x, geom_feats

    @staticmethod
    def backward(ctx, gradx, gradgeom):
        (kept,) = ctx.saved_tensors
        back = jnp.cumsum(kept) - kept  # back = cumsum(kept); back[kept] -= 1
        return gradx[back], None, None, None


quick_cumsum = QuickCumsum.apply
# --8<-- [end:quick-cumsum]


# --8<-- [start:quick-cumsum-train]
def voxel_points(points=64, voxels=12, channels=4, features=6, seed=0):
    """Point features, their voxels' ranks (sorted) and coordinates, and a target pooled grid."""
    rng = np.random.default_rng(seed)
    ranks = np.sort(rng.integers(0, voxels, points))
    geom = np.stack([ranks // 4, ranks % 4, np.zeros_like(ranks), np.zeros_like(ranks)], axis=1)
    feats = rng.standard_normal((points, features)).astype(np.float32)
    true_weight = rng.standard_normal((features, channels)).astype(np.float32)
    return jnp.asarray(feats), jnp.asarray(geom), jnp.asarray(ranks), jnp.asarray(feats @ true_weight)


def pooled_loss(weight, feats, geom, ranks, target, size):
    """Pool (feats @ weight) and target with QuickCumsum; mean squared difference over real voxels."""
    pooled, voxel = quick_cumsum(feats @ weight, geom, ranks, size)
    wanted, _ = quick_cumsum(target, geom, ranks, size)
    real = voxel[:, :1] >= 0
    return jnp.sum(jnp.where(real, (pooled - wanted) ** 2, 0)) / jnp.sum(real)


def plain_pooled_loss(weight, feats, geom, ranks, target, size):
    """The same loss by jax.ops.segment_sum, differentiated by JAX itself: the reference."""
    voxel = jnp.cumsum(jnp.concatenate([jnp.zeros(1, ranks.dtype), ranks[1:] != ranks[:-1]]))
    count = int(voxel[-1]) + 1
    error = jax.ops.segment_sum(feats @ weight - target, voxel, num_segments=count)
    return jnp.sum(error**2) / count


def train_voxels(steps, learning_rate=0.01):
    feats, geom, ranks, target = voxel_points()
    size = feats.shape[0]  # at most one voxel per point: a fixed size, whatever the data
    step = jax.jit(
        lambda w, size: w - learning_rate * jax.grad(pooled_loss)(w, feats, geom, ranks, target, size),
        static_argnames="size",
    )
    weight, losses = jnp.zeros((feats.shape[1], target.shape[1])), []
    for _ in range(steps):
        losses.append(float(pooled_loss(weight, feats, geom, ranks, target, size)))
        weight = step(weight, size=size)
    return weight, losses


# --8<-- [end:quick-cumsum-train]


# --8<-- [start:pact]
class LearnedClippedLinearQuantizeSTE(jaxfn.Function):
    """distiller's PACT: clamp to [0, clip_val], quantize to num_bits, straight-through gradient."""

    @staticmethod
    def forward(ctx, input, clip_val, num_bits, dequantize, inplace):
        scale = (2**num_bits - 1) / clip_val  # asymmetric_linear_quantization_params: zero point 0
        output = jnp.clip(input, 0, clip_val)  # clamp(input, 0, clip_val.data[0], inplace)
        output = jnp.round(scale * output)  # linear_quantize(output, scale, 0, inplace)
        if dequantize:
            output = output / scale  # linear_dequantize(output, scale, 0, inplace)
        if inplace:  # PyTorch overwrote input, and its backward reads the overwritten value
            ctx.mark_dirty(input)
            ctx.save_for_backward(output, clip_val)
        else:
            ctx.save_for_backward(input, clip_val)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, clip_val = ctx.saved_tensors
        grad_input = jnp.where((input <= 0) | (input >= clip_val), 0, grad_output)
        grad_alpha = jnp.where(input < clip_val, 0, grad_output).sum().reshape(clip_val.shape)
        return grad_input, grad_alpha, None, None, None


pact = LearnedClippedLinearQuantizeSTE.apply
# --8<-- [end:pact]


# --8<-- [start:pact-train]
def regression_data(samples=256, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, 8)).astype(np.float32)
    y = np.maximum(x @ rng.standard_normal((8, 16)), 0) @ rng.standard_normal((16, 1)) / 4
    return jnp.asarray(x), jnp.asarray(y, np.float32)


def quantized_loss(params, x, y, num_bits, inplace=False):
    """A two-layer network whose hidden activation is PACT, num_bits and inplace Python flags."""
    hidden = pact(x @ params["w1"], params["alpha"], num_bits, True, inplace)
    return jnp.mean((hidden @ params["w2"] - y) ** 2)


def surrogate_loss(params, x, y, num_bits):
    """The same loss with PACT's estimator in plain JAX: clip's gradient, the quantized value."""
    hidden = x @ params["w1"]
    clipped = jnp.clip(hidden, 0, params["alpha"])
    scale = (2**num_bits - 1) / params["alpha"]
    hidden = clipped + jax.lax.stop_gradient(jnp.round(scale * clipped) / scale - clipped)
    return jnp.mean((hidden @ params["w2"] - y) ** 2)


def init_pact_params(seed=2):
    rng = np.random.default_rng(seed)
    return {
        "w1": jnp.asarray(rng.standard_normal((8, 16)) / 8**0.5, np.float32),
        "w2": jnp.asarray(rng.standard_normal((16, 1)) / 4, np.float32),
        "alpha": jnp.array([1.0]),  # distiller's clip_val: a 1-element parameter
    }


def train_pact(steps, num_bits=4, learning_rate=0.05):
    x, y = regression_data()
    grad = jax.grad(quantized_loss)
    step = jax.jit(
        lambda p, num_bits, inplace: jax.tree.map(
            lambda p, g: p - learning_rate * g, p, grad(p, x, y, num_bits, inplace)
        ),
        static_argnames=("num_bits", "inplace"),
    )
    params, losses = init_pact_params(), []
    for _ in range(steps):
        losses.append(float(quantized_loss(params, x, y, num_bits)))
        params = step(params, num_bits=num_bits, inplace=False)
    return params, losses


# --8<-- [end:pact-train]


def _max_difference(a, b):
    return max(float(jnp.max(jnp.abs(u - w))) for u, w in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def rows(steps):
    """Each port's training (first and last loss) and its gradient against the reference."""
    found = []
    r_bar, m = 0.8, 5
    kappa, losses = fit_kappa(r_bar, m, steps)
    mean_length = ive(m / 2, kappa) / ive(m / 2 - 1, kappa)  # the MLE's condition: A_m(kappa) = r_bar
    check = abs(float(jax.grad(vmf_nll)(jnp.array(1.0), r_bar, m)) - vmf_nll_finite_difference(1.0, r_bar, m))
    found.append(["Ive (host, SciPy)", f"kappa {float(kappa):.3f}, A(kappa) {float(mean_length):.4f}", losses, check])
    weight, losses = train_voxels(steps)
    feats, geom, ranks, target = voxel_points()
    args = (feats, geom, ranks, target, feats.shape[0])
    check = _max_difference(jax.grad(pooled_loss)(weight, *args), jax.grad(plain_pooled_loss)(weight, *args))
    voxels = int(jnp.sum(quick_cumsum(feats, geom, ranks, feats.shape[0])[1][:, 0] >= 0))
    found.append(["QuickCumsum (fixed size)", f"{feats.shape[0]} points in {voxels} voxels", losses, check])
    params, losses = train_pact(steps)
    x, y = regression_data()
    check = _max_difference(jax.grad(quantized_loss)(params, x, y, 4), jax.grad(surrogate_loss)(params, x, y, 4))
    found.append(["PACT (STE, learned clip)", f"alpha {float(params['alpha'][0]):.3f}", losses, check])
    return [[name, f"{lo[0]:.4f}", f"{lo[-1]:.4f}", what, f"{check:.1e}"] for name, what, lo, check in found]


def main(argv=None):
    parser = Parser(__file__, __doc__)
    parser.add_argument("--steps", type=positive_int, default=30, help="jitted training steps per port")
    a = parser.parse_args(argv)
    print(f"three PyTorch Functions ported to jaxfn, {a.steps} jitted gradient steps each")
    print(f"{machine()}\n")
    header = ["port", "first loss", "last loss", "after training", "gradient vs reference (max abs diff)"]
    print(markdown_table(header, rows(a.steps)))


if __name__ == "__main__":
    main()
