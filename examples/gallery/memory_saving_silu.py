"""A memory-saving activation: SiLU (Swish) that saves only its input and recomputes the sigmoid.

``silu(x) = x * sigmoid(x)``. Plain autodiff of that expression keeps what its operations need
(``x`` and ``sigmoid(x)``); PyTorch projects write a custom backward that saves ``x`` alone and
recomputes ``sigmoid(x)`` in backward, trading a little compute for activation memory. Measured
on an MLP: compiled under ``jit`` (XLA's own report of temporaries, and time), and eagerly (the
bytes a ``jax.vjp`` pullback holds, and time), against plain autodiff and ``jax.nn.silu``:

    python examples/gallery/memory_saving_silu.py            # batch 1024, width 512, 4 layers
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from _gallery import Parser, compiled, interleaved_medians, machine, markdown_table, mb, memory, ms, positive_int

import jaxfn


# --8<-- [start:function]
def _forward(ctx, x):
    ctx.save_for_backward(x=x)  # the input only; sigmoid(x) is recomputed in backward
    return x * jax.nn.sigmoid(x)


def _backward(ctx, grad_output):
    x = ctx.saved_variables.x
    s = jax.nn.sigmoid(x)
    return grad_output * s * (1 + x * (1 - s))


silu = jaxfn.autograd_function(_forward, _backward, name="silu")
# --8<-- [end:function]


def plain_silu(x):
    return x * jax.nn.sigmoid(x)


ACTIVATIONS = {"plain autodiff of x * sigmoid(x)": plain_silu, "jax.nn.silu": jax.nn.silu, "jaxfn silu": silu}


def mlp_loss(activation):
    def loss(weights, x):
        for w in weights:
            x = activation(x @ w)
        return jnp.mean(x**2)

    return loss


def example_inputs(batch, width, layers, seed=0):
    rng = np.random.default_rng(seed)
    weights = [jnp.asarray(rng.standard_normal((width, width)) / width**0.5, np.float32) for _ in range(layers)]
    return weights, jnp.asarray(rng.standard_normal((batch, width)), np.float32)


def pullback_bytes(activation, weights, x):
    """Bytes of the arrays an eager ``jax.vjp`` pullback holds (its residuals)."""
    _, pullback = jax.vjp(mlp_loss(activation), weights, x)
    return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(pullback))


def measure(batch, width, layers, repeats):
    weights, x = example_inputs(batch, width, layers)
    grads = {name: jax.grad(mlp_loss(f)) for name, f in ACTIVATIONS.items()}
    executables = {name: compiled(g, weights, x) for name, g in grads.items()}
    jit_times, results = interleaved_medians({n: lambda e=e: e(weights, x) for n, e in executables.items()}, repeats)
    eager_times, _ = interleaved_medians({n: lambda g=g: g(weights, x) for n, g in grads.items()}, repeats)
    reference = results["plain autodiff of x * sigmoid(x)"]
    rows = []
    for name, f in ACTIVATIONS.items():
        error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(results[name], reference))
        temp = mb(memory(executables[name])["temp"])
        held = mb(pullback_bytes(f, weights, x))
        rows.append([name, temp, ms(jit_times[name]), held, ms(eager_times[name]), f"{error:.1e}"])
    return rows


def main(argv=None):
    parser = Parser(__file__, __doc__)
    parser.add_argument("--batch", type=positive_int, default=1024, help="rows of the MLP's input")
    parser.add_argument("--width", type=positive_int, default=512, help="width of every layer")
    parser.add_argument("--layers", type=positive_int, default=4, help="layers of x @ W then SiLU")
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed runs of each contender (the median)")
    a = parser.parse_args(argv)
    rows = measure(a.batch, a.width, a.layers, a.repeats)
    print(f"gradient of an MLP, {a.layers} layers of x @ W then SiLU, batch {a.batch}, width {a.width}, float32")
    print(f"{machine()}; medians of {a.repeats}, interleaved\n")
    header = ["activation", "jit: temporaries", "jit: time", "eager: pullback holds", "eager: time"]
    print(markdown_table(header + ["max abs grad diff vs plain"], rows))


if __name__ == "__main__":
    main()
