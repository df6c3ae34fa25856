"""Start-up cost of the ``dispatch`` CLI compared with a bare Python interpreter.

Every cron fire and every oneshot ``dispatch kanban tick`` pays the CLI's start-up, so it is
measured against ``python -c pass`` (the floor for any Python program) and ``python -I -S -c
pass`` (the floor the keeper aims for: no site, no user paths). The same interpreter runs all
three, so the ratios show what our imports cost, not which Python is installed.
"""

from __future__ import annotations

import subprocess
import sys

from tests.benchmarks.common import REPO_ROOT, Row, measure_commands, median, percentile, ratio

NAME = "cli_startup"
DESCRIPTION = "dispatch --version vs python -c pass and python -I -S -c pass (median wall time)"

CLI = [sys.executable, "-m", "dispatcher.cli.main", "--version"]
BARE = [sys.executable, "-c", "pass"]
ISOLATED = [sys.executable, "-I", "-S", "-c", "pass"]


def _cli_problem() -> str | None:
    """Why the CLI cannot be timed (it is missing or fails), or None when it runs."""
    try:
        done = subprocess.run(
            CLI, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"unavailable: exit {done.returncode}: {last}"
    return None


def _row(figure: str, samples: list[float], baseline: float | None) -> Row:
    value = median(samples) * 1000
    return Row(
        figure=figure,
        value=value,
        unit="ms",
        baseline=baseline,
        ratio=ratio(value, baseline),
        note=f"n={len(samples)}, p90={percentile(samples, 90) * 1000:.1f} ms",
    )


def run(quick: bool) -> list[Row]:
    """Median start-up times; the CLI row says "unavailable" when the CLI cannot run."""
    repeat = 5 if quick else 30
    problem = _cli_problem()
    commands = {"bare": BARE, "isolated": ISOLATED}
    if problem is None:
        commands["cli"] = CLI
    samples = measure_commands(commands, repeat)
    bare = median(samples["bare"]) * 1000
    rows = [
        _row("python -c pass", samples["bare"], None),
        _row("python -I -S -c pass", samples["isolated"], bare),
    ]
    if problem is None:
        rows.append(_row("dispatch --version", samples["cli"], bare))
    else:
        rows.append(Row(figure="dispatch --version", value=None, unit="ms", note=problem))
    return rows
