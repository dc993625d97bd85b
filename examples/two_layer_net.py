"""R torch's two-layer-net tutorial with a custom ReLU, written with jaxfn.

The network, data and hyper-parameters are the tutorial's (N=64, D_in=1000, H=100, D_out=10,
learning rate 1e-6, 500 steps), and ``my_relu`` is written exactly as the tutorial writes it.
The training loop is compiled (``lax.fori_loop`` between prints), and when several devices are
visible the batch is sharded across all of them (data parallel, parameters replicated):

    python examples/two_layer_net.py                        # the tutorial
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/two_layer_net.py
    python examples/two_layer_net.py --steps 2000 --plot loss.png
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxfn


# In the forward pass we receive an array containing the input and return an array containing
# the output. ctx is a context object that can be used to stash information for the backward
# computation: you can save values for the backward pass with ctx.save_for_backward.
def my_relu_forward(ctx, input):
    ctx.save_for_backward(input=input)
    return jnp.clip(input, min=0)


# In the backward pass we receive the gradient of the loss with respect to the output, and we
# compute the gradient of the loss with respect to the input.
def my_relu_backward(ctx, grad_output):
    v = ctx.saved_variables
    grad_input = jnp.where(v.input < 0, 0, grad_output)
    return {"input": grad_input}


my_relu = jaxfn.autograd_function(forward=my_relu_forward, backward=my_relu_backward, name="my_relu")


def loss_fn(params, x, y):
    w1, w2 = params
    y_pred = my_relu(x @ w1) @ w2
    return ((y_pred - y) ** 2).sum()


def make_train(learning_rate: float, chunk: int):
    """A compiled function running up to ``chunk`` SGD steps, returning each step's loss."""

    def train(params, x, y, steps):
        def step(i, carry):
            params, losses = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            params = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
            return params, losses.at[i].set(loss)

        return lax.fori_loop(0, steps, step, (params, jnp.zeros(chunk, x.dtype)))

    return jax.jit(train, donate_argnums=0)


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, no usage block
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(prog="two_layer_net.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=positive_int, default=500, help="training steps (default 500)")
    parser.add_argument("--lr", type=positive_float, default=1e-6, help="learning rate (default 1e-6)")
    parser.add_argument("--batch", type=positive_int, default=64, help="batch size N (default 64)")
    parser.add_argument("--d-in", type=positive_int, default=1000, help="input size D_in (default 1000)")
    parser.add_argument("--hidden", type=positive_int, default=100, help="hidden size H (default 100)")
    parser.add_argument("--d-out", type=positive_int, default=10, help="output size D_out (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--print-every", type=positive_int, default=100, help="print interval (default 100)")
    parser.add_argument("--plot", metavar="PATH", help="save the loss curve (log scale) as a PNG")
    return parser.parse_args(argv)


def data_parallel_mesh(batch: int) -> Mesh:
    """A mesh over every visible device along a 'data' axis; the batch must split evenly."""
    devices = jax.devices()
    if batch % len(devices):
        raise ValueError(
            f"--batch {batch} does not split evenly across {len(devices)} devices; use a multiple of {len(devices)}"
        )
    return Mesh(np.array(devices), ("data",))


def init(args: argparse.Namespace, mesh: Mesh):
    kx, ky, k1, k2 = jax.random.split(jax.random.key(args.seed), 4)
    batch, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    x = jax.device_put(jax.random.normal(kx, (args.batch, args.d_in)), batch)
    y = jax.device_put(jax.random.normal(ky, (args.batch, args.d_out)), batch)
    w1 = jax.random.normal(k1, (args.d_in, args.hidden))
    w2 = jax.random.normal(k2, (args.hidden, args.d_out))
    return jax.device_put((w1, w2), replicated), x, y


def print_steps(steps: int, every: int) -> list[int]:
    """Step 1, every ``every``-th step, and the last step, as the tutorial prints them."""
    return sorted({1, steps} | set(range(every, steps + 1, every)))


def train(args: argparse.Namespace) -> dict:
    mesh = data_parallel_mesh(args.batch)
    params, x, y = init(args, mesh)
    marks = print_steps(args.steps, args.print_every)
    chunk = max(b - a for a, b in zip([0, *marks], marks))
    run = make_train(args.lr, chunk)
    losses: list[float] = []
    start = time.perf_counter()
    compiled = run.lower(params, x, y, 1).compile()
    compile_s = time.perf_counter() - start
    start = done = time.perf_counter()
    for previous, mark in zip([0, *marks], marks):
        params, chunk_losses = compiled(params, x, y, mark - previous)
        chunk_losses = np.asarray(chunk_losses[: mark - previous])
        losses.extend(chunk_losses.tolist())
        print(f"Step: {mark} : {chunk_losses[-1]:.7g}", flush=True)
    done = time.perf_counter()
    return dict(losses=losses, compile_s=compile_s, run_s=done - start, devices=jax.devices())


def plot(path: str, losses: list[float]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("two_layer_net.py: error: --plot needs matplotlib: pip install 'jaxfn[examples]'") from None
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy(np.arange(1, len(losses) + 1), losses)
    ax.set(xlabel="step", ylabel="loss (sum of squares)", title="two-layer net with jaxfn's my_relu")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"Saved the loss curve to {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = train(args)
    except ValueError as err:
        sys.stderr.write(f"two_layer_net.py: error: {err}\n")
        return 2
    devices = result["devices"]
    steps_per_s = args.steps / result["run_s"]
    print(
        f"Done: {args.steps} steps on {len(devices)} {devices[0].device_kind} device(s) "
        f"({'data parallel, batch sharded' if len(devices) > 1 else 'one device'}); "
        f"compile {result['compile_s']:.2f} s, {steps_per_s:,.0f} steps/s, final loss {result['losses'][-1]:.4g}"
    )
    if args.plot:
        plot(args.plot, result["losses"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
