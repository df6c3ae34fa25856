"""Shared pieces for benchmarks: the result row, statistics, timing.

A benchmark module returns :class:`Row` objects; the runner (``python -m tests.benchmarks``)
prints them. Keep measurement helpers here so every benchmark computes medians and percentiles
the same way.
"""

from __future__ import annotations

import math
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "REPO_ROOT",
    "Launch",
    "Row",
    "Timer",
    "measure",
    "measure_commands",
    "median",
    "percentile",
    "ratio",
    "timer",
]

#: The repository root: benchmarks that start processes run them here.
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, kw_only=True)
class Row:
    """One reported figure.

    ``value`` is None when the figure could not be measured (``note`` says why). ``baseline`` is
    what ``value`` is compared with, ``ratio`` is ``value / baseline``. ``target`` is the goal as
    text (``"<= 0.6x"``, ``"p99 < 100 ms"``) and ``met`` whether this run reached it (None: no
    target, or not measurable).
    """

    figure: str
    value: float | None
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    target: str | None = None
    met: bool | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """Plain dict for ``--json`` output."""
        return asdict(self)


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct``-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile must be within 0..100, not {pct}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ratio(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``, or None when either is missing or the baseline is zero."""
    if value is None or not baseline:
        return None
    return value / baseline


@dataclass
class Timer:
    """Elapsed wall time of a ``with timer()`` block, in seconds (``perf_counter``)."""

    elapsed: float = 0.0


@contextmanager
def timer() -> Iterator[Timer]:
    """Time a block: ``with timer() as t: ...`` then read ``t.elapsed``."""
    result = Timer()
    start = time.perf_counter()
    try:
        yield result
    finally:
        result.elapsed = time.perf_counter() - start


def measure(fn: Callable[[], object], repeat: int, *, warmup: int = 1) -> list[float]:
    """Call ``fn`` ``warmup`` times untimed, then ``repeat`` times; return each duration (s)."""
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


@dataclass(frozen=True, kw_only=True)
class Launch:
    """One run of a command that :func:`measure_commands` prepares afresh for every run (a
    card to complete, say): its argv, variables added to the common environment, and the
    directory it runs in (None: the common one)."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None


def measure_commands(
    commands: Mapping[str, Sequence[str] | Callable[[], Launch]],
    repeat: int,
    *,
    cwd: Path = REPO_ROOT,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> dict[str, list[float]]:
    """Wall time of running each command to completion, ``repeat`` times each (seconds).

    A command is an argv, or a function returning a :class:`Launch`, called before every run
    and outside the timed part. Runs are interleaved (A B C A B C ...) after one untimed
    warm-up round, so drift in machine load or caches affects every command alike and ratios
    stay fair. Output is discarded. Raises ``subprocess.CalledProcessError`` if a command
    fails, since its timing would be meaningless.
    """
    run_env = dict(os.environ if env is None else env)

    def launch(command: Sequence[str] | Callable[[], Launch]) -> Launch:
        if callable(command):
            return command()
        return Launch(argv=list(command))

    def run(what: Launch) -> None:
        # Not subprocess.run(timeout=...): with a timeout, Popen.wait polls with sleeps that
        # double up to 50 ms, which rounds every measured time up to its polling steps (a
        # 25 ms command measured as 64 ms). A blocking wait returns at once; a timer kills a
        # command that hangs.
        process = subprocess.Popen(
            list(what.argv),
            cwd=what.cwd or cwd,
            env={**run_env, **what.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        watchdog = threading.Timer(timeout, process.kill)
        watchdog.start()
        try:
            code = process.wait()
        finally:
            watchdog.cancel()
        if code != 0:
            raise subprocess.CalledProcessError(code, list(what.argv))

    for command in commands.values():
        run(launch(command))
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, command in commands.items():
            what = launch(command)
            start = time.perf_counter()
            run(what)
            samples[name].append(time.perf_counter() - start)
    return samples
