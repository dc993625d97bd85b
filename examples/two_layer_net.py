"""R torch's two-layer-net tutorial with a custom ReLU, written with jaxfn.

The network, data and hyper-parameters are the tutorial's (N=64, D_in=1000, H=100, D_out=10,
learning rate 1e-6, 500 steps), and ``my_relu`` is written exactly as the tutorial writes it.
The training loop is compiled (``lax.fori_loop`` between prints), and when several devices are
visible the batch is sharded across all of them (data parallel, parameters replicated), in one
process or in several (JAX's multi-controller runtime, one shard of the batch per process):

    python examples/two_layer_net.py                        # the tutorial
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/two_layer_net.py
    python examples/two_layer_net.py --steps 2000 --plot loss.png
    python examples/two_layer_net.py --spmd shard_map       # the step written per device
    python examples/two_layer_net.py --report-saves         # what backward keeps, per jaxfn save
    python examples/two_layer_net.py --lr 1 --detect-anomaly   # which function first made a NaN/Inf
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python examples/two_layer_net.py --local-processes 2
    python examples/two_layer_net.py --coordinator HOST:PORT --num-processes N --process-id I
    srun python examples/two_layer_net.py                   # SLURM, Open MPI, cloud TPU: detected

Matmuls run in full float32 (``--precision highest``) unless ``--precision default`` hands the
choice to the backend (TF32 on NVIDIA GPUs, too coarse for this learning rate). A loss that
stops being finite ends the run with an error and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
import time

STARTED = time.perf_counter()  # what the user waits for counts from here
PROG = "two_layer_net.py"


# The command line: parsed before JAX is imported, so --help and a bad flag answer at once -----------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, like 500, but got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, like 1, but got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, like 1e-6, but got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def png_path(text: str) -> str:
    """--plot's path, checked before anything trains: a .png name in a folder that exists and can be
    written, and matplotlib installed."""
    import importlib.util

    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"writes a PNG image, so the name must end in .png, but got {text!r}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"the folder {folder} does not exist, so {text!r} can't be written")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"the folder {folder} can't be written to, so {text!r} can't be saved")
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError("needs matplotlib, which is not installed: pip install matplotlib")
    return text


def host_port(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise argparse.ArgumentTypeError(f"must be HOST:PORT, got {text!r}")
    return text


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, no usage block
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=positive_int, default=500, help="training steps (default 500)")
    parser.add_argument("--lr", type=positive_float, default=1e-6, help="learning rate (default 1e-6)")
    parser.add_argument("--batch", type=positive_int, default=64, help="global batch size N (default 64)")
    parser.add_argument("--d-in", type=positive_int, default=1000, help="input size D_in (default 1000)")
    parser.add_argument("--hidden", type=positive_int, default=100, help="hidden size H (default 100)")
    parser.add_argument("--d-out", type=positive_int, default=10, help="output size D_out (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--print-every", type=positive_int, default=100, help="print interval (default 100)")
    parser.add_argument("--plot", metavar="PATH", type=png_path, help="save the loss curve (log scale) as a PNG")
    parser.add_argument(
        "--report-saves",
        action="store_true",
        help="print what one training step keeps for its backward (jaxfn.saved), then stop",
    )
    parser.add_argument(
        "--detect-anomaly",
        action="store_true",
        help="check every jaxfn function for NaN/Inf and name the first that makes one (jaxfn.detect_anomaly)",
    )
    parser.add_argument(
        "--spmd",
        choices=("jit", "shard_map"),
        default="jit",
        help="jit: the step written for the whole batch, partitioned by jit (default); "
        "shard_map: the step written per device with jax.shard_map (check_vma on)",
    )
    parser.add_argument(
        "--precision",
        choices=("highest", "default"),
        default="highest",
        help="float32 matmul precision: highest = full float32 (default); "
        "default = the backend's choice (TF32 on NVIDIA GPUs: faster, but too coarse for this learning rate)",
    )
    group = parser.add_argument_group("several processes (jax.distributed)")
    group.add_argument("--coordinator", type=host_port, metavar="HOST:PORT", help="process 0's address")
    group.add_argument("--num-processes", type=positive_int, metavar="N", help="number of processes")
    group.add_argument("--process-id", type=non_negative_int, metavar="I", help="this process's index, 0 to N-1")
    group.add_argument(
        "--local-processes",
        type=positive_int,
        metavar="N",
        help="start N copies of this script on this machine (CPU backend, coordinator on 127.0.0.1) and wait",
    )
    group.add_argument(
        "--single-process",
        action="store_true",
        help="ignore a cluster environment (SLURM, Open MPI, cloud TPU) and run as one process",
    )
    group.add_argument(
        "--timeout",
        type=positive_int,
        default=120,
        metavar="S",
        help="seconds to wait for the other processes to connect, and before a silent one is declared dead "
        "(default 120)",
    )
    args = parser.parse_args(argv)
    explicit = [args.coordinator, args.num_processes, args.process_id]
    if any(v is not None for v in explicit) and None in explicit:
        parser.error("--coordinator, --num-processes and --process-id go together: give all three or none")
    if args.process_id is not None and args.process_id >= args.num_processes:
        parser.error(f"--process-id {args.process_id} must be below --num-processes {args.num_processes}")
    if args.local_processes and args.coordinator:
        parser.error("--local-processes starts its own processes: leave out --coordinator")
    return args


if __name__ == "__main__":
    ARGS = parse_args(sys.argv[1:])  # exits here on --help or a bad flag, before the imports below

import jax  # noqa: E402 - after the command line on purpose (see above)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxfn  # noqa: E402


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


def make_step(learning_rate: float, spmd: str, mesh: Mesh):
    """One SGD step ``(params, x, y) -> (params, loss)``, as sharded jit or as a per-device shard_map."""

    def sgd(params, grads):
        return jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)

    def global_step(params, x, y):  # the whole batch; jit's partitioner splits it across devices
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return sgd(params, grads), loss

    def per_device_step(params, x, y):  # this device's rows; params are replicated (unvarying)
        # psum makes the loss replicated, so the gradient of the replicated params is summed
        # across devices by JAX's transpose of the implicit pvary (check_vma keeps this honest).
        loss, grads = jax.value_and_grad(lambda p: lax.psum(loss_fn(p, x, y), "data"))(params)
        return sgd(params, grads), loss

    if spmd == "jit":
        return global_step
    return jax.shard_map(
        per_device_step, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()), check_vma=True
    )


def make_train(step, chunk: int):
    """A compiled function running up to ``chunk`` steps, returning each step's loss."""

    def train(params, x, y, steps):
        def body(i, carry):
            params, losses = carry
            params, loss = step(params, x, y)
            return params, losses.at[i].set(loss)

        return lax.fori_loop(0, steps, body, (params, jnp.zeros(chunk, x.dtype)))

    return jax.jit(train, donate_argnums=0)


