"""jaxfn vs a hand-written jax.custom_vjp (and plain JAX, and PyTorch if installed), side by side.

Every row is measured in one process, the contenders interleaved, as medians over repeats:

    python benchmarks/bench.py              # the markdown table
    python benchmarks/bench.py --json out.json --quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from seeds import D_IN, D_OUT, LR, H, make_custom_vjp_relu, make_jaxfn_relu, make_step, plain_relu  # noqa: E402

import jaxfn  # noqa: E402

CONTENDERS = {
    "jaxfn": make_jaxfn_relu,
    "jaxfn forward_mode": lambda: make_jaxfn_relu(True),
    "custom_vjp": make_custom_vjp_relu,
    "plain autodiff": lambda: plain_relu,
}


def make_loop(relu, steps):
    step = make_step(relu)
    return jax.jit(lambda params, x, y: lax.fori_loop(0, steps, lambda i, p: step(p, x, y), params))


def data(batch):
    kx, ky, k1, k2 = jax.random.split(jax.random.key(0), 4)
    x, y = jax.random.normal(kx, (batch, D_IN)), jax.random.normal(ky, (batch, D_OUT))
    return (jax.random.normal(k1, (D_IN, H)), jax.random.normal(k2, (H, D_OUT))), x, y


def interleaved(fns: dict, repeats: int, number: int) -> dict:
    """Median seconds per call of each fn, the fns taking turns in every repeat."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(number):
                fn()
            times[name].append((time.perf_counter() - start) / number)
    return {name: statistics.median(t) for name, t in times.items()}


