"""examples/two_layer_net.py in several processes (jax.distributed on CPU, gloo collectives).

Every process here listens on 127.0.0.1 only, every wait has a timeout, and each test kills
the process groups it started, whatever happens.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "two_layer_net.py"
STEPS = ["--steps", "20", "--print-every", "1"]
CACHE = None  # set by the compilation_cache fixture
TIMEOUT = 150  # seconds for one run; the runs below take 5 to 30 s on a loaded 2-core machine


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    """One JAX compilation cache for this module's processes: the random data compile once, not per process."""
    global CACHE
    CACHE = str(tmp_path_factory.mktemp("jax-cache"))


def child_env(devices, **extra):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    env["JAX_COMPILATION_CACHE_DIR"] = CACHE
    env.pop("JAX_ENABLE_X64", None)
    for name in [k for k in env if k.startswith(("SLURM_", "OMPI_", "TPU_", "MEGASCALE_", "KUBERNETES_"))]:
        del env[name]  # the outer environment must not make a child join some other run
    env.update(extra)
    return env


def start(*args, devices=1, **env):
    """Starts the example in a new process group (its own children included)."""
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        env=child_env(devices, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )


def kill_group(proc):
    """Kills whatever is left of ``proc``'s process group (its children too, even after it exited)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def finish(proc, timeout=TIMEOUT):
    """Waits for ``proc`` at most ``timeout`` seconds; kills its whole group if it is late."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        pytest.fail(f"{proc.args} did not finish within {timeout} s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run(*args, devices=1):
    proc = start(*args, devices=devices)
    try:
        return finish(proc)
    finally:
        kill_group(proc)


def losses(stdout):
    return {int(s): float(v) for s, v in re.findall(r"^Step: (\d+) : (\S+)$", stdout, re.M)}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_process_losses():
    """Per-step losses of 1 process x 1 device and 1 process x 4 devices."""
    out = {}
    for devices in (1, 4):
        result = run(*STEPS, devices=devices)
        assert result.returncode == 0, result.stderr
        out[devices] = losses(result.stdout)
        assert list(out[devices]) == list(range(1, 21))
    return out


@pytest.mark.parametrize("spmd", ["jit", "shard_map"])
def test_2_processes_x_2_devices_give_the_losses_of_1_process(one_process_losses, spmd):
    result = run(*STEPS, "--local-processes", "2", "--spmd", spmd, devices=2)
    assert result.returncode == 0, result.stderr
    got = losses(result.stdout)
    assert list(got) == list(range(1, 21))  # each step printed once: process 0 alone prints
    for step, loss in got.items():
        assert loss == pytest.approx(one_process_losses[4][step], rel=1e-5), step
        assert loss == pytest.approx(one_process_losses[1][step], rel=1e-5), step
    assert got[20] < got[1] / 50
    assert result.stdout.count("Done:") == 1
    assert "Processes: 2 (joined via --coordinator); 2 device(s) in process 0" in result.stdout
    layout = "sharded jit" if spmd == "jit" else "shard_map per device"
    assert f"Done: 20 steps on 4 cpu device(s) (data parallel, batch sharded over 2 processes, {layout})" in (
        result.stdout
    )


def test_processes_join_a_run_from_a_slurm_environment(one_process_losses):
    """What `srun -n 2` sets, simulated on this machine: JAX's own SLURM detection fills in the rest."""
    port = free_port()
    slurm = dict(SLURM_JOB_ID="1", SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="2")
    bind = dict(JAX_COORDINATOR_PORT=str(port), JAX_COORDINATOR_BIND_ADDRESS=f"127.0.0.1:{port}")
    procs = [start(*STEPS, devices=2, SLURM_PROCID=str(i), SLURM_LOCALID=str(i), **slurm, **bind) for i in range(2)]
    try:
        results = [finish(p) for p in procs]
    finally:
        for p in procs:
            kill_group(p)
    for r in results:
        assert r.returncode == 0, r.stderr
    assert "Processes: 2 (joined via SlurmCluster)" in results[0].stdout
    got = losses(results[0].stdout)
    assert list(got) == list(range(1, 21)) and losses(results[1].stdout) == {}
    for step, loss in got.items():
        assert loss == pytest.approx(one_process_losses[4][step], rel=1e-5), step


def test_single_process_ignores_the_slurm_environment():
    slurm = dict(SLURM_JOB_ID="1", SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="2", SLURM_PROCID="0")
    proc = start("--steps", "2", "--single-process", "--timeout", "5", SLURM_LOCALID="0", **slurm)
    try:
        result = finish(proc)
    finally:
        kill_group(proc)
    assert result.returncode == 0, result.stderr
    assert "Processes:" not in result.stdout and "Done: 2 steps on 1 cpu device(s)" in result.stdout