# Joining a multi-process run ------------------------------------------------------------------


def detected_cluster() -> str | None:
    """The cluster environment ``jax.distributed.initialize()`` would detect, or None.

    This asks JAX's own cluster classes (SLURM, Open MPI, cloud TPU, Kubernetes; mpi4py is
    opt-in there and so here), in JAX's order, with JAX's test (``is_env_present``), so the
    script joins a run exactly when JAX can fill in the coordinator, process count and id.
    These classes are not public API (``jax._src.clusters``): if they move, this returns None
    and the explicit flags still work.
    """
    try:
        from jax._src.clusters import ClusterEnv
    except ImportError:
        return None
    for env in ClusterEnv._cluster_types:
        if not env.opt_in_only_method and env.is_env_present():
            return env.__name__
    return None


def join_processes(args: argparse.Namespace) -> str | None:
    """Calls ``jax.distributed.initialize`` when asked to; returns how the process joined (or None)."""
    if args.coordinator:
        how = "--coordinator"
        kwargs = dict(
            coordinator_address=args.coordinator, num_processes=args.num_processes, process_id=args.process_id
        )
        if is_loopback(args.coordinator.rpartition(":")[0]):  # nobody else can reach it: listen on loopback only
            kwargs["coordinator_bind_address"] = args.coordinator
    elif args.single_process or (how := detected_cluster()) is None:
        return None
    else:
        kwargs = {}
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # cross-process collectives on CPU
    # JAX aborts the process (a C++ fatal error) when its own timeouts expire; a timer of ours
    # expires first while the processes gather, to say what went wrong and exit with status 1.
    watchdog = threading.Timer(args.timeout, gave_up_joining, (how, args))
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(
            **kwargs,
            initialization_timeout=args.timeout + 30,
            heartbeat_timeout_seconds=args.timeout,  # a peer silent this long is dead: all processes stop
            shutdown_timeout_seconds=args.timeout,
        )
    except Exception as err:
        raise RuntimeError(f"could not join the multi-process run ({how}): {first_line(err)}") from err
    finally:
        watchdog.cancel()
    return how


