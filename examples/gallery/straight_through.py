"""Straight-through estimators: train through ``round`` and ``sign``.

``quantize(w, bits)`` rounds ``w`` (clipped to [-1, 1]) to a ``bits``-bit grid and ``binarize(w)``
takes its sign; both backwards pass the gradient straight through where ``|w| <= 1`` and zero
elsewhere (the clipped STE of BinaryConnect / QAT). Plain autodiff differentiates ``round`` and
``sign`` exactly: zero everywhere, so a network whose every parameter is quantized never moves.
A small MLP whose weights and biases are all quantized learns a circle in the plane with the STE,
and stays where it started with autodiff:

    python examples/gallery/straight_through.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from _gallery import Parser, machine, markdown_table, positive_int

import jaxfn


# --8<-- [start:function]
def plain_quantize(w, bits=4):
    levels = 2 ** (bits - 1) - 1
    return jnp.round(jnp.clip(w, -1, 1) * levels) / levels


def plain_binarize(w):
    return jnp.where(w >= 0, 1, -1).astype(w.dtype)


def _quantize_forward(ctx, w, bits=4):
    ctx.save_for_backward(w=w)
    return plain_quantize(w, bits)


def _binarize_forward(ctx, w):
    ctx.save_for_backward(w=w)
    return plain_binarize(w)


def straight_through_backward(ctx, grad_output):
    """The gradient of ``clip(w, -1, 1)``: straight through inside the clip range, zero outside."""
    w = ctx.saved_variables.w
    return {"w": jnp.where(jnp.abs(w) <= 1, grad_output, 0)}


quantize = jaxfn.autograd_function(_quantize_forward, straight_through_backward, name="quantize")
binarize = jaxfn.autograd_function(_binarize_forward, straight_through_backward, name="binarize")
# --8<-- [end:function]


def circle_data(samples=512, seed=0):
    """Points in [-1, 1]^2, labelled 1 inside the circle of radius 0.8 (about half of them)."""
    x = np.random.default_rng(seed).uniform(-1, 1, (samples, 2))
    return jnp.asarray(x, np.float32), jnp.asarray(np.sum(x**2, axis=1) < 0.64, np.float32)


def init_params(sizes=(2, 32, 32, 1), seed=1):
    rng = np.random.default_rng(seed)
    return [
        (jnp.asarray(rng.uniform(-1, 1, (m, n)), np.float32), jnp.zeros(n, np.float32))
        for m, n in zip(sizes[:-1], sizes[1:])
    ]


def logits(params, x, quantizers):
    """An MLP whose weights and biases pass through ``quantizers`` (the fan-in scaling stays float)."""
    quantize_weight, quantize_bias = quantizers
    for i, (w, b) in enumerate(params):
        x = x @ quantize_weight(w) / w.shape[0] ** 0.5 + quantize_bias(b)
        x = jax.nn.relu(x) if i < len(params) - 1 else x
    return x[:, 0]


def loss(params, x, y, quantizers):
    z = logits(params, x, quantizers)
    return jnp.mean(jnp.logaddexp(0, z) - y * z)  # logistic loss


def accuracy(params, x, y, quantizers):
    return jnp.mean((logits(params, x, quantizers) > 0) == (y > 0.5))


def _adam(learning_rate, beta1=0.9, beta2=0.999, eps=1e-8):
    """Adam on a pytree of parameters, as (init, update)."""

    def init(params):
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return zeros, zeros, jnp.zeros((), jnp.float32)

    def update(params, grads, state):
        m, v, t = state
        t = t + 1
        m = jax.tree_util.tree_map(lambda m, g: beta1 * m + (1 - beta1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: beta2 * v + (1 - beta2) * g**2, v, grads)
        scale = learning_rate * jnp.sqrt(1 - beta2**t) / (1 - beta1**t)
        params = jax.tree_util.tree_map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, m, v)
        return params, (m, v, t)

    return init, update


def train(quantizers, steps=500, learning_rate=0.01):
    """Full-batch Adam on the float weights behind the quantizers: the losses, and the final accuracy."""
    x, y = circle_data()
    init, update = _adam(learning_rate)

    def step(carry, _):
        params, state = carry
        value, grads = jax.value_and_grad(loss)(params, x, y, quantizers)
        return update(params, grads, state), value

    params = init_params()
    (params, _), losses = jax.lax.scan(step, (params, init(params)), None, length=steps)
    return losses, accuracy(params, x, y, quantizers)


def networks(bits):
    """(weight quantizer, bias quantizer) per row; sign nets keep k-bit biases (sign biases stay near chance)."""
    plain_round, jaxfn_round = (lambda w: plain_quantize(w, bits)), (lambda w: quantize(w, bits))
    return {
        f"{bits}-bit weights and biases, plain autodiff": (plain_round, plain_round),
        f"{bits}-bit weights and biases, jaxfn STE": (jaxfn_round, jaxfn_round),
        f"sign weights, {bits}-bit biases, plain autodiff": (plain_binarize, plain_round),
        f"sign weights, {bits}-bit biases, jaxfn STE": (binarize, jaxfn_round),
    }


def main(argv=None):
    parser = Parser(__file__, __doc__)
    parser.add_argument("--bits", type=positive_int, default=4, help="bits of the weight and bias grid (2 or more)")
    parser.add_argument("--steps", type=positive_int, default=500, help="full-batch Adam steps per network")
    a = parser.parse_args(argv)
    if a.bits < 2:
        parser.error(f"argument --bits: must be 2 or more (1 bit leaves no grid level but 0), got {a.bits}")
    rows = []
    for name, quantizers in networks(a.bits).items():
        losses, final_accuracy = jax.jit(train, static_argnums=(0, 1))(quantizers, a.steps)
        rows.append([name, f"{float(losses[0]):.4f}", f"{float(losses[-1]):.4f}", f"{float(final_accuracy):.1%}"])
    print(f"MLP 2-32-32-1, every weight and bias quantized, 512 points in a circle task, {a.steps} steps of Adam")
    print(f"{machine()}\n")
    print(markdown_table(["network, gradient", "first loss", "last loss", "accuracy after"], rows))


if __name__ == "__main__":
    main()
