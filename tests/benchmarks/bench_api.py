"""The HTTP API (issue 24 §2): cards added per second through ``POST /api/v1/cards``.

A real ``dispatch web`` on a fresh state dir, one client on one kept-alive connection with an
operate token, adding N cards one after the other; the baseline is ``dispatch kanban add``
run as a process per card in a loop on the same kind of state dir, measured in the same run.
The figure is the API's rate and its ratio to the CLI loop's (no target: the issue asks for the
ratio). Full mode: 300 API adds, 30 CLI adds. Quick: 40 and 6.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.benchmarks.common import Row, ratio
from tests.support.api import Api, make_token
from tests.support.browser import WebHome, WebProcess
from tests.support.cli import dispatch_argv

NAME = "api"
DESCRIPTION = "HTTP API: cards added per second (one keep-alive client) vs `dispatch kanban add`"
CONFIG = 'kanban:\n  assignees:\n    a: {command: ["true"]}\n'


def _api_rate(root: Path, count: int) -> float:
    home = WebHome(root, CONFIG)
    home.dispatch("kanban", "pause")
    web = WebProcess(home.config, home.state, home.env)
    client = Api(web.url, make_token(home, "bench", "operate"))
    try:
        client.post("/cards", {"title": "warm-up", "assignee": "a"})
        start = time.perf_counter()
        for index in range(count):
            answer = client.post("/cards", {"title": f"card {index}", "assignee": "a"})
            if answer.status != 201:
                raise RuntimeError(f"POST /cards answered {answer.status}: {answer.raw[:200]!r}")
        return count / (time.perf_counter() - start)
    finally:
        client.close()
        web.stop()


def _cli_rate(root: Path, count: int) -> float:
    home = WebHome(root, CONFIG)
    home.dispatch("kanban", "pause")
    argv = dispatch_argv(home.config, home.state, "kanban", "add", "x", "--assignee", "a")
    start = time.perf_counter()
    for _ in range(count):
        subprocess.run(argv, env=home.env, check=True, capture_output=True, timeout=60)
    return count / (time.perf_counter() - start)


def run(quick: bool) -> list[Row]:
    """The two rates and their ratio."""
    api_count, cli_count = (40, 6) if quick else (300, 30)
    base = Path(tempfile.mkdtemp(prefix="bench-api-"))
    try:
        (base / "api").mkdir()
        (base / "cli").mkdir()
        api = _api_rate(base / "api", api_count)
        cli = _cli_rate(base / "cli", cli_count)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return [
        Row(
            figure=f"cards added per second, POST /api/v1/cards ({api_count}, keep-alive)",
            value=round(api, 1),
            unit="cards/s",
            baseline=round(cli, 2),
            ratio=ratio(api, cli),
            note=f"baseline: {cli_count} `dispatch kanban add` processes in a loop",
        )
    ]
