"""A transformer MLP block with a hand-written LayerNorm and GELU, trained under checkpoint policies.

The block is pre-norm and attention-free: ``x + gelu(layernorm(x) @ W1 + b1) @ W2 + b2``, shapes
``(tokens, d_model)``, hidden ``4 * d_model``, ``depth`` blocks under ``lax.scan`` over stacked
parameters. LayerNorm and GELU are jaxfn functions with a backward by hand; what their forwards
save crosses to backward under stable names (``layernorm.x_hat``, ``layernorm.rstd``,
``layernorm.scale``, ``gelu.x``), and the block names its first matmul's output ``mlp.z`` itself
(``checkpoint_name``), so a ``jax.checkpoint`` policy picks residuals by name:

- everything: no checkpoint, every residual the backward reads is kept;
- names: ``save_only_these_names(...)`` keeps only those and recomputes the rest of the block in
  the backward pass: the normalised input (``layernorm.x_hat``, ``layernorm.rstd``), GELU's saved
  input (``gelu.x``), or the block's ``mlp.z`` (the same values as ``gelu.x``, but the block's own:
  keeping it spares recomputing the matmul, keeping ``gelu.x`` does not);
- nothing: ``nothing_saveable``, each block keeps only its input and recomputes everything;
- offload: ``save_and_offload_only_these_names`` moves ``mlp.z`` to pinned host memory; skipped on
  CPU, where JAX lowers the move as the identity, unless ``--offload`` asks for it.

Each policy trains its own copy of the model with SGD for ``--steps`` steps, in turn with the
others; the tables give XLA's compiled memory of the training step, its matmul count, its median
wall and process CPU time, and the residuals ``jaxfn.saved`` reports (for one block, and for the
loss). Gradients are asserted equal across policies and to ``jax.grad`` of the plain-JAX block:

    python examples/gallery/transformer_block.py                  # tokens 512, d_model 256, depths 2 8
    python examples/gallery/transformer_block.py --full           # tokens 1024, depths 2 4 8 16: the page's tables
    python examples/gallery/transformer_block.py --small          # tokens 128, d_model 32, depths 2 4
    python examples/gallery/transformer_block.py --full --plot docs/images/transformer_block.png
"""

from __future__ import annotations

import statistics
import time

try:
    import resource
except ImportError:  # not on Windows: no page-fault count there
    resource = None

import jax
import jax.numpy as jnp
import numpy as np
from _gallery import Parser, add_plot, compiled, machine, markdown_table, mb, memory, ms, positive_float, positive_int
from jax import lax
from jax.ad_checkpoint import checkpoint_name

import jaxfn

# --8<-- [start:function]
EPS = 1e-5
SQRT_2 = float(np.sqrt(2.0))
SQRT_2PI = float(np.sqrt(2.0 * np.pi))


# The two custom functions


def _layernorm_forward(ctx, x, scale, bias):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    rstd = lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + EPS)
    x_hat = centred * rstd
    ctx.save_for_backward(x_hat=x_hat, rstd=rstd, scale=scale)  # "layernorm.x_hat", ...
    return x_hat * scale + bias


def _layernorm_backward(ctx, grad_output):
    s = ctx.saved_variables
    g = grad_output * s.scale
    mean_g = jnp.mean(g, axis=-1, keepdims=True)
    mean_gx = jnp.mean(g * s.x_hat, axis=-1, keepdims=True)
    grads = {"x": s.rstd * (g - mean_g - s.x_hat * mean_gx)}
    rows = tuple(range(grad_output.ndim - 1))
    if ctx.needs_input_grad.scale:
        grads["scale"] = jnp.sum(grad_output * s.x_hat, axis=rows)
    if ctx.needs_input_grad.bias:
        grads["bias"] = jnp.sum(grad_output, axis=rows)
    return grads


layernorm = jaxfn.autograd_function(_layernorm_forward, _layernorm_backward, name="layernorm")


def _gelu_forward(ctx, x):
    ctx.save_for_backward(x=x)  # "gelu.x": the input only, the normal cdf and pdf are recomputed
    return 0.5 * x * (1.0 + lax.erf(x / SQRT_2))


def _gelu_backward(ctx, grad_output):
    x = ctx.saved_variables.x
    cdf = 0.5 * (1.0 + lax.erf(x / SQRT_2))
    pdf = jnp.exp(-0.5 * x * x) / SQRT_2PI
    return grad_output * (cdf + x * pdf)


gelu = jaxfn.autograd_function(_gelu_forward, _gelu_backward, name="gelu")
# --8<-- [end:function]


def plain_layernorm(x, scale, bias):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    return centred * lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + EPS) * scale + bias


