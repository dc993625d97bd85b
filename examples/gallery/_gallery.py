"""Shared by the gallery's entries: compiled memory, interleaved timings, markdown tables."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax


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
