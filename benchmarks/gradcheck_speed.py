"""How long ``jaxfn.gradcheck`` takes, and how many programs it compiles, on functions with
unrolled Python loops and on larger Jacobians.

Each row runs in a fresh Python process (no compilation cache), so the first call's time is
what a user sees, compiles included; the second call is the same check again in that process:

    python benchmarks/gradcheck_speed.py            # the markdown table, PyTorch's gradcheck beside it
    python benchmarks/gradcheck_speed.py --row bisection   # one row, as JSON
    PYTHONPATH=/path/to/other/checkout python benchmarks/gradcheck_speed.py   # another jaxfn's gradcheck

"compiled" counts XLA compilations (JAX's `/jax/core/compile/backend_compile_duration` event),
JAX's one-operation programs included (an eager `jnp.sin` compiles once per shape and dtype);
"compiled again" those of the second call: the programs made for this call alone (a whole
function, jitted or in a `lax.map`), since one-operation programs are cached.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

COMPILED = "/jax/core/compile/backend_compile_duration"


def bisection(steps: int = 50):
    """A sparsemax-like projection found by ``steps`` bisection steps in a Python loop (as entmax's
    ported bisection code): per row, the tau with sum(max(x - tau, 0)) = radius."""
    import jax.numpy as jnp

    import jaxfn

    def forward(ctx, x, radius):
        hi = jnp.max(x, axis=-1, keepdims=True)
        lo = hi - radius
        for _ in range(steps):
            tau = (lo + hi) / 2
            above = jnp.sum(jnp.maximum(x - tau, 0), axis=-1, keepdims=True) > radius
            lo, hi = jnp.where(above, tau, lo), jnp.where(above, hi, tau)
        p = jnp.maximum(x - (lo + hi) / 2, 0)
        ctx.save_for_backward(p)
        return p

    def backward(ctx, g):  # sparsemax's: on the support, g minus its mean there; radius: that mean
        (p,) = ctx.saved_tensors
        support = p > 0
        mean = jnp.sum(jnp.where(support, g, 0), -1, keepdims=True) / jnp.sum(support, -1, keepdims=True)
        return jnp.where(support, g - mean, 0), jnp.sum(mean)

    return jaxfn.autograd_function(forward, backward, name=f"bisection{steps}")


def _rows():
    import jax
    import numpy as np

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from seeds import exp2, linear

    key = jax.random.split(jax.random.key(0), 4)
    x36 = jax.random.normal(key[0], (3, 6))
    return {
        "bisection": ("50-step bisection, 3x6 float32 + scalar", bisection(), (x36, 1.0)),
        "bisection64": ("50-step bisection, 3x6 float64 + scalar", bisection(), (np.asarray(x36, np.float64), 1.0)),
        "exp2": ("exp2, 64 elements", exp2, (jax.random.normal(key[1], (64,)) * 0.1,)),
        "linear": (
            "R torch's linear, 2,620 inputs x 640 outputs",
            linear,
            (
                jax.random.normal(key[1], (20, 128)),
                jax.random.normal(key[2], (32, 128)),
                jax.random.normal(key[3], (32,)),
            ),
        ),
        "exp2_4096": ("exp2, 4,096 elements (random directions)", exp2, (jax.random.normal(key[1], (64, 64)) * 0.1,)),
    }


def torch_bisection(steps: int = 50):
    """The same bisection as a PyTorch Function (float64, as torch.autograd.gradcheck wants)."""
    import torch

    class Bisection(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, radius):
            hi = x.max(-1, keepdim=True).values
            lo = hi - radius
            for _ in range(steps):
                tau = (lo + hi) / 2
                above = (x - tau).clamp(min=0).sum(-1, keepdim=True) > radius
                lo, hi = torch.where(above, tau, lo), torch.where(above, hi, tau)
            p = (x - (lo + hi) / 2).clamp(min=0)
            ctx.save_for_backward(p)
            return p

        @staticmethod
        def backward(ctx, g):
            (p,) = ctx.saved_tensors
            support = p > 0
            mean = torch.where(support, g, 0).sum(-1, keepdim=True) / support.sum(-1, keepdim=True)
            return torch.where(support, g - mean, 0), mean.sum()

    return Bisection


def run_torch_row() -> dict:
    """PyTorch's torch.autograd.gradcheck on the bisection case (its first and second call)."""
    import jax
    import numpy as np
    import torch

    x = torch.tensor(np.asarray(jax.random.normal(jax.random.split(jax.random.key(0), 4)[0], (3, 6)), np.float64))
    args = (x.requires_grad_(), torch.tensor(1.0, dtype=torch.float64, requires_grad=True))
    function = torch_bisection()
    start = time.perf_counter()
    assert torch.autograd.gradcheck(function.apply, args)
    first = time.perf_counter() - start
    start = time.perf_counter()
    assert torch.autograd.gradcheck(function.apply, args)
    return {
        "row": "PyTorch's gradcheck, 50-step bisection, 3x6 float64 + scalar",
        "first_s": first,
        "compiled": "",
        "second_s": time.perf_counter() - start,
        "compiled_second": "",
    }


def run_row(name: str) -> dict:
    import jax

    import jaxfn

    counts = {COMPILED: 0}

    def listener(event, duration, **kwargs):
        if event in counts:
            counts[event] += 1

    label, fn, args = _rows()[name]
    jax.monitoring.register_event_duration_secs_listener(listener)
    start = time.perf_counter()
    assert jaxfn.gradcheck(fn, *args)
    first = time.perf_counter() - start
    compiled = counts[COMPILED]
    start = time.perf_counter()
    assert jaxfn.gradcheck(fn, *args)
    second = time.perf_counter() - start
    return {
        "row": label,
        "first_s": first,
        "compiled": compiled,
        "second_s": second,
        "compiled_second": counts[COMPILED] - compiled,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", help="run one row in this process and print it as JSON")
    options = parser.parse_args()
    if options.row:
        print(json.dumps(run_torch_row() if options.row == "torch" else run_row(options.row)))
        return
    environment = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    import jax

    import jaxfn

    where = os.path.dirname(os.path.dirname(os.path.abspath(jaxfn.__file__)))
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs"
    print(f"jaxfn.gradcheck of the jaxfn in {where}, jax {jax.__version__}, {machine}\n")
    print("| check | first call (s) | compiled | second call (s) | compiled again |")
    print("|---|---:|---:|---:|---:|")
    rows = ["bisection", "bisection64", "exp2", "linear", "exp2_4096"]
    try:
        import torch  # noqa: F401

        rows.insert(2, "torch")
    except ImportError:
        pass
    for name in rows:
        result = subprocess.run(
            [sys.executable, __file__, "--row", name], capture_output=True, text=True, env=environment, check=True
        )
        r = json.loads(result.stdout.strip().splitlines()[-1])
        print(f"| {r['row']} | {r['first_s']:.2f} | {r['compiled']} | {r['second_s']:.2f} | {r['compiled_second']} |")


if __name__ == "__main__":
    main()