def plain_gelu(x):
    return 0.5 * x * (1.0 + lax.erf(x / SQRT_2))


# The block, the model and its training step


# --8<-- [start:block]
def make_block(norm, activation):
    def block(p, x):
        h = norm(x, p["scale"], p["bias"])
        z = checkpoint_name(h @ p["w1"] + p["b1"], "mlp.z")  # the block's own name for its first matmul
        return x + activation(z) @ p["w2"] + p["b2"]

    return block


block = make_block(layernorm, gelu)
# --8<-- [end:block]
plain_block = make_block(plain_layernorm, plain_gelu)

_cp = jax.checkpoint_policies
NORMALISED = ("layernorm.x_hat", "layernorm.rstd")
OFFLOADED = "offload mlp.z"
# label -> (block, checkpoint policy); None: no jax.checkpoint
POLICIES = {
    "everything": (block, None),
    "names: x_hat, rstd": (block, _cp.save_only_these_names(*NORMALISED)),
    "names: gelu.x": (block, _cp.save_only_these_names("gelu.x")),
    "names: mlp.z": (block, _cp.save_only_these_names("mlp.z")),
    "nothing": (block, _cp.nothing_saveable),
    OFFLOADED: (
        block,
        _cp.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=["mlp.z"],
            offload_src="device",
            offload_dst="pinned_host",
        ),
    ),
}
REFERENCE = "plain JAX autodiff"
CONTENDERS = {**POLICIES, REFERENCE: (plain_block, None)}


def checkpointed(block_fn, policy):
    return block_fn if policy is None else jax.checkpoint(block_fn, policy=policy)


def model(block_fn, policy):
    """``depth`` blocks over stacked parameters (their leading axis) under ``lax.scan``."""
    body = checkpointed(block_fn, policy)

    def apply(params, x):
        out, _ = lax.scan(lambda carry, p: (body(p, carry), None), x, params)
        return out

    return apply


def loss_fn(block_fn, policy):
    apply = model(block_fn, policy)

    def loss(params, x, y):
        return jnp.mean((apply(params, x) - y) ** 2)

    return loss


def train_step(block_fn, policy, lr):
    """One SGD step: the new parameters and the loss before it."""
    loss = loss_fn(block_fn, policy)

    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), value

    return step


def example_inputs(tokens, d_model, depth, seed=0, dtype=np.float32):
    """Stacked parameters of ``depth`` blocks, an input and a regression target."""
    rng = np.random.default_rng(seed)
    hidden = 4 * d_model

    def normal(*shape, std):
        return jnp.asarray(rng.standard_normal(shape) * std, dtype)

    params = {
        "scale": jnp.asarray(1.0 + 0.1 * rng.standard_normal((depth, d_model)), dtype),
        "bias": normal(depth, d_model, std=0.1),
        "w1": normal(depth, d_model, hidden, std=d_model**-0.5),
        "b1": normal(depth, hidden, std=0.1),
        "w2": normal(depth, hidden, d_model, std=hidden**-0.5 / depth**0.5),
        "b2": normal(depth, d_model, std=0.1),
    }
    return params, normal(tokens, d_model, std=1.0), normal(tokens, d_model, std=1.0)


# What each policy keeps


def residual_name(row):
    """A ``jaxfn.saved`` row's checkpoint name (``"layernorm.x_hat"``, ``"mlp.z"``), or None."""
    if row.function:
        return f"{row.function}.{row.save}"
    if row.save.startswith("named '"):  # a name that is not a jaxfn save (the block's own "mlp.z")
        return row.save[len("named '") :].split("'", 1)[0]
    return None


def kept_per_block(block_fn, policy, params, x):
    """What ``jaxfn.saved`` reports one block keeps: its named residuals, and how many unnamed new ones."""
    one = jax.tree.map(lambda a: a[0], params)
    report = jaxfn.saved(lambda p, x: jnp.sum(checkpointed(block_fn, policy)(p, x)), one, x)
    report = [r for r in report if r.nbytes]
    names = [residual_name(r) for r in report]
    named = list(dict.fromkeys(n for n in names if n))
    host = sum(1 for r in report if r.save.startswith("output of device_put"))  # an offloaded one loses its name
    others = sum(1 for n, r in zip(names, report) if n is None and r.kind == "new") - host
    parts = named + [f"+{others} unnamed"] * bool(others) + [f"{host} offloaded"] * bool(host)
    return ", ".join(parts) or "its arguments only"


