"""The per-call cost of jaxfn.from_torch: the same PyTorch Function called in PyTorch directly,
through from_torch, and as its jaxfn port, eagerly and inside a jitted step (CPU).

    python benchmarks/from_torch.py            # the markdown table (medians, microseconds per call)
    python benchmarks/from_torch.py --quick    # fewer repeats

Needs PyTorch (pip install torch==2.13.0). The Function is PyTorch's own "Extending
torch.autograd" LinearFunction on a (64, 32) input and a (16, 32) weight, float32; "forward" is
one call, "forward + backward" one call and the gradients of all three arguments.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

import jaxfn


class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias):
        ctx.save_for_backward(input, weight)
        return input.mm(weight.t()) + bias

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        grad_input = grad_output.mm(weight) if ctx.needs_input_grad[0] else None
        grad_weight = grad_output.t().mm(input) if ctx.needs_input_grad[1] else None
        grad_bias = grad_output.sum(0) if ctx.needs_input_grad[2] else None
        return grad_input, grad_weight, grad_bias


def _port_forward(ctx, input, weight, bias):
    ctx.save_for_backward(input, weight)
    return input @ weight.T + bias


def _port_backward(ctx, grad_output):
    input, weight = ctx.saved_tensors
    return grad_output @ weight, grad_output.T @ input, grad_output.sum(0)


def _median_us(run, repeats: int, number: int) -> float:
    run()  # warm: compile, probe
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            run()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    repeats, number = (3, 20) if options.quick else (7, 100)
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((64, 32), (16, 32), (16,)))
    tx, tw, tb = (torch.from_numpy(a.copy()) for a in (x, w, b))
    gx, gw, gb = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, w, b))
    jx, jw, jb = (jnp.asarray(a) for a in (x, w, b))
    from_torch = jaxfn.from_torch(LinearFunction)
    port = jaxfn.autograd_function(_port_forward, _port_backward, name="linear")

    def torch_forward():
        with torch.no_grad():
            LinearFunction.apply(tx, tw, tb)

    def torch_both():
        grads = torch.autograd.grad(LinearFunction.apply(gx, gw, gb).sum(), (gx, gw, gb))
        return grads

    def jax_rows(f):
        loss = jax.grad(lambda *a: f(*a).sum(), argnums=(0, 1, 2))
        jit_f, jit_loss = jax.jit(f), jax.jit(loss)
        return {
            "eager": (
                lambda: jax.block_until_ready(f(jx, jw, jb)),
                lambda: jax.block_until_ready(loss(jx, jw, jb)),
            ),
            "jitted step": (
                lambda: jax.block_until_ready(jit_f(jx, jw, jb)),
                lambda: jax.block_until_ready(jit_loss(jx, jw, jb)),
            ),
        }

    rows = [("PyTorch, LinearFunction.apply", (torch_forward, torch_both))]
    for label, f in (("jaxfn.from_torch(LinearFunction)", from_torch), ("jaxfn port", port)):
        for where, runs in jax_rows(f).items():
            rows.append((f"{label}, {where}", runs))
    print(f"CPU: {platform.processor() or platform.machine()}, jax {jax.__version__}, torch {torch.__version__}")
    print(f"median of {repeats} x {number} calls, microseconds per call\n")
    print("| call | forward (µs) | forward + backward (µs) |")
    print("|---|---|---|")
    for label, (forward, both) in rows:
        print(f"| {label} | {_median_us(forward, repeats, number):.0f} | {_median_us(both, repeats, number):.0f} |")


if __name__ == "__main__":
    main()
