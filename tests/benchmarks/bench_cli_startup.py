"""Start-up cost of the ``dispatch`` CLI compared with a bare Python interpreter.

Every cron fire and every oneshot ``dispatch kanban tick`` pays the CLI's start-up, so it is
measured against ``python -c pass`` (the floor for any Python program) and ``python -I -S -c
pass`` (the floor the keeper aims for: no site, no user paths). The same interpreter runs all
of them, interleaved, so the ratios show what our imports cost, not which Python is installed
or how loaded the machine is. Targets (issue 14): ``dispatch --version`` <= 1.3x and
``dispatch kanban add`` <= 1.6x ``python -c pass``. ``kanban add`` runs against a config with
one assignee and its own state dir (every run adds a card, as an operator's would).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.benchmarks.common import REPO_ROOT, Row, measure_commands, median, percentile, ratio

NAME = "cli_startup"
DESCRIPTION = (
    "dispatch --version and dispatch kanban add vs python -c pass and python -I -S -c pass "
    "(median wall time)"
)

CLI = [sys.executable, "-m", "dispatcher.cli.main", "--version"]
ADD = [sys.executable, "-m", "dispatcher.cli.main", "kanban", "add", "bench", "--assignee", "w"]
BARE = [sys.executable, "-c", "pass"]
ISOLATED = [sys.executable, "-I", "-S", "-c", "pass"]
TARGETS = {"dispatch --version": 1.3, "dispatch kanban add": 1.6}


def _cli_problem(argv: list[str], env: dict[str, str]) -> str | None:
    """Why the CLI cannot be timed (it is missing or fails), or None when it runs."""
    try:
        done = subprocess.run(
            argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"unavailable: exit {done.returncode}: {last}"
    return None


def _row(figure: str, samples: list[float], baseline: float | None) -> Row:
    value = median(samples) * 1000
    factor = ratio(value, baseline)
    target = TARGETS.get(figure)
    return Row(
        figure=figure,
        value=value,
        unit="ms",
        baseline=baseline,
        ratio=factor,
        target=f"<= {target}x" if target else None,
        met=None if target is None or factor is None else factor <= target,
        note=f"n={len(samples)}, p90={percentile(samples, 90) * 1000:.1f} ms",
    )


def run(quick: bool) -> list[Row]:
    """Median start-up times; a CLI row says "unavailable" when that command cannot run."""
    repeat = 5 if quick else 30
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "config.yaml"
        config.write_text("kanban:\n  assignees:\n    w:\n      command: [sh, -c, ':']\n")
        env = dict(os.environ)
        env.update(DISPATCH_CONFIG=str(config), DISPATCH_STATE_DIR=str(Path(scratch) / "state"))
        env.pop("_ARGCOMPLETE", None)
        clis = {"dispatch --version": CLI, "dispatch kanban add": ADD}
        problems = {figure: _cli_problem(argv, env) for figure, argv in clis.items()}
        commands = {"bare": BARE, "isolated": ISOLATED}
        commands.update({f: argv for f, argv in clis.items() if problems[f] is None})
        samples = measure_commands(commands, repeat, env=env)
    bare = median(samples["bare"]) * 1000
    rows = [
        _row("python -c pass", samples["bare"], None),
        _row("python -I -S -c pass", samples["isolated"], bare),
    ]
    for figure in clis:
        problem = problems[figure]
        if problem is None:
            rows.append(_row(figure, samples[figure], bare))
        else:
            rows.append(Row(figure=figure, value=None, unit="ms", note=problem))
    return rows
