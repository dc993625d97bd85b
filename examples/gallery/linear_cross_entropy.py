"""Linear + cross-entropy without the logits: the LLM output layer, in blocks of tokens x vocabulary.

``linear_cross_entropy(input, weight, targets, chunk=1024, vocab_chunk=500)`` is
``mean(cross_entropy(input @ weight.T, targets))`` that never holds the ``(tokens, vocab)`` logits,
nor any temporary the size of the weight: it works on ``(chunk, vocab_chunk)`` blocks of logits.
Forward computes each token's log-sum-exp online over the vocabulary chunks and, when JAX is
differentiating (``ctx.needs_input_grad``), saves it: one number per token. Backward recomputes
each block's logits, forms ``softmax - onehot`` for that block, adds its share of the input
gradient into the token chunk's rows, and writes each ``(vocab_chunk, hidden)`` slice of the
weight gradient once: vocabulary chunks are the outer loop, so every slice is one step's output of
a ``lax.scan`` and lands in the output buffer. This is Cut Cross-Entropy's algorithm (arXiv
2411.09009). Liger Kernel's fused linear cross-entropy (arXiv 2410.10989) computes the gradients in
forward instead; saved for backward, they need a second gradient-sized buffer as soon as the
cotangent is not the constant 1, while here the cotangent goes into the blocks.

Compared with plain autodiff of the same math and with plain JAX's own chunking, a ``lax.scan``
over a ``jax.checkpoint``ed body, over token chunks and over vocabulary chunks (an online
log-sum-exp), at several vocabulary chunks; wall and CPU time, interleaved:

    python examples/gallery/linear_cross_entropy.py                 # tokens 2048, hidden 256, vocab 32000
    python examples/gallery/linear_cross_entropy.py --tokens 4096 --hidden 512   # the issue's size
    python examples/gallery/linear_cross_entropy.py --small          # a quick run
    python examples/gallery/linear_cross_entropy.py --tokens 4096 --hidden 512 --memory-only \\
        --plot docs/images/linear_cross_entropy_memory.png         # and temporaries by vocabulary size
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from _gallery import (
    Parser,
    add_plot,
    compiled,
    interleaved_wall_and_cpu,
    machine,
    markdown_table,
    mb,
    memory,
    ms,
    positive_int,
)
from jax import lax

import jaxfn

PLOT_VOCABS = [8000, 16000, 32000, 64000, 128000, 256000]


def _token_chunks(input, targets, chunk):
    tokens, hidden = input.shape
    if tokens % chunk:
        raise ValueError(f"linear_cross_entropy: tokens ({tokens}) must be a multiple of chunk ({chunk}).")
    return input.reshape(tokens // chunk, chunk, hidden), targets.reshape(tokens // chunk, chunk)


def _vocab_chunks(weight, vocab_chunk, index_dtype):
    """The weight as ``(vocab // vocab_chunk, vocab_chunk, hidden)``, and each chunk's first row."""
    vocab, hidden = weight.shape
    if vocab % vocab_chunk:
        raise ValueError(f"linear_cross_entropy: vocab ({vocab}) must be a multiple of vocab_chunk ({vocab_chunk}).")
    starts = jnp.arange(vocab // vocab_chunk, dtype=index_dtype) * vocab_chunk
    return weight.reshape(vocab // vocab_chunk, vocab_chunk, hidden), starts


def _log_sum_exp(x, weights):
    """Each row's log-sum-exp of ``x @ weight.T``, online over the vocabulary chunks ``weights``."""

    def step(carry, w):
        top, total = carry
        logits = x @ w.T
        new_top = jnp.maximum(top, jnp.max(logits, axis=-1))
        total = total * jnp.exp(top - new_top) + jnp.sum(jnp.exp(logits - new_top[:, None]), axis=-1)
        return (new_top, total), None

    start = (jnp.full(x.shape[:1], -jnp.inf, x.dtype), jnp.zeros(x.shape[:1], x.dtype))
    (top, total), _ = lax.scan(step, start, weights)
    return top + jnp.log(total)


def _loss_terms(input, weight, targets, chunk, vocab_chunk):
    """Per token chunk: the log-sum-exp over the vocabulary and the target's logit, ``(tokens // chunk, chunk)``."""
    xs, ts = _token_chunks(input, targets, chunk)
    weights, _ = _vocab_chunks(weight, vocab_chunk, targets.dtype)

    def step(_, x_and_t):
        x, t = x_and_t
        return None, (_log_sum_exp(x, weights), jnp.sum(x * weight[t], axis=-1))

    _, (lse, picked) = lax.scan(step, None, (xs, ts))
    return lse, picked


def _gradients(input, weight, targets, lse, scale, chunk, vocab_chunk, need_input, need_weight):
    """``scale * d(sum of losses)`` for input and weight (``None`` where not needed), block by block.

    Vocabulary chunks outer: each weight-gradient slice is one outer step's output (stacked by
    ``lax.scan`` into the output). Token chunks inner: each block's input gradient is added into
    its chunk's rows of one input-sized carry.
    """
    xs, ts = _token_chunks(input, targets, chunk)
    weights, starts = _vocab_chunks(weight, vocab_chunk, targets.dtype)

    def vocab_step(grad_xs, w_and_start):
        w, start = w_and_start

        def token_step(carry, i):
            grad_w, grad_xs = carry
            x, t = xs[i], ts[i]
            probs = jnp.exp(x @ w.T - lse[i][:, None])
            grad_logits = (probs - jax.nn.one_hot(t - start, vocab_chunk, dtype=probs.dtype)) * scale
            if need_weight:
                grad_w = grad_w + grad_logits.T @ x
            if need_input:
                grad_xs = grad_xs.at[i].add(grad_logits @ w)
            return (grad_w, grad_xs), None

        zero_w = jnp.zeros_like(w) if need_weight else None
        (grad_w, grad_xs), _ = lax.scan(token_step, (zero_w, grad_xs), jnp.arange(xs.shape[0]))
        return grad_xs, grad_w

    grad_xs, grad_ws = lax.scan(vocab_step, jnp.zeros_like(xs) if need_input else None, (weights, starts))
    grad_input = grad_xs.reshape(input.shape) if need_input else None
    grad_weight = grad_ws.reshape(weight.shape) if need_weight else None
    return grad_input, grad_weight


# --8<-- [start:function]
def _forward(ctx, input, weight, targets, chunk=1024, vocab_chunk=500):
    # Blocks no larger than the arrays, so small inputs work with the defaults.
    chunk, vocab_chunk = min(chunk, input.shape[0]), min(vocab_chunk, weight.shape[0])
    lse, picked = _loss_terms(input, weight, targets, chunk, vocab_chunk)
    if ctx.needs_input_grad.input or ctx.needs_input_grad.weight:  # nothing is saved otherwise
        ctx.save_for_backward(
            input=input, weight=weight, targets=targets, lse=lse, chunk=chunk, vocab_chunk=vocab_chunk
        )
    return jnp.sum(lse - picked) / input.shape[0]


def _backward(ctx, grad_output):
    s, needs = ctx.saved_variables, ctx.needs_input_grad
    scale = grad_output / s.input.shape[0]  # the cotangent goes into the blocks: no extra gradient-sized buffer
    grad_input, grad_weight = _gradients(
        s.input, s.weight, s.targets, s.lse, scale, s.chunk, s.vocab_chunk, needs.input, needs.weight
    )
    return {name: g for name, g in [("input", grad_input), ("weight", grad_weight)] if g is not None}


linear_cross_entropy = jaxfn.autograd_function(_forward, _backward, name="linear_cross_entropy")
# --8<-- [end:function]


def _chunk_loss(logits, targets):
    """Summed cross-entropy of a block of rows."""
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jnp.sum(lse - jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0])


def plain_loss(input, weight, targets):
    """The same math for plain autodiff: the full ``(tokens, vocab)`` logits."""
    return _chunk_loss(input @ weight.T, targets) / input.shape[0]


def token_scan_loss(input, weight, targets, chunk=128):
    """Plain JAX over token chunks: a scan over a checkpointed body (backward recomputes the logits)."""
    xs, ts = _token_chunks(input, targets, chunk)
    chunk_loss = jax.checkpoint(lambda x, t: _chunk_loss(x @ weight.T, t))

    def step(total, x_and_t):
        return total + chunk_loss(*x_and_t), None

    total, _ = lax.scan(step, jnp.zeros((), input.dtype), (xs, ts))
    return total / input.shape[0]


def vocab_scan_loss(input, weight, targets, vocab_chunk=500):
    """Plain JAX over vocabulary chunks: a scan over a checkpointed body keeping each token's running
    maximum, sum of exponentials and target logit (an online log-sum-exp); backward recomputes each
    chunk's logits. The maximum is under ``lax.stop_gradient``, as in ``jax.nn.logsumexp``."""
    weights, starts = _vocab_chunks(weight, vocab_chunk, targets.dtype)

    @jax.checkpoint
    def step(carry, w_and_start):
        top, total, picked = carry
        w, start = w_and_start
        logits = input @ w.T
        new_top = jnp.maximum(top, lax.stop_gradient(jnp.max(logits, axis=-1)))
        total = total * jnp.exp(top - new_top) + jnp.sum(jnp.exp(logits - new_top[:, None]), axis=-1)
        local = targets - start
        hit = jnp.take_along_axis(logits, jnp.clip(local, 0, vocab_chunk - 1)[:, None], axis=-1)[:, 0]
        picked = picked + jnp.where((local >= 0) & (local < vocab_chunk), hit, 0)
        return (new_top, total, picked), None

    tokens = input.shape[0]
    start = (jnp.full((tokens,), -jnp.inf, input.dtype), jnp.zeros((tokens,), input.dtype))
    (top, total, picked), _ = lax.scan(step, (*start, jnp.zeros((tokens,), input.dtype)), (weights, starts))
    return jnp.mean(top + jnp.log(total) - picked)


PLAIN = "plain autodiff"


def _token_scan_name(token_chunk):
    return f"lax.scan over token chunks of {token_chunk}"


def _vocab_scan_name(vocab_chunk):
    return f"lax.scan over vocab chunks of {vocab_chunk}"


def _jaxfn_name(chunk, vocab_chunk):
    return f"jaxfn, blocks of {chunk} tokens x {vocab_chunk} vocab"


def contenders(chunk=1024, vocab_chunks=(500, 1000, 2000, 4000), token_chunk=128) -> dict:
    """Name -> loss function of ``(input, weight, targets)``: plain JAX's layouts, then jaxfn's."""
    rows = {PLAIN: plain_loss, _token_scan_name(token_chunk): lambda x, w, t: token_scan_loss(x, w, t, token_chunk)}
    for v in vocab_chunks:
        rows[_vocab_scan_name(v)] = lambda x, w, t, v=v: vocab_scan_loss(x, w, t, v)
    for v in vocab_chunks:
        rows[_jaxfn_name(chunk, v)] = lambda x, w, t, v=v: linear_cross_entropy(x, w, t, chunk, v)
    return rows


def loss_and_grads(loss):
    return jax.value_and_grad(loss, argnums=(0, 1))


def example_inputs(tokens, hidden, vocab, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    input = jnp.asarray(rng.standard_normal((tokens, hidden)), dtype)
    weight = jnp.asarray(rng.standard_normal((vocab, hidden)) / hidden**0.5, dtype)
    return input, weight, jnp.asarray(rng.integers(0, vocab, tokens), np.int32)


def example_shapes(tokens, hidden, vocab, dtype=np.float32):
    """``example_inputs``' shapes and dtypes, for compiling without allocating."""
    return (
        jax.ShapeDtypeStruct((tokens, hidden), dtype),
        jax.ShapeDtypeStruct((vocab, hidden), dtype),
        jax.ShapeDtypeStruct((tokens,), np.int32),
    )


def relative_error(grads, reference):
    """The worst ``max|g - r| / max|r|`` over the gradients."""
    return max(float(jnp.max(jnp.abs(g - r)) / jnp.max(jnp.abs(r))) for g, r in zip(grads, reference))


def measure(tokens, hidden, vocab, repeats, run=True, **layout):
    """Per contender: compiled temporary bytes and, when ``run``, median wall and CPU seconds of
    loss+grad and the worst relative gradient error against plain autodiff."""
    args = example_inputs(tokens, hidden, vocab) if run else example_shapes(tokens, hidden, vocab)
    executables = {name: compiled(loss_and_grads(f), *args) for name, f in contenders(**layout).items()}
    results = {name: {"temp": memory(e)["temp"]} for name, e in executables.items()}
    if run:  # compiled already, and each call takes seconds: no warm-up call
        calls = {name: lambda e=e: e(*args) for name, e in executables.items()}
        wall, cpu, outputs = interleaved_wall_and_cpu(calls, repeats, warmup=False)
        for name, r in results.items():
            r.update(wall=wall[name], cpu=cpu[name], error=relative_error(outputs[name][1], outputs[PLAIN][1]))
    return results


def table(results) -> str:
    plain = results[PLAIN]["temp"]
    run = "wall" in results[PLAIN]
    header = ["", "temporaries", "plain / this"] + (["wall time", "CPU time", "grad error vs plain"] if run else [])
    rows = []
    for name, r in results.items():
        row = [name, mb(r["temp"]), f"{plain / r['temp']:.1f}x"]
        rows.append(row + ([ms(r["wall"]), ms(r["cpu"]), f"{r['error']:.1e}"] if run else []))
    return markdown_table(header, rows)


def verdict(results, chunk, vocab_chunks) -> str:
    """The plain-JAX layout with the least temporary memory, and jaxfn at its vocabulary chunk."""
    jaxfn_rows = [_jaxfn_name(chunk, v) for v in vocab_chunks]
    best = min((name for name in results if name not in jaxfn_rows), key=lambda name: results[name]["temp"])
    same = next((_jaxfn_name(chunk, v) for v in vocab_chunks if _vocab_scan_name(v) == best), jaxfn_rows[0])
    b, j = results[best], results[same]
    ratios = [f"temporaries {j['temp'] / b['temp']:.2f}x"]
    if "wall" in j:
        ratios += [f"wall time {j['wall'] / b['wall']:.2f}x", f"CPU time {j['cpu'] / b['cpu']:.2f}x"]
    times = f", wall {ms(b['wall'])}, CPU {ms(b['cpu'])}" if "wall" in b else ""
    return f"least temporaries in plain JAX: {best}, {mb(b['temp'])}{times}\n{same} / that: " + ", ".join(ratios)


def scaled_loss_temp(tokens, hidden, vocab, chunk, vocab_chunk):
    """jaxfn's compiled gradient temporaries when the loss is multiplied by a runtime scalar (a cotangent
    other than the constant 1, which XLA cannot fold away)."""
    scaled = jax.grad(lambda x, w, t, s: s * linear_cross_entropy(x, w, t, chunk, vocab_chunk), argnums=(0, 1))
    args = (*example_shapes(tokens, hidden, vocab), jax.ShapeDtypeStruct((), np.float32))
    return memory(compiled(scaled, *args))["temp"]


BEST_VOCAB_SCAN = "lax.scan over vocab chunks, best chunk"


def memory_by_vocab(tokens, hidden, vocabs, chunk, vocab_chunk, vocab_chunks, token_chunk):
    """Compiled loss+grad temporaries (nothing runs) at each vocabulary size, ``{layout: [bytes, ...]}``:
    plain autodiff, the token-chunked scan, the vocabulary-chunked scan at whichever of ``vocab_chunks``
    needs least there (those chunks are returned too), and jaxfn."""
    names = [PLAIN, _token_scan_name(token_chunk), BEST_VOCAB_SCAN, _jaxfn_name(chunk, vocab_chunk)]
    series, best_chunks = {name: [] for name in names}, []
    for vocab in vocabs:
        args = example_shapes(tokens, hidden, vocab)

        def temp(loss, args=args):
            return memory(compiled(loss_and_grads(loss), *args))["temp"]

        scans = {v: temp(lambda x, w, t, v=v: vocab_scan_loss(x, w, t, v)) for v in vocab_chunks if vocab % v == 0}
        best_chunks.append(min(scans, key=scans.get))
        series[names[0]].append(temp(plain_loss))
        series[names[1]].append(temp(lambda x, w, t: token_scan_loss(x, w, t, token_chunk)))
        series[names[2]].append(scans[best_chunks[-1]])
        series[names[3]].append(temp(lambda x, w, t: linear_cross_entropy(x, w, t, chunk, vocab_chunk)))
    return series, best_chunks


def vocab_table(vocabs, series, best_chunks, hidden) -> str:
    rows = []
    for i, vocab in enumerate(vocabs):
        cells = [
            mb(temps[i]) + (f" (chunk {best_chunks[i]})" if name == BEST_VOCAB_SCAN else "")
            for name, temps in series.items()
        ]
        rows.append([f"{vocab:,}", *cells, mb(vocab * hidden * 4)])
    return markdown_table(["vocab", *series, "the weight, float32"], rows)


def plot(path, vocabs, series, hidden, title):
    """Temporaries against vocabulary size, log-log, one line per layout; the weight's size dashed."""
    from matplotlib.figure import Figure  # only when plotting: matplotlib is the examples extra

    figure = Figure(figsize=(7.5, 4.8), layout="constrained")
    axes = figure.subplots()
    for (name, temps), marker in zip(series.items(), "osD^"):
        axes.plot(vocabs, [t / 1e6 for t in temps], marker=marker, label=name)
    weight = [v * hidden * 4 / 1e6 for v in vocabs]
    axes.plot(vocabs, weight, "k--", linewidth=1, label="the weight (one copy, float32)")
    axes.set(xscale="log", yscale="log", xlabel="vocabulary size", ylabel="compiled temporaries (MB)", title=title)
    axes.set_xticks(vocabs, [f"{v / 1000:g}k" for v in vocabs])
    axes.minorticks_off()
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.savefig(path, dpi=120)


def main(argv=None):
    parser = Parser(__file__, __doc__)
    parser.add_argument("--tokens", type=positive_int, default=2048, help="rows of the input")
    parser.add_argument("--hidden", type=positive_int, default=256, help="columns of the input and the weight")
    parser.add_argument("--vocab", type=positive_int, default=32000, help="rows of the weight")
    parser.add_argument("--chunk", type=positive_int, default=1024, help="jaxfn's token chunk (divides --tokens)")
    parser.add_argument(
        "--vocab-chunks", type=positive_int, nargs="+", default=[500, 1000, 2000, 4000], help="each divides --vocab"
    )
    parser.add_argument("--token-chunk", type=positive_int, default=128, help="the token-chunked scan's chunk")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed runs of each contender (the median)")
    parser.add_argument("--small", action="store_true", help="tokens 512, hidden 64, vocab 4000, chunks 128/64")
    parser.add_argument("--memory-only", action="store_true", help="compile and report memory; run nothing")
    add_plot(parser, "also plot temporaries against vocabulary size (compiled only)")
    parser.add_argument(
        "--plot-vocabs", type=positive_int, nargs="+", default=PLOT_VOCABS, help="the plot's vocabulary sizes"
    )
    a = parser.parse_args(argv)
    if a.small:
        a.tokens, a.hidden, a.vocab, a.chunk, a.token_chunk = 512, 64, 4000, 128, 64
    # jaxfn's blocks shrink to fit small inputs; the scans' chunks must divide what they walk
    token_chunks = [min(a.chunk, a.tokens), a.token_chunk]
    for flag, size, chunks in [("--tokens", a.tokens, token_chunks), ("--vocab", a.vocab, a.vocab_chunks)]:
        for chunk in chunks:
            if size % chunk:
                parser.error(f"{flag} {size} must be a multiple of every chunk of it, but {chunk} does not divide it")
    layout = {"chunk": a.chunk, "vocab_chunks": a.vocab_chunks, "token_chunk": a.token_chunk}
    results = measure(a.tokens, a.hidden, a.vocab, a.repeats, run=not a.memory_only, **layout)
    print(f"loss + gradient (input, weight), tokens {a.tokens}, hidden {a.hidden}, vocab {a.vocab}, float32")
    print(f"{machine()}" + ("; compiled only" if a.memory_only else f"; medians of {a.repeats}, interleaved") + "\n")
    print(table(results) + "\n\n" + verdict(results, a.chunk, a.vocab_chunks))
    vocab_chunk = min(a.vocab_chunks)
    scaled = scaled_loss_temp(a.tokens, a.hidden, a.vocab, a.chunk, vocab_chunk)
    print(f"{_jaxfn_name(a.chunk, vocab_chunk)}, gradient of the loss times a runtime scalar: {mb(scaled)}")
    if a.plot:
        series, best = memory_by_vocab(
            a.tokens, a.hidden, a.plot_vocabs, a.chunk, vocab_chunk, a.vocab_chunks, a.token_chunk
        )
        title = f"loss + gradient, tokens {a.tokens}, hidden {a.hidden}, float32"
        plot(a.plot, a.plot_vocabs, series, a.hidden, title)
        print(f"\ncompiled temporaries by vocabulary size, {title}; compiled only; plotted to {a.plot}\n")
        print(vocab_table(a.plot_vocabs, series, best, a.hidden))


if __name__ == "__main__":
    main()