def gave_up_joining(how: str, args: argparse.Namespace) -> None:
    where = (
        f"process {args.process_id} of {args.num_processes}, coordinator {args.coordinator}"
        if args.coordinator
        else how
    )
    sys.stderr.write(
        f"{PROG}: error: the processes did not all join the run within --timeout {args.timeout} s ({where}); "
        "check that every process was started with the same coordinator and process count"
        + ("" if args.coordinator else ", or pass --single-process to ignore the cluster environment")
        + "\n"
    )
    sys.stderr.flush()
    os._exit(1)


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# Training ----------------------------------------------------------------------------------------


def data_parallel_mesh(batch: int) -> Mesh:
    """A mesh over every device of every process along 'data'; the batch must split evenly.

    Devices are ordered by process, so each process's devices hold one contiguous block of rows.
    """
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    if batch % len(devices):
        raise ValueError(
            f"--batch {batch} does not split evenly across {len(devices)} devices; use a multiple of {len(devices)}"
        )
    return Mesh(np.array(devices), ("data",))


def process_rows(sharding: NamedSharding, shape: tuple[int, ...]) -> slice:
    """The rows of a global array of ``shape`` that this process's devices hold: one block, as the
    mesh orders devices by process (all rows for a replicated array)."""
    rows = [index[0] for index in sharding.addressable_devices_indices_map(shape).values()]
    return slice(min(r.start or 0 for r in rows), max(shape[0] if r.stop is None else r.stop for r in rows))