def kept_by_loss(block_fn, policy, params, x, y):
    """``jaxfn.saved`` on the whole loss: how many residuals besides its arguments, and their bytes.
    (Under ``lax.scan`` a residual is a stacked output of the scan, its name not visible.)"""
    report = jaxfn.saved(loss_fn(block_fn, policy), params, x, y)
    new = [r for r in report if r.kind == "new" and r.nbytes]
    return len(new), sum(r.nbytes for r in new)


CUBLAS = ("__cublas$gemm", "__cublas$lt$matmul")  # a matmul on GPU, where it is not a dot


def matmuls(executable):
    """How many matrix products the compiled step holds (forward 2 and backward 4 per block,
    one more where the first is recomputed). Under scan each loop body is compiled once."""
    text = executable.as_text()
    return text.count(" dot(") + sum(text.count(f'custom_call_target="{t}"') for t in CUBLAS)


def gradients(block_fn, policy, params, x, y):
    return jax.jit(jax.grad(loss_fn(block_fn, policy)))(params, x, y)


def largest_difference(grads, reference):
    """max |g - r| / max |r| over the parameters (each leaf scaled by its own largest gradient)."""
    leaves = zip(jax.tree.leaves(grads), jax.tree.leaves(reference))
    return max(float(jnp.max(jnp.abs(g - r)) / jnp.max(jnp.abs(r))) for g, r in leaves)


def offload_applies():
    """Whether moving residuals to host memory means anything: on CPU JAX lowers the move to nothing."""
    return jax.devices()[0].platform != "cpu"


def contenders(offload):
    return {n: c for n, c in CONTENDERS.items() if offload or n != OFFLOADED}


def assert_same_gradients(chosen, params, x, y, tolerance=1e-4):
    """Every contender's gradients against plain autodiff's and the first policy's; the differences."""
    reference = gradients(plain_block, None, params, x, y)
    first = None
    differences = {}
    for name, (block_fn, policy) in chosen.items():
        grads = gradients(block_fn, policy, params, x, y)
        first = grads if first is None else first
        differences[name] = largest_difference(grads, reference)
        between = largest_difference(grads, first)
        assert differences[name] < tolerance, f"{name}: gradients differ from plain autodiff by {differences[name]}"
        assert between < tolerance, f"{name}: gradients differ from {next(iter(chosen))}'s by {between}"
    return differences


# Measuring


def page_faults():
    """Minor page faults of this process so far (memory the kernel maps on first touch), or 0."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else 0


def interleaved_training(steps, state, repeats):
    """Train each contender ``repeats`` SGD steps, in turn within each repeat. Per step, medians:
    wall seconds, CPU seconds (``time.process_time``: all threads, user and system) and minor
    page faults; and every step's loss."""
    kinds = ("wall", "cpu", "faults", "losses")
    out = {kind: {name: [] for name in steps} for kind in kinds}
    for name, step in steps.items():  # warm-up, its result dropped
        jax.block_until_ready(step(*state[name]))
    for _ in range(repeats):
        for name, step in steps.items():
            params, x, y = state[name]
            start, start_cpu, start_faults = time.perf_counter(), time.process_time(), page_faults()
            params, loss = jax.block_until_ready(step(params, x, y))
            out["wall"][name].append(time.perf_counter() - start)
            out["cpu"][name].append(time.process_time() - start_cpu)
            out["faults"][name].append(page_faults() - start_faults)
            out["losses"][name].append(float(loss))
            state[name] = (params, x, y)
    medians = {kind: {n: statistics.median(v) for n, v in out[kind].items()} for kind in kinds[:3]}
    return medians, out["losses"]


def measure(tokens, d_model, depth, steps, lr, offload):
    params, x, y = example_inputs(tokens, d_model, depth)
    chosen = contenders(offload)
    differences = assert_same_gradients(chosen, params, x, y)
    executables = {n: compiled(train_step(b, p, lr), params, x, y) for n, (b, p) in chosen.items()}
    medians, losses = interleaved_training(executables, {n: (params, x, y) for n in chosen}, steps)
    for name in chosen:  # the same gradients, the same training
        np.testing.assert_allclose(losses[name], losses[REFERENCE], rtol=1e-4)
    rows = []
    for name, (block_fn, policy) in chosen.items():
        count, nbytes = kept_by_loss(block_fn, policy, params, x, y)
        rows.append(
            {
                "depth": depth,
                "policy": name,
                "kept per block": kept_per_block(block_fn, policy, params, x),
                "residuals": count,
                "residual bytes": nbytes,
                "temp": memory(executables[name])["temp"],
                "matmuls": matmuls(executables[name]),
                "wall": medians["wall"][name],
                "cpu": medians["cpu"][name],
                "faults": medians["faults"][name],
                "difference": differences[name],
                "losses": losses[name],
            }
        )
    return rows


