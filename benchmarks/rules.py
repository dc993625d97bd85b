"""jvp and vmap rules, side by side: forward mode from a user's jvp against forward_mode=True and a
hand-written JAX hijax primitive; a host function under vmap with and without a vmap rule.

    python benchmarks/rules.py              # the markdown tables
    python benchmarks/rules.py --quick

Every row is measured in one process, the contenders interleaved (medians over repeats), with
wall time and process CPU time apiece; ratios are against the row's baseline.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import hijax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench import hlo_count  # noqa: E402
from bench import interleaved_wall_and_cpu as interleaved  # noqa: E402
from seeds import D_IN, D_OUT, LR, H, _my_relu_backward, _my_relu_forward, plain_relu  # noqa: E402

import jaxfn  # noqa: E402

HIJAX = getattr(hijax, "HiPrim", None) or hijax.VJPHiPrimitive  # the class moved in jax 0.12


# -- row 1: forward mode ----------------------------------------------------------------------
def _relu_jvp(ctx, t):
    return jnp.where(ctx.saved_variables.input < 0, 0, t)


def _saving_forward(ctx, input):
    ctx.save_for_forward(input=input)
    return _my_relu_forward(ctx, input)


class _HandWrittenRelu(HIJAX):
    """The tutorial's ReLU as a hand-written hijax primitive: every rule by hand."""

    def __init__(self, aval):
        self.in_avals, self.out_aval, self.params = (aval,), aval, {}
        super().__init__()

    def expand(self, x):
        return jnp.clip(x, min=0)

    def vjp_fwd(self, nzs, x):
        return jnp.clip(x, min=0), x

    def vjp_bwd_retval(self, x, g):
        return (jnp.where(x < 0, 0, g),)

    def jvp(self, primals, tangents):
        (x,), (t,) = primals, tangents
        return jnp.clip(x, min=0), jnp.where(x < 0, 0, t)


def hand_written_relu(x):
    return _HandWrittenRelu(jax.typeof(x))(x)


RELUS = {
    "jaxfn jvp=": lambda: jaxfn.autograd_function(_saving_forward, _my_relu_backward, jvp=_relu_jvp, name="relu"),
    "jaxfn forward_mode=True": lambda: jaxfn.autograd_function(
        _my_relu_forward, _my_relu_backward, forward_mode=True, name="relu"
    ),
    "hand-written hijax": lambda: hand_written_relu,
    "plain autodiff": lambda: plain_relu,
}


def forward_mode_loop(relu, steps):
    """The tutorial's net trained by forward gradients: each step a jvp along a random direction."""

    def loss(params, x, y):
        w1, w2 = params
        return ((relu(x @ w1) @ w2 - y) ** 2).sum()

    def step(i, carry):
        params, key = carry
        key, k1, k2 = jax.random.split(key, 3)
        v = (jax.random.normal(k1, params[0].shape), jax.random.normal(k2, params[1].shape))
        _, slope = jax.jvp(lambda p: loss(p, x, y), (params,), (v,))
        return jax.tree_util.tree_map(lambda p, d: p - LR * slope * d, params, v), key

    x, y = None, None

    def run(params, xs, ys):
        nonlocal x, y
        x, y = xs, ys
        return lax.fori_loop(0, steps, step, (params, jax.random.key(1)))[0]

    return jax.jit(run)


def forward_mode_row(batch, repeats, steps):
    kx, ky, k1, k2 = jax.random.split(jax.random.key(0), 4)
    x, y = jax.random.normal(kx, (batch, D_IN)), jax.random.normal(ky, (batch, D_OUT))
    params = (jax.random.normal(k1, (D_IN, H)), jax.random.normal(k2, (H, D_OUT)))
    compiled = {name: forward_mode_loop(make(), steps).lower(params, x, y).compile() for name, make in RELUS.items()}
    outs = {name: c(params, x, y) for name, c in compiled.items()}
    for name, out in outs.items():  # the same training, whoever computes the tangents
        for a, b in zip(out, outs["plain autodiff"]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)
    fns = {name: (lambda c=c: jax.block_until_ready(c(params, x, y))) for name, c in compiled.items()}
    t = interleaved(fns, repeats)
    return {name: (w / steps, c / steps) for name, (w, c) in t.items()}, {n: hlo_count(c) for n, c in compiled.items()}


