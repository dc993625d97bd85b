"""examples/two_layer_net.py, run as a user runs it (subprocesses, 1 and 8 CPU devices)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "two_layer_net.py"


def run(*args, devices=1, timeout=300):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_ENABLE_X64", None)
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def losses(stdout):
    return {int(s): float(v) for s, v in re.findall(r"^Step: (\d+) : (\S+)$", stdout, re.M)}


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
    assert re.search(r"compile [\d.]+ s, [\d,]+ steps/s, final loss", one.stdout)


def test_default_run_falls_more_than_8_orders_of_magnitude():
    result = run()
    assert result.returncode == 0, result.stderr
    got = losses(result.stdout)
    assert list(got) == [1, 100, 200, 300, 400, 500]
    assert got[1] > 1e6
    assert got[500] < got[1] * 1e-8


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "-3"], "argument --steps: must be a positive integer, got -3"),
        (["--hidden", "0"], "argument --hidden: must be a positive integer, got 0"),
        (["--lr", "-1"], "argument --lr: must be a positive number, got -1"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"two_layer_net.py: error: {message}"]


def test_batch_that_does_not_split_across_devices():
    result = run("--batch", "63", "--steps", "2", devices=8)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "two_layer_net.py: error: --batch 63 does not split evenly across 8 devices; use a multiple of 8"
    ]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "loss.png"
    result = run("--steps", "20", "--print-every", "10", "--plot", str(path))
    assert result.returncode == 0, result.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_help():
    result = run("--help")
    assert result.returncode == 0
    for flag in ("--steps", "--lr", "--batch", "--d-in", "--hidden", "--d-out", "--seed", "--print-every", "--plot"):
        assert flag in result.stdout
