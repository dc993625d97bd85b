"""Implicit differentiation of a fixed point: a deep-equilibrium layer ``z = tanh(z @ W.T + x @ U.T)``.

``fixed_point(layer, start, iterations)`` takes the layer as a function that closes over the
parameters (a plain closure here; an Equinox module works the same). Forward solves for ``z`` by
iteration; backward solves the adjoint equation ``v = g + v dlayer/dz`` by the same iteration
(through the layer's ``jax.vjp`` at the solution), saves only the solution ``z``, never the
iterates, and returns the gradient of what the layer closes over as the layer's own cotangent.
Plain autodiff through the unrolled loop keeps every iterate, so its memory grows with the
iteration count while this one stays flat:

    python examples/gallery/deq_fixed_point.py                 # batch 64, width 256, 10/100/1000 iterations
    python examples/gallery/deq_fixed_point.py --iterations 10 100 --width 64
    python examples/gallery/deq_fixed_point.py --plot docs/images/deq_fixed_point_memory.png   # memory by iterations
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from _gallery import (
    Parser,
    add_plot,
    compiled,
    interleaved_medians,
    machine,
    markdown_table,
    mb,
    memory,
    ms,
    positive_int,
)
from jax import lax

import jaxfn


# --8<-- [start:function]
def _iterate(step, start, iterations):
    return lax.fori_loop(0, iterations, lambda _, z: step(z), start)


def plain_fixed_point(x, weight, input_weight, iterations=100):
    """The unrolled solve, for plain autodiff (which differentiates through every iterate)."""
    injection = x @ input_weight.T
    start = jnp.zeros((x.shape[0], weight.shape[0]), x.dtype)
    return _iterate(lambda z: jnp.tanh(z @ weight.T + injection), start, iterations)


def _forward(ctx, layer, start, iterations=100):
    z = _iterate(layer, start, iterations)
    ctx.save_for_backward(layer=layer, z=z, iterations=iterations)
    return z


def _backward(ctx, grad_output):
    saved = ctx.saved_variables
    _, pull = jax.vjp(lambda layer, z: layer(z), saved.layer, saved.z)  # the layer's pullback at the solution
    adjoint = _iterate(lambda v: grad_output + pull(v)[1], grad_output, saved.iterations)  # v = g + v dlayer/dz
    grad_layer, _ = pull(adjoint)
    return {"layer": grad_layer}  # the gradient of what the layer closes over


fixed_point = jaxfn.autograd_function(_forward, _backward, name="fixed_point")


def deq_layer(x, weight, input_weight, iterations=100):
    """The deep-equilibrium layer: its fixed point, with a layer closing over the parameters."""
    injection = x @ input_weight.T
    layer = lambda z: jnp.tanh(z @ weight.T + injection)  # noqa: E731 - closes over weight and injection
    return fixed_point(layer, jnp.zeros((x.shape[0], weight.shape[0]), x.dtype), iterations)


# --8<-- [end:function]


def example_inputs(batch, width, features, contraction=0.5, seed=0, dtype=np.float32):
    """Inputs with ``||weight||_2 = contraction < 1``, so the iteration converges."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((width, width))
    weight *= contraction / np.linalg.norm(weight, 2)
    input_weight = rng.standard_normal((width, features)) / features**0.5
    arrays = rng.standard_normal((batch, features)), weight, input_weight, rng.standard_normal((batch, width))
    return tuple(jnp.asarray(a, dtype) for a in arrays)


def loss(solve, iterations):
    """A squared error on the layer's output, as a function of (x, weight, input_weight, target)."""
    return lambda x, w, u, target: 0.5 * jnp.sum((solve(x, w, u, iterations) - target) ** 2)


def _pullback(solve, iterations):
    """Forward as ``jax.vjp``: the output and the pullback (a pytree holding the residuals)."""
    return lambda x, w, u: jax.vjp(lambda x, w, u: solve(x, w, u, iterations), x, w, u)


def _backward_only(pullback, cotangent):
    return pullback(cotangent)