def global_array(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """The global array ``value``, each process feeding only the rows its devices hold."""
    return jax.make_array_from_process_local_data(sharding, value[process_rows(sharding, value.shape)], value.shape)


def random_data(seed, n, d_in, hidden, d_out):
    kx, ky, k1, k2 = jax.random.split(jax.random.key(seed), 4)
    x, y = jax.random.normal(kx, (n, d_in)), jax.random.normal(ky, (n, d_out))
    return x, y, jax.random.normal(k1, (d_in, hidden)), jax.random.normal(k2, (hidden, d_out))


def init(args: argparse.Namespace, mesh: Mesh):
    """The tutorial's random data and weights; each process feeds its rows of the batch.

    Every process draws the whole (small) batch from the seed and keeps its rows, so the numbers
    do not depend on the number of processes; a real input pipeline would read only those rows.
    """
    sizes = (args.batch, args.d_in, args.hidden, args.d_out)
    # One compiled program rather than one per shape: the same numbers, bit for bit, and a faster start.
    x, y, w1, w2 = map(np.asarray, jax.jit(random_data, static_argnums=(1, 2, 3, 4))(args.seed, *sizes))
    batch, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    params = (global_array(w1, replicated), global_array(w2, replicated))
    return params, global_array(x, batch), global_array(y, batch)


def print_steps(steps: int, every: int) -> list[int]:
    """Step 1, every ``every``-th step, and the last step, as the tutorial prints them."""
    return sorted({1, steps} | set(range(every, steps + 1, every)))


class NonFiniteLoss(Exception):
    pass


def check_finite(losses: np.ndarray, first_step: int, args: argparse.Namespace) -> None:
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
        step = first_step + int(bad[0])
        raise NonFiniteLoss(
            f"the loss became {losses[bad[0]]} at step {step}: the training diverged with learning rate "
            f"{args.lr:g} and batch {args.batch}; use a smaller --lr (the loss is summed over the batch, "
            f"so a larger batch needs a proportionally smaller learning rate)"
            + ("" if args.detect_anomaly else ", or run again with --detect-anomaly to see where it began")
        )


def compile_training(args: argparse.Namespace, mesh: Mesh, example: tuple, chunk: int):
    """The training function, compiled for ``example`` = (params, x, y) at ``--precision``."""
    run = make_train(make_step(args.lr, args.spmd, mesh), chunk)
    with jax.default_matmul_precision(args.precision):  # read when the matmuls are traced
        return run.lower(*example, 1).compile()


def report_saves(args: argparse.Namespace) -> None:
    """What one step's backward keeps (jaxfn.saved), for the tutorial net on one device."""
    params, x, y = init(args, data_parallel_mesh(args.batch))
    report = jaxfn.saved(loss_fn, params, x, y)
    # JAX describes some residuals by the line of code that made them; those made inside jaxfn's own
    # modules (its tie, which hands my_relu's output on) are no save of yours: counted, not listed.
    inside = os.path.dirname(jaxfn.__file__) + os.sep
    internal = [r for r in report if not r.function and inside in r.save]
    shown = type(report)(r for r in report if r not in internal)
    print(f"What the backward of one step keeps (batch {args.batch}, D_in {args.d_in}, H {args.hidden}):\n")
    print(shown)
    if internal:
        nbytes = sum(r.nbytes for r in internal)
        print(
            f"\nJAX also keeps {nbytes:,} bytes inside jaxfn itself (a jaxfn function's output, kept for the "
            f"operation that reads it), left out above: {report.nbytes:,} bytes in all"
        )


def train(args: argparse.Namespace, say) -> dict:
    with jaxfn.detect_anomaly() if args.detect_anomaly else contextlib.nullcontext():
        return _train(args, say)


def _train(args: argparse.Namespace, say) -> dict:
    mesh = data_parallel_mesh(args.batch)
    params, x, y = init(args, mesh)
    marks = print_steps(args.steps, args.print_every)
    chunk = max(b - a for a, b in zip([0, *marks], marks))
    losses: list[float] = []
    start = time.perf_counter()
    say(f"Compiling the training loop ({args.steps} steps, batch {args.batch}) ...", flush=True)
    compiled = compile_training(args, mesh, (params, x, y), chunk)
    compile_s = time.perf_counter() - start
    startup_s = time.perf_counter() - STARTED  # imports, devices, data and compiling: what the user waited
    start = time.perf_counter()
    for previous, mark in zip([0, *marks], marks):
        params, chunk_losses = compiled(params, x, y, mark - previous)
        chunk_losses = np.asarray(chunk_losses)[: mark - previous]  # replicated: every process has it
        check_finite(chunk_losses, previous + 1, args)
        losses.extend(chunk_losses.tolist())
        say(f"Step: {mark} : {chunk_losses[-1]:.7g}", flush=True)
    done = time.perf_counter()
    return dict(
        losses=losses,
        compile_s=compile_s,
        startup_s=startup_s,
        run_s=done - start,
        devices=mesh.devices.ravel().tolist(),
    )


def plot(path: str, losses: list[float]) -> None:
    import matplotlib  # --plot checked it is installed before training (png_path)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy(np.arange(1, len(losses) + 1), losses)
    ax.set(xlabel="step", ylabel="loss (sum of squares)", title="two-layer net with jaxfn's my_relu")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"Saved the loss curve to {path}")


def describe(args: argparse.Namespace, devices: list, processes: int) -> str:
    if len(devices) == 1:
        layout = "one device"
    else:
        layout = "data parallel, batch sharded" + (f" over {processes} processes" if processes > 1 else "")
        layout += ", " + ("sharded jit" if args.spmd == "jit" else "shard_map per device")
    return f"{len(devices)} {devices[0].device_kind} device(s) ({layout})"


def precision_line(args: argparse.Namespace) -> str:
    meaning = "full float32" if args.precision == "highest" else "the backend's choice; TF32 on NVIDIA GPUs"
    return f"Matmul precision: {args.precision} ({meaning})"


