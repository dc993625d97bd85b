"""Shared by the gallery's entries: the command line, compiled memory, interleaved timings, markdown tables."""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

# The command line: every flag checked when it is parsed, before anything is measured ---------------


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's help ends with its default, where it has one (not an off switch or an unset path)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An entry's command line: each flag's help ends with its default, and an error is one line
    (``prog: error: argument --steps: must be a positive integer, got -3``) and exit status 2."""

    def __init__(self, script: str, doc: str | None) -> None:
        super().__init__(
            prog=os.path.basename(script),
            description=(doc or "").splitlines()[0],
            formatter_class=_DefaultsHelp,
        )

    def error(self, message: str):  # one line, no usage block
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def positive_int(text: str) -> int:
    """A count or a size: a whole number above 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, like 10, but got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, like 0.1, but got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


MATPLOTLIB_MISSING = "needs matplotlib, which is not installed: pip install matplotlib"


def png_path(text: str) -> str:
    """``--plot``'s path, checked before anything is measured: a ``.png`` name in a folder that
    exists and can be written, and matplotlib installed."""
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"writes a PNG image, so the name must end in .png, but got {text!r}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"the folder {folder} does not exist, so {text!r} can't be written")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"the folder {folder} can't be written to, so {text!r} can't be saved")
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError(MATPLOTLIB_MISSING)
    return text


def add_plot(parser: argparse.ArgumentParser, what: str) -> None:
    """``--plot PATH.png``: ``what`` is drawn there (matplotlib, checked before anything runs)."""
    parser.add_argument("--plot", metavar="PATH.png", type=png_path, help=f"{what}, as a PNG image (needs matplotlib)")


# Measuring ------------------------------------------------------------------------------------------


def compiled(f: Callable[..., Any], *args: Any) -> Any:
    """``f`` compiled for ``args`` (arrays or ``jax.ShapeDtypeStruct``s); compiling runs nothing."""
    return jax.jit(f).lower(*args).compile()


def memory(executable: Any) -> dict[str, int]:
    """What XLA reports for a compiled program: temporary, argument and output bytes."""
    analysis = executable.memory_analysis()
    return {
        "temp": analysis.temp_size_in_bytes,
        "argument": analysis.argument_size_in_bytes,
        "output": analysis.output_size_in_bytes,
    }


def interleaved_medians(calls: dict[str, Callable[[], Any]], repeats: int, warmup: bool = True):
    """Median seconds per call, the contenders run in turn within each repeat; also each one's last result."""
    wall, _, results = interleaved_wall_and_cpu(calls, repeats, warmup)
    return wall, results


def interleaved_wall_and_cpu(calls: dict[str, Callable[[], Any]], repeats: int, warmup: bool = True):
    """As ``interleaved_medians``, with the median CPU seconds too (``time.process_time``: every thread
    of this process), which other jobs on a shared machine disturb less than wall time."""
    results = {name: jax.block_until_ready(call()) for name, call in calls.items()} if warmup else {}
    wall: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            results[name] = jax.block_until_ready(call())
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    medians = {name: statistics.median(seconds) for name, seconds in wall.items()}
    return medians, {name: statistics.median(seconds) for name, seconds in cpu.items()}, results


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.1f} MB"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    return f"jax {jax.__version__}, {cpu}, {os.cpu_count()} cores, {jax.devices()[0].platform}"
