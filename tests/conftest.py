import os
import shutil
from pathlib import Path

import jax
import pytest

jax.config.update("jax_enable_x64", True)

# XLA's compilations persist between runs, so a second quick loop mostly skips compiling (see
# CONTRIBUTING.md). Only XLA's work is reused: every test still traces, lowers and runs its code.
# JAX writes cache entries without a lock, so no two processes write one folder: each process
# (pytest-xdist worker) writes its own, starting from a copy of `shared`, and the controller
# merges them into `shared` once its workers are done. JAX_COMPILATION_CACHE_DIR, when set,
# chooses one folder instead.
CACHE = Path(__file__).resolve().parent.parent / ".jax-cache"
PROCESS = os.environ.get("PYTEST_XDIST_WORKER", "main")
OWN_CACHE = not os.environ.get("JAX_COMPILATION_CACHE_DIR")


def _copy_missing(source: Path, target: Path) -> None:
    """The entries of ``source`` that ``target`` lacks, each one appearing whole (os.replace)."""
    if not source.is_dir():
        return
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.is_file() and not entry.name.startswith(".") and not (target / entry.name).exists():
            partial = target / f".{entry.name}.{os.getpid()}"
            shutil.copyfile(entry, partial)
            os.replace(partial, target / entry.name)


def pytest_sessionfinish(session):
    if OWN_CACHE and PROCESS == "main":  # the controller: its workers have finished writing
        for folder in CACHE.iterdir() if CACHE.is_dir() else ():
            if folder.is_dir() and folder.name != "shared":
                _copy_missing(folder, CACHE / "shared")


if OWN_CACHE:
    _copy_missing(CACHE / "shared", CACHE / PROCESS)
    jax.config.update("jax_compilation_cache_dir", str(CACHE / PROCESS))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(params=["eager", "jit"])
def maybe_jit(request):
    """Run a test both without and under jax.jit."""
    return (lambda f: f) if request.param == "eager" else jax.jit


@pytest.fixture
def plot_png(tmp_path, monkeypatch):
    """Where a gallery script's ``--plot`` writes its PNG: matplotlib required (else the test is
    skipped), its cache kept in the test's temporary folder."""
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "matplotlib"))
    return tmp_path / "plot.png"