def main(argv: list[str] | None = None) -> int:
    if argv is None and "ARGS" in globals():  # run as a script: parsed already, before the imports
        argv, args = sys.argv[1:], ARGS
    else:
        argv = sys.argv[1:] if argv is None else argv
        args = parse_args(argv)
    if args.local_processes:
        return launch_local(args, argv)
    try:
        joined = join_processes(args)
    except RuntimeError as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return 1
    rank, processes = jax.process_index(), jax.process_count()
    say = print if rank == 0 else (lambda *a, **k: None)  # process 0 alone prints
    if joined:
        say(f"Processes: {processes} (joined via {joined}); {jax.local_device_count()} device(s) in process 0")
    if args.report_saves:
        if rank == 0:
            report_saves(args)
        return 0
    say(precision_line(args), flush=True)
    try:
        result = train(args, say)
    except (ValueError, NonFiniteLoss, jaxfn.AutogradFunctionError) as err:  # the same in every process
        if rank == 0:
            sys.stderr.write(
                f"{PROG}: error: {first_line(err) if isinstance(err, jaxfn.AutogradFunctionError) else err}\n"
            )
        return 2 if isinstance(err, ValueError) and not isinstance(err, jaxfn.AutogradFunctionError) else 1
    except jax.errors.JaxRuntimeError as err:
        hint = f" (process {rank} of {processes}: has another process stopped?)" if processes > 1 else ""
        sys.stderr.write(f"{PROG}: error: the computation failed{hint}: {first_line(err)}\n")
        return 1
    steps_per_s = args.steps / result["run_s"]
    say(
        f"Done: {args.steps} steps on {describe(args, result['devices'], processes)}; "
        f"compile {result['compile_s']:.2f} s (start-up {result['startup_s']:.2f} s in all), {steps_per_s:,.0f} "
        f"steps/s, final loss {result['losses'][-1]:.4g}"
    )
    if args.plot and rank == 0:
        plot(args.plot, result["losses"])
    return 0


# The local launcher ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def without_option(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option VALUE`` / ``option=VALUE``, also spelled as argparse's abbreviations."""
    out, skip = [], False
    for arg in argv:
        name, eq, _ = arg.partition("=")
        spelled = len(name) > 3 and option.startswith(name)  # --local-processes, --local, --lo
        if skip:
            skip = False
        elif spelled and not eq:
            skip = True
        elif not spelled:
            out.append(arg)
    return out


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def launch_local(args: argparse.Namespace, argv: list[str]) -> int:
    """Starts ``--local-processes`` copies of this script on 127.0.0.1 and waits; one failing stops all.

    Each copy bounds its own waits for the others (``--timeout``); this waits until all have
    exited with status 0 or one has failed, and then kills the rest, so none outlives it.
    """
    n, port = args.local_processes, free_port()
    base = [sys.executable, os.path.abspath(__file__), *without_option(argv, "--local-processes")]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs: list[subprocess.Popen] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the children
    try:
        for i in range(n):
            flags = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(n), "--process-id", str(i)]
            procs.append(subprocess.Popen([*base, *flags], env=env))
        failed: list[int] = []  # indices of failed processes, in the order the failures were seen
        while not note_failures(procs, failed):
            if all(p.returncode == 0 for p in procs):
                return 0
            time.sleep(0.02)
        wait_all(procs, failed, seconds=2.0)  # the others often fail the same way (a bad --batch): let them say so
        i = first_cause(procs, failed)
        code = procs[i].returncode
        after = [f"process {j} {describe_exit(procs[j].returncode)}" for j in failed if j != i]
        said = [f"process {i} of {n} {describe_exit(code)}"] + (["then " + ", ".join(after)] if after else [])
        if kill_all(procs):
            said.append("stopped the others")
        sys.stderr.write(f"{PROG}: error: {'; '.join(said)}\n")
        return code if code > 0 else 1
    except KeyboardInterrupt:
        return 130
    finally:
        kill_all(procs)


def note_failures(procs: list[subprocess.Popen], failed: list[int]) -> list[int]:
    """Appends to ``failed`` the processes that have newly failed; returns it."""
    failed += [i for i, p in enumerate(procs) if p.poll() not in (None, 0) and i not in failed]
    return failed


def first_cause(procs: list[subprocess.Popen], failed: list[int]) -> int:
    """The failed process that stopped the run, not one that stopped because a peer had gone.

    When a process dies, the others' JAX runtime aborts (SIGABRT) or exits with an error, often
    within milliseconds and sometimes before the launcher sees the first one go: the dead peer's
    sockets close before its exit can be collected. So a process killed by any other signal
    (SIGKILL, SIGSEGV, a SIGTERM from outside) is the cause; otherwise the first failure seen.
    """
    killed = [i for i in failed if procs[i].returncode < 0 and procs[i].returncode != -signal.SIGABRT]
    return (killed or failed)[0]


def wait_all(procs: list[subprocess.Popen], failed: list[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
        note_failures(procs, failed)
    note_failures(procs, failed)


def kill_all(procs: list[subprocess.Popen]) -> bool:
    """Kills the processes still running (SIGKILL: JAX catches SIGTERM); says whether there were any."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.kill()
    for p in running:
        p.wait(timeout=30)
    return bool(running)


if __name__ == "__main__":
    sys.exit(main())