def interleaved_wall_and_cpu(fns: dict, repeats: int) -> dict:
    """Median (wall, process CPU) seconds per call of each fn, the fns taking turns in every repeat
    (CPU time: what other jobs on a shared machine disturb less)."""
    times: dict = {name: ([], []) for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            times[name][0].append(time.perf_counter() - wall)
            times[name][1].append(time.process_time() - cpu)
    return {name: (statistics.median(w), statistics.median(c)) for name, (w, c) in times.items()}


def hlo_count(compiled) -> int:
    return sum(1 for line in compiled.as_text().splitlines() if " = " in line and not line.lstrip().startswith("//"))


def instructions(compiled) -> list:
    """The optimized program's instructions as (result type, opcode), in order: two programs with
    the same list compute the same thing the same way (names and metadata aside)."""
    return re.findall(r" = (\S+) (\w[\w-]*)\(", compiled.as_text())


# -- the rows ----------------------------------------------------------------------------------
def compiled_step(batch, repeats):
    """Per contender: (median wall, median process-CPU) seconds per step, the HLO instruction
    count, and whether the optimized program is custom_vjp's, instruction for instruction."""
    steps = 100 if batch <= 1024 else 20  # keep each measurement near a second
    params, x, y = data(batch)
    loops = {name: make_loop(make(), steps) for name, make in CONTENDERS.items()}
    compiled = {name: loop.lower(params, x, y).compile() for name, loop in loops.items()}
    fns = {name: (lambda c=c: jax.block_until_ready(c(params, x, y))) for name, c in compiled.items()}
    for fn in fns.values():
        fn()
    per_step = {name: (w / steps, c / steps) for name, (w, c) in interleaved_wall_and_cpu(fns, repeats).items()}
    reference = instructions(compiled["custom_vjp"])
    same = {name: instructions(c) == reference for name, c in compiled.items()}
    return per_step, {name: hlo_count(c) for name, c in compiled.items()}, same


def trace_and_compile(repeats):
    params, x, y = data(64)

    def fresh(make):
        return lambda: jax.jit(make_step(make())).lower(params, x, y).compile()

    return interleaved({name: fresh(CONTENDERS[name]) for name in ("jaxfn", "custom_vjp")}, repeats, 1)


_TOKEN = np.zeros((0, 0), np.uint8)


def make_featured_custom_vjp_relu():
    """The ReLU as a hand-written custom_vjp that has what jaxfn's traced call adds in JAX, and
    none of jaxfn's Python: a custom_vjp made per call, symbolic zeros (what ctx.needs_input_grad
    reads), a tuple of outputs, the save's name, a per-trace token residual, and the tie (jaxfn's
    own primitive, which routes an outer differentiation through backward)."""
    from jax.ad_checkpoint import checkpoint_name

    from jaxfn import _tie

    def relu(x):
        @jax.custom_vjp
        def primal(*xs):
            return (jax.numpy.clip(xs[0], min=0),)

        def fwd(*primals):
            x = primals[0].value
            out = _tie.tie(primal, (x,), (jax.numpy.clip(x, min=0),))
            return out, ([checkpoint_name(x, "my_relu.input")], _TOKEN)

        def bwd(residuals, cotangents):
            (saved,), _ = residuals
            return (jax.numpy.where(saved < 0, 0, cotangents[0]),)

        primal.defvjp(fwd, bwd, symbolic_zeros=True)
        return primal(x)[0]

    return relu


TRACE_CONTENDERS = {
    "jaxfn": make_jaxfn_relu,
    "custom_vjp": make_custom_vjp_relu,
    "custom_vjp with jaxfn's features": make_featured_custom_vjp_relu,
}


def chained_trace(n, repeats, bare=False):
    """Tracing jax.grad of n chained calls (fresh functions each repeat), jaxfn against a
    hand-written custom_vjp, and against one that has jaxfn's features in JAX but none of its
    Python: median wall and minimum process-CPU seconds, interleaved. ``bare``: nothing between
    the calls (``x = relu(x)``), so the trace is the calls' alone."""

    def chain(relu):
        def f(x):
            for _ in range(n):
                x = relu(x) if bare else relu(x) * 0.5 + x
            return x.sum()

        return f

    times = {name: ([], []) for name in TRACE_CONTENDERS}
    x = jax.numpy.ones(8)
    for _ in range(repeats):
        for name in times:
            f = jax.grad(chain(TRACE_CONTENDERS[name]()))
            wall, cpu = time.perf_counter(), time.process_time()
            jax.make_jaxpr(f)(x)
            times[name][0].append(time.perf_counter() - wall)
            times[name][1].append(time.process_time() - cpu)
    return {name: (statistics.median(w), min(c)) for name, (w, c) in times.items()}


def eager_call(batch, repeats, number=200):
    """Per call, two ways a loop calls: waiting for each result, and back to back without waiting
    (JAX dispatches asynchronously, so there only the Python work per call shows)."""
    x = jax.random.normal(jax.random.key(1), (batch, H))
    contenders = {
        "jaxfn": make_jaxfn_relu(),
        "custom_vjp": make_custom_vjp_relu(),
        "jaxfn jit=True": make_jaxfn_relu(jit=True),
        "jit plain": jax.jit(plain_relu),
    }
    waited = {name: (lambda f=f: jax.block_until_ready(f(x))) for name, f in contenders.items()}

    def back_to_back(f):
        def run():
            for _ in range(number - 1):
                f(x)
            jax.block_until_ready(f(x))

        return run

    for fn in waited.values():
        for _ in range(4):  # past jit=True's compile: the steady state is what a loop sees
            fn()
    result = {f"{name} waited": t for name, t in interleaved(waited, repeats, number).items()}
    batched = interleaved({name: back_to_back(f) for name, f in contenders.items()}, repeats, 1)
    result.update({f"{name} back to back": t / number for name, t in batched.items()})
    return result


def torch_device(torch):
    """The torch device matching JAX's backend, or None where torch can't run there."""
    backend = jax.default_backend()
    if backend == "cpu":
        return "cpu"
    if backend == "gpu" and torch.cuda.is_available():
        return "cuda"
    return None


def torch_vs_jaxfn(repeats, steps=100):
    try:
        import torch
    except ImportError:
        return None
    device = torch_device(torch)
    if device is None:
        return "skip"
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # every core this process may use

    class MyReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input):
            ctx.save_for_backward(input)
            return input.clamp(min=0)

        @staticmethod
        def backward(ctx, grad_output):
            (input,) = ctx.saved_tensors
            grad_input = grad_output.clone()
            grad_input[input < 0] = 0
            return grad_input

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, D_IN, generator=gen).to(device), torch.randn(64, D_OUT, generator=gen).to(device)
    w1 = torch.randn(D_IN, H, generator=gen).to(device).requires_grad_()
    w2 = torch.randn(H, D_OUT, generator=gen).to(device).requires_grad_()

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def torch_steps():
        for _ in range(steps):
            loss = (MyReLU.apply(x.mm(w1)).mm(w2) - y).pow(2).sum()
            loss.backward()
            with torch.no_grad():
                w1.sub_(LR * w1.grad)
                w2.sub_(LR * w2.grad)
                w1.grad.zero_()
                w2.grad.zero_()
        sync()

    params, jx, jy = data(64)
    loop = make_loop(make_jaxfn_relu(), steps).lower(params, jx, jy).compile()
    fns = {
        "PyTorch autograd.Function (eager)": torch_steps,
        "jaxfn (compiled loop)": lambda: jax.block_until_ready(loop(params, jx, jy)),
    }
    for fn in fns.values():
        fn()
    return {name: t / steps for name, t in interleaved(fns, repeats, 1).items()}, torch.__version__, device