def measure_row(iterations, args, repeats):
    """Compiled loss+grad temporaries and pullback time, unrolled vs jaxfn, at one iteration count."""
    solvers = {"unrolled": plain_fixed_point, "jaxfn": deq_layer}
    temps = {n: memory(compiled(jax.grad(loss(s, iterations), (0, 1, 2)), *args))["temp"] for n, s in solvers.items()}
    x, w, u, target = args
    pullbacks = {n: jax.jit(_pullback(s, iterations))(x, w, u)[1] for n, s in solvers.items()}
    backward = jax.jit(_backward_only)
    calls = {n: lambda p=p: backward(p, target) for n, p in pullbacks.items()}  # target as the cotangent
    times, grads = interleaved_medians(calls, repeats)
    error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(grads["jaxfn"], grads["unrolled"]))
    scale = max(float(jnp.max(jnp.abs(b))) for b in grads["unrolled"])
    residual_bytes = {n: sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(p)) for n, p in pullbacks.items()}
    return [
        iterations,
        mb(temps["unrolled"]),
        mb(temps["jaxfn"]),
        mb(residual_bytes["unrolled"]),
        mb(residual_bytes["jaxfn"]),
        ms(times["unrolled"]),
        ms(times["jaxfn"]),
        f"{error:.1e} (of {scale:.1f})",
    ]


PLOT_ITERATIONS = [10, 30, 100, 300, 1000, 3000]


def memory_by_iterations(args, counts):
    """Compiled loss+grad temporaries (bytes) at each iteration count: unrolled, and jaxfn."""
    solvers = {"plain autodiff, unrolled loop": plain_fixed_point, "jaxfn, implicit backward": deq_layer}
    return {
        name: [memory(compiled(jax.grad(loss(solve, n), (0, 1, 2)), *args))["temp"] for n in counts]
        for name, solve in solvers.items()
    }


def plot(path, counts, series, title):
    """Temporaries against iterations, log-log; matplotlib only when plotting (the examples extra)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5))
    axes = figure.subplots()
    for (name, temps), marker in zip(series.items(), "os"):
        axes.plot(counts, [t / 1e6 for t in temps], marker=marker, label=name)
    axes.set(xscale="log", yscale="log", xlabel="fixed-point iterations", ylabel="compiled temporaries (MB)")
    axes.set_title(title, fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv=None):
    parser = Parser(__file__, __doc__)
    parser.add_argument("--batch", type=positive_int, default=64, help="rows of x")
    parser.add_argument("--width", type=positive_int, default=256, help="size of z")
    parser.add_argument("--features", type=positive_int, default=64, help="size of x")
    parser.add_argument(
        "--iterations", type=positive_int, nargs="+", default=[10, 100, 1000], help="fixed-point iterations, a row each"
    )
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed runs of each backward (the median)")
    add_plot(parser, "instead of the table, plot temporaries against iterations (compiled only, nothing runs)")
    parser.add_argument(
        "--plot-iterations", type=positive_int, nargs="+", default=PLOT_ITERATIONS, help="the plot's iteration counts"
    )
    a = parser.parse_args(argv)
    args = example_inputs(a.batch, a.width, a.features)
    if a.plot:
        series = memory_by_iterations(args, a.plot_iterations)
        title = f"loss + gradient, batch {a.batch}, width {a.width}, float32 ({machine()})"
        plot(a.plot, a.plot_iterations, series, title)
        print(f"compiled temporaries by iterations, {title}; compiled only; plotted to {a.plot}\n")
        rows = [[n, *(mb(temps[i]) for temps in series.values())] for i, n in enumerate(a.plot_iterations)]
        print(markdown_table(["iterations", *series], rows))
        return
    rows = [measure_row(n, args, a.repeats) for n in a.iterations]
    print(f"z = tanh(z @ W.T + x @ U.T), batch {a.batch}, width {a.width}, features {a.features}, float32")
    print(f"{machine()}; backward = the compiled pullback alone, medians of {a.repeats}, interleaved\n")
    header = ["iterations", "loss+grad temporaries: unrolled", "jaxfn", "residuals: unrolled", "jaxfn"]
    header += ["backward time: unrolled", "jaxfn", "max abs grad diff (of max abs grad)"]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