def detail_table(rows):
    header = ["policy", "kept per block (jaxfn.saved)", "residuals kept (loss)", "XLA temp", "matmuls"]
    header += ["step", "step CPU", "page faults", "grad diff vs plain", f"loss, {len(rows[0]['losses'])} steps"]
    cells = [
        [
            r["policy"],
            r["kept per block"],
            f"{r['residuals']}, {mb(r['residual bytes'])}",
            mb(r["temp"]),
            r["matmuls"],
            ms(r["wall"]),
            ms(r["cpu"]),
            f"{r['faults']:,.0f}",
            f"{r['difference']:.1e}",
            f"{r['losses'][0]:.4f} → {r['losses'][-1]:.4f}",
        ]
        for r in rows
    ]
    return markdown_table(header, cells)


def depth_table(rows):
    depths = list(dict.fromkeys(r["depth"] for r in rows))
    by = {(r["policy"], r["depth"]): r for r in rows}
    header = ["policy"] + [f"depth {d}: temp, step (CPU)" for d in depths]
    cells = [
        [name] + [f"{mb(by[name, d]['temp'])}, {ms(by[name, d]['wall'])} ({ms(by[name, d]['cpu'])})" for d in depths]
        for name in dict.fromkeys(r["policy"] for r in rows)
    ]
    return markdown_table(header, cells)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(1, 3, figsize=(15, 4.2))
    what = [("temp", 1e-6, "MB", "XLA temporaries of the training step"), ("wall", 1e3, "ms", "step, median wall time")]
    what.append(("cpu", 1e3, "ms", "step, median process CPU time"))
    depths = sorted({r["depth"] for r in rows})
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        for axes, (key, scale, _, _) in zip(panels, what):
            axes.plot([r["depth"] for r in mine], [r[key] * scale for r in mine], "--" if name == REFERENCE else "-")
            axes.lines[-1].set(marker="o", label=name)
    for axes, (_, _, unit, title) in zip(panels, what):
        axes.set(xlabel="depth (blocks)", ylabel=unit, title=title, xticks=depths, ylim=(0, None))
        axes.grid(alpha=0.3)
    panels[0].legend(fontsize=8)
    figure.suptitle(machine(), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None):
    parser = Parser(__file__, __doc__)
    parser.add_argument("--tokens", type=positive_int, default=512, help="rows of the block's input")
    parser.add_argument("--d-model", type=positive_int, default=256, help="the model width (hidden: 4 times it)")
    parser.add_argument("--depths", type=positive_int, nargs="+", default=[2, 8], help="blocks, a run each")
    parser.add_argument("--steps", type=positive_int, default=10, help="SGD steps per policy, the timing's repeats")
    parser.add_argument("--lr", type=positive_float, default=0.1, help="SGD learning rate")
    parser.add_argument("--offload", action="store_true", help="measure the offload policy on CPU too")
    parser.add_argument("--small", action="store_true", help="tokens 128, d_model 32, depths 2 4, 3 steps")
    parser.add_argument(
        "--full",
        action="store_true",
        help="tokens 1024, depths 2 4 8 16: the gallery page's tables (about 2 minutes on 2 cores)",
    )
    add_plot(parser, "temporaries and step time against depth")
    a = parser.parse_args(argv)
    if a.small:
        a.tokens, a.d_model, a.depths, a.steps = 128, 32, [2, 4], 3
    if a.full:
        a.tokens, a.depths = 1024, [2, 4, 8, 16]
    offload = a.offload or offload_applies()
    rows = [r for depth in a.depths for r in measure(a.tokens, a.d_model, depth, a.steps, a.lr, offload)]
    deepest = max(a.depths)
    print(
        f"SGD training step of pre-norm MLP blocks (jaxfn LayerNorm and GELU) under lax.scan, tokens {a.tokens}, "
        f"d_model {a.d_model}, hidden {4 * a.d_model}, float32, lr {a.lr}"
    )
    print(f"{machine()}; medians of {a.steps} steps, interleaved\n")
    print(f"depth {deepest}:\n")
    print(detail_table([r for r in rows if r["depth"] == deepest]))
    print("\nby depth (XLA temporaries, median step wall time and CPU time):\n")
    print(depth_table(rows))
    if not offload:
        print(
            f"\n{OFFLOADED}: skipped on {jax.devices()[0].platform}: JAX lowers the move to pinned_host as the "
            "identity here (no transfer, one memory); --offload measures it anyway"
        )
    if a.plot:
        plot(rows, a.plot)
        print(f"\nplot: {a.plot}")


if __name__ == "__main__":
    main()
