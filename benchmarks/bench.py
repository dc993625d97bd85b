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
import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax

import jaxfn

D_IN, H, D_OUT, LR = 1000, 100, 10, 1e-6


# -- the same ReLU three ways ------------------------------------------------------------------
def make_jaxfn_relu(forward_mode: bool = False):
    def forward(ctx, input):
        ctx.save_for_backward(input=input)
        return jnp.clip(input, min=0)

    def backward(ctx, grad_output):
        return {"input": jnp.where(ctx.saved_variables.input < 0, 0, grad_output)}

    return jaxfn.autograd_function(forward, backward, name="my_relu", forward_mode=forward_mode)


def make_custom_vjp_relu():
    @jax.custom_vjp
    def relu(x):
        return jnp.clip(x, min=0)

    relu.defvjp(lambda x: (jnp.clip(x, min=0), x), lambda x, g: (jnp.where(x < 0, 0, g),))
    return relu


def plain_relu(x):
    return jnp.clip(x, min=0)


CONTENDERS = {
    "jaxfn": make_jaxfn_relu,
    "jaxfn forward_mode": lambda: make_jaxfn_relu(True),
    "custom_vjp": make_custom_vjp_relu,
    "plain autodiff": lambda: plain_relu,
}


def make_step(relu):
    def loss(params, x, y):
        w1, w2 = params
        return ((relu(x @ w1) @ w2 - y) ** 2).sum()

    def step(params, x, y):
        grads = jax.grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)

    return step


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


def hlo_count(compiled) -> int:
    return sum(1 for line in compiled.as_text().splitlines() if " = " in line and not line.lstrip().startswith("//"))


# -- the rows ----------------------------------------------------------------------------------
def compiled_step(batch, repeats):
    steps = 100 if batch <= 1024 else 20  # keep each measurement near a second
    params, x, y = data(batch)
    loops = {name: make_loop(make(), steps) for name, make in CONTENDERS.items()}
    compiled = {name: loop.lower(params, x, y).compile() for name, loop in loops.items()}
    fns = {name: (lambda c=c: jax.block_until_ready(c(params, x, y))) for name, c in compiled.items()}
    for fn in fns.values():
        fn()
    per_step = {name: t / steps for name, t in interleaved(fns, repeats, 1).items()}
    return per_step, {name: hlo_count(c) for name, c in compiled.items()}


def trace_and_compile(repeats):
    params, x, y = data(64)

    def fresh(make):
        return lambda: jax.jit(make_step(make())).lower(params, x, y).compile()

    return interleaved({name: fresh(CONTENDERS[name]) for name in ("jaxfn", "custom_vjp")}, repeats, 1)


def eager_call(batch, repeats, number=200):
    x = jax.random.normal(jax.random.key(1), (batch, H))
    contenders = {
        "jaxfn": make_jaxfn_relu(),
        "jit plain": jax.jit(plain_relu),
        "custom_vjp": make_custom_vjp_relu(),
    }
    fns = {name: (lambda f=f: jax.block_until_ready(f(x))) for name, f in contenders.items()}
    for fn in fns.values():
        fn()
    return interleaved(fns, repeats, number)


def torch_vs_jaxfn(repeats, steps=100):
    try:
        import torch
    except ImportError:
        return None
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
    x, y = torch.randn(64, D_IN, generator=gen), torch.randn(64, D_OUT, generator=gen)
    w1 = torch.randn(D_IN, H, generator=gen, requires_grad=True)
    w2 = torch.randn(H, D_OUT, generator=gen, requires_grad=True)

    def torch_steps():
        for _ in range(steps):
            loss = (MyReLU.apply(x.mm(w1)).mm(w2) - y).pow(2).sum()
            loss.backward()
            with torch.no_grad():
                w1.sub_(LR * w1.grad)
                w2.sub_(LR * w2.grad)
                w1.grad.zero_()
                w2.grad.zero_()

    params, jx, jy = data(64)
    loop = make_loop(make_jaxfn_relu(), steps).lower(params, jx, jy).compile()
    fns = {
        "PyTorch autograd.Function (eager)": torch_steps,
        "jaxfn (compiled loop)": lambda: jax.block_until_ready(loop(params, jx, jy)),
    }
    for fn in fns.values():
        fn()
    return {name: t / steps for name, t in interleaved(fns, repeats, 1).items()}, torch.__version__


