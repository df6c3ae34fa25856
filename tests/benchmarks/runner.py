"""Discover, run and report benchmarks: ``python -m tests.benchmarks [--quick] [--only NAME ...]``.

Each ``tests/benchmarks/bench_<name>.py`` exposes ``NAME``, a one-line ``DESCRIPTION`` and
``run(quick: bool) -> list[Row]``. A benchmark that raises is reported as an error row and the
others still run; the exit status is then 1. Exit status 2 is a usage error (unknown name).
``--strict`` also exits 1 when a figure misses its target. ``--markdown`` prints the combined
table as Markdown (the form docs/benchmarks.md records).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import platform
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from scope.latency import read_placement_latency
from tests.benchmarks.common import Row

__all__ = ["Benchmark", "discover", "main", "render_markdown", "render_table"]

_PREFIX = "bench_"


@dataclass(frozen=True, kw_only=True)
class Benchmark:
    """A discovered benchmark module."""

    name: str
    description: str
    module: ModuleType

    def run(self, quick: bool) -> list[Row]:
        """Run it."""
        rows: list[Row] = self.module.run(quick)
        return rows


def discover() -> list[Benchmark]:
    """All ``bench_*`` modules of this package, sorted by name."""
    package = importlib.import_module("tests.benchmarks")
    found: list[Benchmark] = []
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith(_PREFIX):
            continue
        module = importlib.import_module(f"tests.benchmarks.{info.name}")
        for attr in ("NAME", "DESCRIPTION", "run"):
            if not hasattr(module, attr):
                raise AttributeError(f"benchmark module {module.__name__} lacks {attr}")
        found.append(Benchmark(name=module.NAME, description=module.DESCRIPTION, module=module))
    return sorted(found, key=lambda b: b.name)


def machine() -> dict[str, object]:
    """What the figures depend on: load at start, cores, interpreter, platform, and whether
    cgroups carry ``favordynmods`` (placements after a pause wait on the kernel without it)."""
    return {
        "load": [round(x, 2) for x in os.getloadavg()],
        "cores": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "favordynmods": read_placement_latency().state,
    }


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"


def render_table(results: Sequence[tuple[str, Row]]) -> str:
    """A fixed-width text table of (benchmark, row) pairs."""
    header = ("benchmark", "figure", "value", "unit", "baseline", "ratio", "target", "met", "note")
    lines = [header]
    for bench, row in results:
        met = {True: "yes", False: "NO", None: "-"}[row.met]
        lines.append(
            (
                bench,
                row.figure,
                _fmt(row.value),
                row.unit,
                _fmt(row.baseline),
                "-" if row.ratio is None else f"{row.ratio:.2f}x",
                row.target or "-",
                met,
                row.note,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    numeric = {2, 4, 5}
    out = []
    for line in lines:
        cells = [
            cell.rjust(width) if i in numeric else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=False))
        ]
        out.append("  ".join([*cells, line[-1]]).rstrip())
    out.insert(1, "-" * len(out[0]))
    return "\n".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(results: Sequence[tuple[str, Row]]) -> str:
    """The same rows as :func:`render_table`, as a Markdown table (met: yes / **NO** / -)."""
    header = ("benchmark", "figure", "value", "unit", "baseline", "ratio", "target", "met", "note")
    lines = ["| " + " | ".join(header) + " |", "|---|---|---:|---|---:|---:|---|---|---|"]
    for bench, row in results:
        met = {True: "yes", False: "**NO**", None: "-"}[row.met]
        cells = (
            bench,
            row.figure,
            _fmt(row.value),
            row.unit,
            _fmt(row.baseline),
            "-" if row.ratio is None else f"{row.ratio:.2f}x",
            row.target or "-",
            met,
            row.note,
        )
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke runs)")
    parser.add_argument(
        "--only", nargs="+", action="extend", metavar="NAME", help="run only these benchmarks"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead")
    parser.add_argument(
        "--markdown", action="store_true", help="print the table as Markdown (for the docs)"
    )
    parser.add_argument("--list", action="store_true", help="list benchmarks and exit")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)

    benchmarks = discover()
    if args.list:
        for bench in benchmarks:
            print(f"{bench.name:20}  {bench.description}")
        return 0
    if args.only:
        known = {b.name for b in benchmarks}
        unknown = sorted(set(args.only) - known)
        if unknown:
            print(f"unknown benchmark(s): {unknown}; known: {sorted(known)}", file=sys.stderr)
            return 2
        benchmarks = [b for b in benchmarks if b.name in args.only]

    info = machine()
    mode = "quick" if args.quick else "full"
    if not args.json:
        load = " ".join(f"{x:.2f}" for x in info["load"])  # type: ignore[attr-defined]
        print(
            f"machine: load {load}, {info['cores']} cores, {info['python']}, {info['platform']},"
            f" cgroup favordynmods {info['favordynmods']}"
        )
        print(f"mode: {mode}", flush=True)

    results: list[tuple[str, Row]] = []
    errors = 0
    for bench in benchmarks:
        started = time.perf_counter()
        try:
            rows = bench.run(args.quick)
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            errors += 1
            rows = [Row(figure="error", value=None, unit="", note=f"{type(exc).__name__}: {exc}")]
            traceback.print_exc(file=sys.stderr)
        results.extend((bench.name, row) for row in rows)
        if not args.json:
            print(f"ran {bench.name} in {time.perf_counter() - started:.1f} s", flush=True)

    missed = sum(1 for _, row in results if row.met is False)
    if args.json:
        document = {
            "machine": info,
            "mode": mode,
            "errors": errors,
            "rows": [{"benchmark": bench, **row.to_json()} for bench, row in results],
        }
        print(json.dumps(document, indent=2))
    else:
        print()
        print(render_markdown(results) if args.markdown else render_table(results))
        if errors:
            print(f"\n{errors} benchmark(s) failed; see the error rows and stderr")
    if errors or (args.strict and missed):
        return 1
    return 0