def _relu_jvp(ctx, t):
    return jax.numpy.where(ctx.saved_variables.input < 0, 0, t)


def _saving_relu_forward(ctx, input):
    ctx.save_for_backward(input=input)
    ctx.save_for_forward(input=input)
    return jax.numpy.clip(input, min=0)


def _relu_vmap(info, in_dims, x):
    return jax.numpy.clip(x, min=0), in_dims[0]


def make_builders():
    """The tutorial's ReLU through every builder, and the hand-written custom_vjp."""
    from seeds import _my_relu_backward

    return {
        "custom_vjp": make_custom_vjp_relu(),
        "jaxfn": make_jaxfn_relu(),
        "jaxfn forward_mode": make_jaxfn_relu(True),
        "jaxfn jvp rule": jaxfn.autograd_function(
            _saving_relu_forward, _my_relu_backward, name="my_relu", jvp=_relu_jvp
        ),
        "jaxfn vmap rule": jaxfn.autograd_function(
            _saving_relu_forward, _my_relu_backward, name="my_relu", vmap=_relu_vmap
        ),
    }


def dispatch(batch, repeats, number=300):
    """A jitted training step (one SGD step) called from Python as a training loop calls it, per
    builder: seconds per call, waiting for each result, and back to back."""
    params, x, y = data(batch)
    steps = {name: jax.jit(make_step(relu)) for name, relu in make_builders().items()}
    for step in steps.values():
        jax.block_until_ready(step(params, x, y))
    waited = {name: (lambda s=s: jax.block_until_ready(s(params, x, y))) for name, s in steps.items()}

    def back_to_back(step):
        def run():
            for _ in range(number - 1):
                step(params, x, y)
            jax.block_until_ready(step(params, x, y))

        return run

    result = {f"{name} waited": t for name, t in interleaved(waited, repeats, number).items()}
    batched = interleaved({name: back_to_back(s) for name, s in steps.items()}, repeats, 1)
    result.update({f"{name} back to back": t / number for name, t in batched.items()})
    return result


