"""examples/two_layer_net.py, run as a user runs it (subprocesses, 1, 4 and 8 CPU devices).

Several processes: tests/test_multiprocess.py.
"""

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from jaxfn import _saves

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "two_layer_net.py"


CACHE = None  # set by the compilation_cache fixture


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    """One JAX compilation cache for this module's runs: the random data compile once, not per run."""
    global CACHE
    CACHE = str(tmp_path_factory.mktemp("jax-cache"))


def run(*args, devices=1, timeout=300):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": CACHE}
    env["MPLCONFIGDIR"] = os.path.join(CACHE, "matplotlib")  # matplotlib's cache stays out of the home folder
    env.pop("JAX_ENABLE_X64", None)
    for name in [k for k in env if k.startswith(("SLURM_", "OMPI_", "TPU_", "MEGASCALE_", "KUBERNETES_"))]:
        del env[name]  # one process: the outer environment must not make the script join a multi-process run
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def losses(stdout):
    return {int(s): float(v) for s, v in re.findall(r"^Step: (\d+) : (\S+)$", stdout, re.M)}


@pytest.mark.slow
def test_few_steps_on_1_and_8_devices_give_the_same_falling_loss():
    one = run("--steps", "30", "--print-every", "10")
    eight = run("--steps", "30", "--print-every", "10", devices=8)
    assert one.returncode == 0, one.stderr
    assert eight.returncode == 0, eight.stderr
    a, b = losses(one.stdout), losses(eight.stdout)
    assert list(a) == [1, 10, 20, 30] == list(b)
    assert a[30] < a[1] / 100
    assert b[1] == pytest.approx(a[1], rel=1e-5)
    assert b[30] == pytest.approx(a[30], rel=1e-2)
    assert "on 1 cpu device(s)" in one.stdout and "on 8 cpu device(s) (data parallel" in eight.stdout
    assert re.search(r"compile [\d.]+ s \(start-up [\d.]+ s in all\), [\d,]+ steps/s, final loss", one.stdout)
    for result in (one, eight):
        assert result.stdout.splitlines()[0] == "Matmul precision: highest (full float32)"
        assert "Processes:" not in result.stdout  # no cluster here: one process


@pytest.mark.slow
def test_default_run_falls_more_than_8_orders_of_magnitude():
    result = run()
    assert result.returncode == 0, result.stderr
    got = losses(result.stdout)
    assert list(got) == [1, 100, 200, 300, 400, 500]
    assert got[1] > 1e6
    assert got[500] < got[1] * 1e-8
    assert result.stdout.count("Done: 500 steps") == 1


@pytest.mark.slow
def test_shard_map_step_gives_the_losses_of_the_jit_step():
    jit = run("--steps", "20", "--print-every", "1", devices=4)
    shard_map = run("--steps", "20", "--print-every", "1", "--spmd", "shard_map", devices=4)
    assert jit.returncode == 0, jit.stderr
    assert shard_map.returncode == 0, shard_map.stderr
    a, b = losses(jit.stdout), losses(shard_map.stdout)
    assert list(a) == list(range(1, 21)) == list(b)
    assert a[20] < a[1] / 50
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5), step
    assert "on 4 cpu device(s) (data parallel, batch sharded, shard_map per device)" in shard_map.stdout
    assert "on 4 cpu device(s) (data parallel, batch sharded, sharded jit)" in jit.stdout


@pytest.mark.slow
def test_precision_default_is_accepted_and_said():
    result = run("--steps", "2", "--precision", "default")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "Matmul precision: default (the backend's choice; TF32 on NVIDIA GPUs)"
    assert result.stdout.splitlines()[1] == "Compiling the training loop (2 steps, batch 64) ..."
    assert "Done: 2 steps" in result.stdout
    compile_s, startup_s = map(
        float, re.search(r"compile ([\d.]+) s \(start-up ([\d.]+) s in all\)", result.stdout).groups()
    )
    assert 0 < compile_s <= startup_s