# -- row 2: a host function under vmap ----------------------------------------------------------
def _sort_forward(ctx, x):
    ind = np.argsort(x, axis=-1)
    ctx.save_for_backward(ind_inv=np.argsort(ind, axis=-1))
    return np.take_along_axis(x, ind, axis=-1)


def _sort_backward(ctx, g):
    return np.take_along_axis(g, ctx.saved_variables.ind_inv, axis=-1)


def make_sorts():
    plain = jaxfn.autograd_function(_sort_forward, _sort_backward, host=True, name="sort")

    def vmap(info, in_dims, x):
        return with_rule(jnp.moveaxis(x, in_dims[0], 0)), 0  # the whole batch in one host call

    with_rule = jaxfn.autograd_function(_sort_forward, _sort_backward, host=True, vmap=vmap, name="sort")
    return {"host, no vmap rule": plain, "host, vmap rule": with_rule}


def host_vmap_row(batch, repeats, n=256):
    xs = jax.random.normal(jax.random.key(0), (batch, n))
    calls = {name: jax.jit(jax.vmap(f)) for name, f in make_sorts().items()}
    for f in calls.values():
        np.testing.assert_array_equal(f(xs), np.sort(np.asarray(xs), axis=-1))
    fns = {name: (lambda f=f: jax.block_until_ready(f(xs))) for name, f in calls.items()}
    return interleaved(fns, repeats)


def us(seconds):
    return f"{seconds * 1e6:,.1f} us"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and sizes")
    args = parser.parse_args()
    repeats = 5 if args.quick else 15
    print(
        f"# jaxfn rules benchmark\n\n{platform.processor() or platform.machine()}, {len(jax.devices())} "
        f"{jax.devices()[0].device_kind} device(s), jax {jax.__version__}, jaxfn {jaxfn.__version__}\n"
    )
    steps = 20
    print(f"## 1. Forward-mode training step (the tutorial's net, a jvp per step, fori_loop of {steps}), per step\n")
    names = list(RELUS)
    print(
        "| batch | " + " | ".join(names) + " | jvp= / hand-written (wall, CPU) | forward_mode / hand-written (wall) "
        "| HLO instructions (" + " / ".join(names) + ") |"
    )
    print("|---|" + "---|" * (len(names) + 3))
    for batch in [64, 1024] if args.quick else [64, 256, 1024, 4096]:
        t, hlo = forward_mode_row(batch, repeats, steps)
        hand = t["hand-written hijax"]
        print(
            f"| {batch} | "
            + " | ".join(us(t[n][0]) for n in names)
            + f" | {t['jaxfn jvp='][0] / hand[0]:.3f}, {t['jaxfn jvp='][1] / hand[1]:.3f} "
            + f"| {t['jaxfn forward_mode=True'][0] / hand[0]:.3f} | "
            + " / ".join(str(hlo[n]) for n in names)
            + " |",
            flush=True,
        )
    print("\n## 2. A host=True sort (rows of 256) under jax.jit(jax.vmap(...)), per call\n")
    print("| batch | no vmap rule (one callback per row) | vmap rule (one callback per batch) | speed-up (wall, CPU) |")
    print("|---|---|---|---|")
    for batch in [16, 256] if args.quick else [16, 256, 1024, 4096]:
        t = host_vmap_row(batch, repeats)
        (pw, pc), (rw, rc) = t["host, no vmap rule"], t["host, vmap rule"]
        print(f"| {batch} | {us(pw)} | {us(rw)} | {pw / rw:.1f}x, {pc / rc:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