def test_a_process_whose_peers_never_come_stops_with_a_clear_message():
    port = free_port()
    start_s = time.monotonic()
    flags = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "0", "--timeout", "3"]
    result = run("--steps", "2", *flags)
    assert result.returncode == 1
    assert time.monotonic() - start_s < 60
    assert result.stderr.strip().splitlines()[-1] == (
        f"two_layer_net.py: error: the processes did not all join the run within --timeout 3 s "
        f"(process 0 of 2, coordinator 127.0.0.1:{port}); "
        "check that every process was started with the same coordinator and process count"
    )


def start_logged(path, *args, devices=1):
    """Starts the example in a new process group, its output going to files ``path``.out and .err."""
    with open(f"{path}.out", "w") as out, open(f"{path}.err", "w") as err:
        argv = [sys.executable, str(SCRIPT), *args]
        return subprocess.Popen(argv, env=child_env(devices), stdout=out, stderr=err, cwd=ROOT, start_new_session=True)


def wait_for_output(proc, path, text, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while text not in Path(f"{path}.out").read_text():
        assert proc.poll() is None, Path(f"{path}.err").read_text()
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s"
        time.sleep(0.2)


LONG_RUN = ["--steps", "1000000", "--print-every", "1000000"]  # step 1 is printed, then a long compiled loop


def test_a_process_whose_peer_dies_mid_run_stops_within_the_timeout(tmp_path):
    port = free_port()
    paths = [tmp_path / f"process{i}" for i in range(2)]
    procs = []
    try:
        for i, path in enumerate(paths):
            flags = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i)]
            procs.append(start_logged(path, *LONG_RUN, *flags, "--timeout", "5", devices=2))
        wait_for_output(procs[0], paths[0], "Step: 1 :")
        os.kill(procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        procs[0].wait(timeout=60)
        took = time.monotonic() - killed
    finally:
        for p in procs:
            kill_group(p)
    assert procs[0].returncode != 0
    assert took < 30  # the heartbeat timeout is 5 s
    # JAX's heartbeat notices the dead peer, or gloo's next collective fails first (a C++ abort
    # that no Python code can catch); either way the survivor stops, saying why
    pattern = r"another task died|stopped sending heartbeats|has another process stopped|gloo::EnforceNotMet"
    assert re.search(pattern, Path(f"{paths[0]}.err").read_text())
    assert "Done:" not in Path(f"{paths[0]}.out").read_text()


def process_ids(launcher_pid):
    """{--process-id: pid} of the launcher's children, read from /proc."""
    out = {}
    for task in Path(f"/proc/{launcher_pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            out[int(argv[argv.index(b"--process-id") + 1])] = int(pid)
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the process tree from /proc")
def test_a_dead_process_stops_the_local_run_and_leaves_no_process_behind(tmp_path):
    path = tmp_path / "launcher"
    launcher = start_logged(path, *LONG_RUN, "--local-processes", "2", devices=2)
    try:
        wait_for_output(launcher, path, "Step: 1 :")  # both processes are training
        children = process_ids(launcher.pid)
        assert sorted(children) == [0, 1]
        os.kill(children[1], signal.SIGKILL)
        launcher.wait(timeout=30)
    finally:
        kill_group(launcher)
    assert launcher.returncode == 1
    # the survivor is stopped by the launcher, or its runtime has already stopped it (gloo aborts)
    said = Path(f"{path}.err").read_text().strip().splitlines()[-1]
    prefix = "two_layer_net.py: error: process 1 of 2 was killed by SIGKILL; "
    assert re.fullmatch(
        re.escape(prefix) + r"(stopped the others|then process 0 (was killed by \w+|exited with status \d+))", said
    )
    assert "Done:" not in Path(f"{path}.out").read_text()
    for pid in children.values():
        assert not Path(f"/proc/{pid}").exists()


def test_importing_jaxfn_leaves_jax_distributed_free_to_start():
    """The example imports jaxfn first; initialize() must still be allowed (no backend started at import)."""
    port = free_port()
    code = (
        "import jax, jaxfn; "
        f"jax.distributed.initialize('127.0.0.1:{port}', 1, 0, coordinator_bind_address='127.0.0.1:{port}', "
        "initialization_timeout=20); print(jax.process_count())"
    )
    argv = [sys.executable, "-c", code]
    pipe = subprocess.PIPE
    proc = subprocess.Popen(
        argv, env=child_env(1), stdout=pipe, stderr=pipe, text=True, cwd=ROOT, start_new_session=True
    )
    try:
        result = finish(proc, timeout=60)
    finally:
        kill_group(proc)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