@pytest.fixture(scope="module")
def example():
    """The script as a module, in this process."""
    spec = importlib.util.spec_from_file_location("two_layer_net", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("spmd", ["jit", "shard_map"])
@pytest.mark.parametrize("precision, operand_precision", [("highest", 5), ("default", 0)])
def test_precision_reaches_every_matmul_of_the_compiled_step(example, spmd, precision, operand_precision):
    args = example.parse_args(["--batch", "8", "--d-in", "6", "--hidden", "5", "--d-out", "3"])
    args.precision, args.spmd = precision, spmd
    mesh = example.data_parallel_mesh(args.batch)
    hlo = example.compile_training(args, mesh, example.init(args, mesh), chunk=4).as_text()
    dots = re.findall(r"= \S+ dot\(.*", hlo)
    assert len(dots) == 5  # x @ w1, h @ w2; backward: the gradients of w2, h and w1 (not of x)
    assert sum("operand_precision={highest,highest}" in d for d in dots) == operand_precision
    assert jax.config.jax_default_matmul_precision is None  # the option does not leak


@pytest.mark.slow
def test_a_loss_that_stops_being_finite_stops_the_run():
    result = run("--steps", "30", "--print-every", "10", "--lr", "1")
    assert result.returncode == 1
    assert "Done:" not in result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert re.fullmatch(
        r"two_layer_net.py: error: the loss became (inf|nan) at step \d+: the training diverged with learning rate 1 "
        r"and batch 64; use a smaller --lr \(the loss is summed over the batch, so a larger batch needs a "
        r"proportionally smaller learning rate\), or run again with --detect-anomaly to see where it began",
        line,
    )
    step = int(re.search(r"at step (\d+)", line)[1])
    assert 1 < step <= 10 and list(losses(result.stdout)) == [1]


@pytest.mark.slow
def test_detect_anomaly_names_the_function_where_the_divergence_began():
    result = run("--steps", "30", "--print-every", "10", "--lr", "1", "--detect-anomaly")
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert re.fullmatch(
        r"two_layer_net.py: error: jaxfn: 'my_relu': (backward returned a non-finite gradient for 'input'|forward "
        r"returned a non-finite value in its output|grad_output was already) \(?(inf|-inf|nan) \(?at index "
        r"\(\d+, \d+\)\)?.*",
        line,
    )


@pytest.mark.skipif(not _saves.available(), reason="no save names on jax 0.10 with jax_remat3 on")
def test_report_saves_lists_what_one_step_keeps():
    result = run("--report-saves")
    assert result.returncode == 0, result.stderr
    assert "| my_relu | input | (64, 100) | float32 | 25,600 | input |" in result.stdout
    assert "jaxfn_tie" not in result.stdout and "_tie.py" not in result.stdout  # jaxfn's own, not a row of yours
    assert "JAX also keeps 25,600 bytes inside jaxfn itself" in result.stdout
    assert "Step:" not in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "-3"], "argument --steps: must be a positive integer, got -3"),
        (["--hidden", "0"], "argument --hidden: must be a positive integer, got 0"),
        (["--lr", "-1"], "argument --lr: must be a positive number, got -1"),
        (["--coordinator", "10.0.0.1"], "argument --coordinator: must be HOST:PORT, got '10.0.0.1'"),
        (
            ["--coordinator", "127.0.0.1:1234", "--num-processes", "2"],
            "--coordinator, --num-processes and --process-id go together: give all three or none",
        ),
        (
            ["--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "2"],
            "--process-id 2 must be below --num-processes 2",
        ),
        (
            ["--local-processes", "2", "--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "0"],
            "--local-processes starts its own processes: leave out --coordinator",
        ),
        (["--timeout", "0"], "argument --timeout: must be a positive integer, got 0"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"two_layer_net.py: error: {message}"]


@pytest.mark.slow
def test_batch_that_does_not_split_across_devices():
    result = run("--batch", "63", "--steps", "2", devices=8)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "two_layer_net.py: error: --batch 63 does not split evenly across 8 devices; use a multiple of 8"
    ]


@pytest.mark.slow
def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "loss.png"
    result = run("--steps", "20", "--print-every", "10", "--plot", str(path))
    assert result.returncode == 0, result.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# The script with JAX made unimportable: what it answers before importing JAX, it answers at once.
WITHOUT_JAX = "import sys, runpy; sys.modules['jax'] = None; sys.argv = [sys.argv[1], *sys.argv[2:]]; " + (
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def run_without_jax(*args):
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_JAX, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (("--steps", "abc"), r"argument --steps: must be a positive whole number, like 500, but got 'abc'"),
        (("--lr", "fast"), r"argument --lr: must be a positive number, like 1e-6, but got 'fast'"),
        (("--lr", "-1"), r"argument --lr: must be a positive number, got -1"),
        (("--process-id", "x"), r"argument --process-id: must be a whole number, 0 or more, like 1, but got 'x'"),
        (("--plot", "/nonexistent/loss.png"), r"argument --plot: the folder /nonexistent does not exist"),
    ],
)
def test_flag_errors_answer_before_jax_is_imported_in_users_words(args, message):
    result = run_without_jax(*args)
    assert result.returncode == 2
    assert re.fullmatch(r"two_layer_net.py: error: " + message + r".*\n", result.stderr)


def test_help_answers_before_jax_is_imported():
    result = run_without_jax("--help")
    assert result.returncode == 0, result.stderr
    assert "--steps" in result.stdout and "--report-saves" in result.stdout and "--detect-anomaly" in result.stdout


@pytest.mark.slow
def test_help():
    result = run("--help")
    assert result.returncode == 0
    flags = ["--steps", "--lr", "--batch", "--d-in", "--hidden", "--d-out", "--seed", "--print-every", "--plot"]
    flags += ["--spmd", "--precision", "--coordinator", "--num-processes", "--process-id", "--local-processes"]
    flags += ["--single-process", "--timeout"]
    for flag in flags:
        assert flag in result.stdout


class Exited:
    """A finished process as the launcher sees it (``Popen.poll`` gives its status)."""

    def __init__(self, returncode):
        self.returncode = returncode

    def poll(self):
        return self.returncode


@pytest.mark.parametrize(
    "codes, seen, cause",
    [
        ([-6, -9], [0, 1], 1),  # the peer's runtime aborted before the SIGKILLed one was collected
        ([-9, -6], [1, 0], 0),
        ([-11, 1], [1, 0], 0),  # a crash causes; an error exit after it is the peer noticing
        ([2, 2], [1, 0], 1),  # a bad flag fails everywhere alike: the first one seen
        ([-6, -6], [1, 0], 1),
        ([0, -15], [1], 1),
    ],
)
def test_launcher_names_the_process_that_stopped_the_run(example, codes, seen, cause):
    assert example.first_cause([Exited(c) for c in codes], seen) == cause


def test_launcher_notes_failures_in_the_order_they_are_seen(example):
    procs = [Exited(None), Exited(-6), Exited(0)]
    failed = example.note_failures(procs, [])
    assert failed == [1]
    procs[0].returncode = -9
    assert example.note_failures(procs, failed) == [1, 0]


def test_plot_without_matplotlib_is_refused_before_training(example, monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(
        argparse.ArgumentTypeError, match=r"needs matplotlib, which is not installed: pip install matplotlib$"
    ):
        example.png_path(str(tmp_path / "loss.png"))
    with pytest.raises(argparse.ArgumentTypeError, match=r"must end in \.png, but got '.*loss\.jpg'"):
        example.png_path(str(tmp_path / "loss.jpg"))