def us(seconds):
    return f"{seconds * 1e6:,.1f} us"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and batch sizes")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["1", "1b", "2", "2b", "2c", "3", "4"],
        help="run these sections alone (default: all)",
    )
    args = parser.parse_args()
    repeats = 5 if args.quick else 15
    sections = set(args.only or ["1", "1b", "2", "2b", "2c", "3", "4"])
    batches = [64, 1024] if args.quick else [64, 256, 1024, 4096, 8192]
    results: dict = {
        "machine": f"{platform.processor() or platform.machine()}, {len(jax.devices())} "
        f"{jax.devices()[0].device_kind} device(s), jax {jax.__version__}"
    }
    print(f"# jaxfn benchmark\n\n{results['machine']}\n")

    if "1" in sections:
        print(
            "## 1. Compiled training step (the tutorial's net, a fori_loop of 100 steps; 20 above batch 1024), "
            "per step\n"
        )
        print(
            "| batch | jaxfn | jaxfn forward_mode | custom_vjp | plain autodiff | jaxfn / custom_vjp (wall, CPU) "
            "| forward_mode / custom_vjp (wall, CPU) | HLO instructions (jaxfn / fwd-mode / custom_vjp / plain) "
            "| same optimized program as custom_vjp (jaxfn / fwd-mode / plain) |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        results["compiled_step"] = {}
        for batch in batches:
            t, hlo, same = compiled_step(batch, repeats)
            results["compiled_step"][batch] = {"seconds": t, "hlo": hlo, "same_program": same}
            (jw, jc), (fw, fc), (vw, vc) = t["jaxfn"], t["jaxfn forward_mode"], t["custom_vjp"]
            yes = {True: "yes", False: "no"}
            print(
                f"| {batch} | {us(jw)} | {us(fw)} | {us(vw)} | {us(t['plain autodiff'][0])} | "
                f"{jw / vw:.3f}, {jc / vc:.3f} | {fw / vw:.3f}, {fc / vc:.3f} | {hlo['jaxfn']} / "
                f"{hlo['jaxfn forward_mode']} / {hlo['custom_vjp']} / {hlo['plain autodiff']} | "
                f"{yes[same['jaxfn']]} / {yes[same['jaxfn forward_mode']]} / {yes[same['plain autodiff']]} |",
                flush=True,
            )

    if "1b" in sections:
        print("\n## 1b. Dispatch: one jitted training step called from Python, per call, every builder\n")
        names = list(make_builders())
        print("| batch | how | custom_vjp | " + " | ".join(f"{n} / custom_vjp" for n in names[1:]) + " |")
        print("|---|---|" + "---|" * len(names))
        results["dispatch"] = {}
        for batch in (64,) if args.quick else (64, 1024):
            t = dispatch(batch, repeats)
            results["dispatch"][batch] = t
            for how in ("waited", "back to back"):
                r = [t[f"{n} {how}"] for n in names]
                print(
                    f"| {batch} | {how} | {us(r[0])} | " + " | ".join(f"{v / r[0]:.2f}" for v in r[1:]) + " |",
                    flush=True,
                )

    if "2" in sections:
        print("\n## 2. Trace + compile of one training step (fresh functions each repeat)\n")
        t = trace_and_compile(max(3, repeats // 2))
        results["trace_compile"] = t
        print("| jaxfn | custom_vjp | ratio |\n|---|---|---|")
        print(f"| {t['jaxfn'] * 1e3:.1f} ms | {t['custom_vjp'] * 1e3:.1f} ms | {t['jaxfn'] / t['custom_vjp']:.2f} |")

    for section, bare, sizes in (("2b", False, (10, 100, 500)), ("2c", True, (100, 500, 2000))):
        if section not in sections:
            continue
        what = "bare chained calls (x = relu(x))" if bare else "chained calls"
        print(f"\n## {section}. Tracing jax.grad of N {what} (jax.make_jaxpr; fresh functions each repeat)\n")
        print(
            "| N | jaxfn (wall) | custom_vjp (wall) | ratio (wall) | jaxfn (CPU) | custom_vjp (CPU) | ratio (CPU) "
            "| jaxfn extra per call (CPU) | custom_vjp with jaxfn's features / custom_vjp (wall, CPU) |"
            "\n|---|---|---|---|---|---|---|---|---|"
        )
        results["bare_chained_trace" if bare else "chained_trace"] = found = {}
        for n in sizes[:2] if args.quick else sizes:
            t = chained_trace(n, max(3, repeats // 2) if n >= 1000 else repeats, bare)
            found[n] = t
            (jw, jc), (vw, vc), (fw, fc) = t["jaxfn"], t["custom_vjp"], t["custom_vjp with jaxfn's features"]
            print(
                f"| {n} | {jw * 1e3:.1f} ms | {vw * 1e3:.1f} ms | {jw / vw:.2f} | {jc * 1e3:.1f} ms "
                f"| {vc * 1e3:.1f} ms | {jc / vc:.2f} | {(jc - vc) / n * 1e6:.0f} us | {fw / vw:.2f}, {fc / vc:.2f} |",
                flush=True,
            )

    if "3" in sections:
        print("\n## 3. One eager (un-jitted) call of my_relu: op by op against custom_vjp, jit=True against jax.jit\n")
        print(
            "| batch | how | jaxfn | custom_vjp | jaxfn / custom_vjp | jaxfn jit=True | jit plain "
            "| jit=True / jit plain |\n|---|---|---|---|---|---|---|---|"
        )
        results["eager_call"] = {}
        for batch in batches:
            t = eager_call(batch, repeats)
            results["eager_call"][batch] = t
            for how in ("waited", "back to back"):
                r = {k.removesuffix(f" {how}"): v for k, v in t.items() if k.endswith(f" {how}")}
                print(
                    f"| {batch} | {how} | {us(r['jaxfn'])} | {us(r['custom_vjp'])} | "
                    f"{r['jaxfn'] / r['custom_vjp']:.2f} | "
                    f"{us(r['jaxfn jit=True'])} | {us(r['jit plain'])} | {r['jaxfn jit=True'] / r['jit plain']:.2f} |",
                    flush=True,
                )

    if "4" in sections:
        print("\n## 4. The tutorial's training loop: PyTorch eager vs jaxfn compiled, per step (batch 64)\n")
        torch_row = torch_vs_jaxfn(repeats)
        if torch_row is None:
            print("PyTorch is not installed: `pip install torch` to add this row.")
        elif torch_row == "skip":
            print(
                f"Not measured: JAX runs on {jax.default_backend()} and this torch can't, and a row comparing "
                "different devices would mean nothing."
            )
        else:
            t, version, device = torch_row
            results["torch"] = {"seconds": t, "torch": version, "device": device}
            (tn, tt), (jn, jt) = t.items()
            jax_device = jax.devices()[0].device_kind
            print(f"| {tn} (torch {version}, {device}) | {jn} ({jax_device}) | speed-up |\n|---|---|---|")
            print(f"| {us(tt)} | {us(jt)} | {tt / jt:.2f}x |")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
