"""Linear + cross-entropy without the logits: the LLM output layer, in chunks of tokens.

``linear_cross_entropy(input, weight, targets, chunk)`` is ``mean(cross_entropy(input @ weight.T,
targets))`` that never holds the ``(tokens, vocab)`` logits. Forward walks the tokens in chunks and,
when JAX is differentiating, also produces each chunk's input gradient and accumulates the weight
gradient as it goes (the idea of Liger Kernel's fused linear cross-entropy, arXiv 2410.10989, and
Cut Cross-Entropy, arXiv 2411.09009). Backward only scales them by the incoming cotangent.

Compared with plain autodiff of the same math and with plain JAX's own chunking (``lax.scan`` over
a ``jax.checkpoint``ed body, which recomputes each chunk's logits in backward):

    python examples/gallery/linear_cross_entropy.py                 # tokens 2048, hidden 256, vocab 32000
    python examples/gallery/linear_cross_entropy.py --tokens 4096 --hidden 512   # the issue's size
    python examples/gallery/linear_cross_entropy.py --small          # a quick run
    python examples/gallery/linear_cross_entropy.py --tokens 4096 --hidden 512 --chunk 512 --memory-only
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from _gallery import compiled, interleaved_medians, machine, markdown_table, mb, memory, ms
from jax import lax

import jaxfn


def _chunks(input, targets, chunk):
    tokens, hidden = input.shape
    if tokens % chunk:
        raise ValueError(f"linear_cross_entropy: tokens ({tokens}) must be a multiple of chunk ({chunk}).")
    return input.reshape(tokens // chunk, chunk, hidden), targets.reshape(tokens // chunk, chunk)


def _chunk_loss(logits, targets):
    """Summed cross-entropy of one chunk, and the probabilities its gradient needs."""
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    return jnp.sum(lse - picked), jnp.exp(logits - lse[:, None])


def _scan(input, weight, targets, chunk, need_input, need_weight):
    """Mean loss, and (when asked) the gradients of the mean loss for input and weight."""
    xs, ts = _chunks(input, targets, chunk)
    scale = 1.0 / input.shape[0]

    def step(carry, x_and_t):
        total, grad_weight = carry
        x, t = x_and_t
        loss, probs = _chunk_loss(x @ weight.T, t)
        grad_logits = (probs - jax.nn.one_hot(t, weight.shape[0], dtype=probs.dtype)) * scale
        grad_x = grad_logits @ weight if need_input else None
        if need_weight:
            grad_weight = grad_weight + grad_logits.T @ x
        return (total + loss, grad_weight), grad_x

    zero_weight = jnp.zeros_like(weight) if need_weight else None
    (total, grad_weight), grad_xs = lax.scan(step, (jnp.zeros((), input.dtype), zero_weight), (xs, ts))
    grad_input = grad_xs.reshape(input.shape) if need_input else None
    return total * scale, grad_input, grad_weight


def _forward(ctx, input, weight, targets, chunk=128):
    needs = ctx.needs_input_grad
    loss, grad_input, grad_weight = _scan(input, weight, targets, chunk, needs.input, needs.weight)
    ctx.save_for_backward(grad_input=grad_input, grad_weight=grad_weight)  # None when not needed
    return loss


def _backward(ctx, grad_output):
    saved = ctx.saved_variables
    grads = {}
    if saved.grad_input is not None:
        grads["input"] = grad_output * saved.grad_input
    if saved.grad_weight is not None:
        grads["weight"] = grad_output * saved.grad_weight
    return grads


linear_cross_entropy = jaxfn.autograd_function(_forward, _backward, name="linear_cross_entropy")


def plain_loss(input, weight, targets):
    """The same math for plain autodiff: the full (tokens, vocab) logits."""
    loss, _ = _chunk_loss(input @ weight.T, targets)
    return loss / input.shape[0]


def checkpointed_loss(input, weight, targets, chunk=128):
    """Plain JAX's own chunking: a scan over a checkpointed body (backward recomputes the logits)."""
    xs, ts = _chunks(input, targets, chunk)
    chunk_loss = jax.checkpoint(lambda x, t: _chunk_loss(x @ weight.T, t)[0])

    def step(total, x_and_t):
        return total + chunk_loss(*x_and_t), None

    total, _ = lax.scan(step, jnp.zeros((), input.dtype), (xs, ts))
    return total / input.shape[0]


def contenders(chunk: int) -> dict:
    return {
        "plain autodiff": plain_loss,
        f"lax.scan + jax.checkpoint (chunk {chunk})": lambda x, w, t: checkpointed_loss(x, w, t, chunk),
        f"jaxfn (chunk {chunk})": lambda x, w, t: linear_cross_entropy(x, w, t, chunk),
    }


def loss_and_grads(loss):
    return jax.value_and_grad(loss, argnums=(0, 1))


def example_inputs(tokens, hidden, vocab, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    input = jnp.asarray(rng.standard_normal((tokens, hidden)), dtype)
    weight = jnp.asarray(rng.standard_normal((vocab, hidden)) / hidden**0.5, dtype)
    return input, weight, jnp.asarray(rng.integers(0, vocab, tokens), np.int32)


def measure(tokens, hidden, vocab, chunk, repeats, run=True):
    """One row per contender: compiled temp/argument bytes, loss+grad time, worst gradient error."""
    args = example_inputs(tokens, hidden, vocab)
    executables = {name: compiled(loss_and_grads(f), *args) for name, f in contenders(chunk).items()}
    calls = {name: lambda e=e: e(*args) for name, e in executables.items()}
    # Compiled already, and each call takes seconds: no warm-up call.
    times, results = interleaved_medians(calls, repeats, warmup=False) if run else ({}, {})
    plain_temp = memory(executables["plain autodiff"])["temp"]
    rows = []
    for name, executable in executables.items():
        used = memory(executable)
        row = [name, mb(used["temp"]), f"{plain_temp / used['temp']:.1f}x", mb(used["argument"])]
        if run:
            row += [ms(times[name]), f"{relative_error(results[name][1], results['plain autodiff'][1]):.1e}"]
        rows.append(row)
    return rows


def relative_error(grads, reference):
    """The worst ``max|g - r| / max|r|`` over the gradients."""
    return max(float(jnp.max(jnp.abs(g - r)) / jnp.max(jnp.abs(r))) for g, r in zip(grads, reference))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="tokens 512, hidden 64, vocab 4000, chunk 64")
    parser.add_argument("--memory-only", action="store_true", help="compile and report memory; run nothing")
    a = parser.parse_args(argv)
    if a.small:
        a.tokens, a.hidden, a.vocab, a.chunk = 512, 64, 4000, 64
    rows = measure(a.tokens, a.hidden, a.vocab, a.chunk, a.repeats, run=not a.memory_only)
    print(f"loss + gradient (input, weight), tokens {a.tokens}, hidden {a.hidden}, vocab {a.vocab}, float32")
    print(f"{machine()}" + ("; compiled only" if a.memory_only else f"; medians of {a.repeats}, interleaved") + "\n")
    header = ["", "temporaries", "plain / this", "arguments"]
    header += [] if a.memory_only else ["time", "grad error vs plain (relative)"]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