def us(seconds):
    return f"{seconds * 1e6:,.1f} us"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and batch sizes")
    args = parser.parse_args()
    repeats = 5 if args.quick else 15
    batches = [64, 1024] if args.quick else [64, 256, 1024, 4096, 8192]
    results: dict = {
        "machine": f"{platform.processor() or platform.machine()}, {len(jax.devices())} "
        f"{jax.devices()[0].device_kind} device(s), jax {jax.__version__}"
    }
    print(f"# jaxfn benchmark\n\n{results['machine']}\n")

    print("## 1. Compiled training step (the tutorial's net, a fori_loop of 100 steps; 20 above "
          "batch 1024), per step\n")
    print(
        "| batch | jaxfn | jaxfn forward_mode | custom_vjp | plain autodiff | jaxfn / custom_vjp "
        "| forward_mode / custom_vjp | HLO instructions (jaxfn / fwd-mode / custom_vjp / plain) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    results["compiled_step"] = {}
    for batch in batches:
        t, hlo = compiled_step(batch, repeats)
        results["compiled_step"][batch] = {"seconds": t, "hlo": hlo}
        print(
            f"| {batch} | {us(t['jaxfn'])} | {us(t['jaxfn forward_mode'])} | {us(t['custom_vjp'])} | "
            f"{us(t['plain autodiff'])} | {t['jaxfn'] / t['custom_vjp']:.3f} | "
            f"{t['jaxfn forward_mode'] / t['custom_vjp']:.3f} | {hlo['jaxfn']} / {hlo['jaxfn forward_mode']} / "
            f"{hlo['custom_vjp']} / {hlo['plain autodiff']} |",
            flush=True,
        )

    print("\n## 2. Trace + compile of one training step (fresh functions each repeat)\n")
    t = trace_and_compile(max(3, repeats // 2))
    results["trace_compile"] = t
    print("| jaxfn | custom_vjp | ratio |\n|---|---|---|")
    print(f"| {t['jaxfn'] * 1e3:.1f} ms | {t['custom_vjp'] * 1e3:.1f} ms | {t['jaxfn'] / t['custom_vjp']:.2f} |")

    print("\n## 3. One eager (un-jitted) call of my_relu\n")
    print(
        "| batch | jaxfn | jit plain | custom_vjp | jaxfn / jit plain | jaxfn / custom_vjp |\n|---|---|---|---|---|---|"
    )
    results["eager_call"] = {}
    for batch in batches:
        t = eager_call(batch, repeats)
        results["eager_call"][batch] = t
        print(
            f"| {batch} | {us(t['jaxfn'])} | {us(t['jit plain'])} | {us(t['custom_vjp'])} | "
            f"{t['jaxfn'] / t['jit plain']:.2f} | {t['jaxfn'] / t['custom_vjp']:.2f} |",
            flush=True,
        )

    print("\n## 4. The tutorial's training loop: PyTorch eager vs jaxfn compiled, per step (batch 64)\n")
    torch_row = torch_vs_jaxfn(repeats)
    if torch_row is None:
        print("PyTorch is not installed: `pip install torch` to add this row.")
    else:
        t, version = torch_row
        results["torch"] = {"seconds": t, "torch": version}
        (tn, tt), (jn, jt) = t.items()
        print(f"| {tn} (torch {version}) | {jn} | speed-up |\n|---|---|---|")
        print(f"| {us(tt)} | {us(jt)} | {tt / jt:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
