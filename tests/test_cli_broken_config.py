"""A broken config does not lock the operator out of the read-only views (issue 14, defect 3).

Read-only commands (status, ps, logs, events, the kanban and cron listings) go on from the
state dir alone with one warning line naming the file, the line and the error; every command
that writes still refuses with exit 2 and one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOOD = """
kanban:
  assignees:
    echo:
      command: [sh, -c, 'echo "card $DISPATCH_CARD_ID"']
cron:
  jobs:
    - id: tick
      every: 1h
      command: [sh, -c, 'echo tick']
"""


class Home:
    def __init__(self, tmp_path: Path) -> None:
        self.config = tmp_path / "config.yaml"
        self.state = tmp_path / "state"
        self.env = dict(os.environ)
        self.env.update(DISPATCH_CONFIG=str(self.config), DISPATCH_STATE_DIR=str(self.state))

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dispatcher.cli.main", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=ROOT,
            timeout=60,
            check=False,
        )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Home:
    """A state dir with a finished session, a card and a cron fire, then a broken config."""
    h = Home(tmp_path_factory.mktemp("broken"))
    h.config.write_text(GOOD)
    card = h.run("kanban", "add", "first", "--assignee", "echo").stdout.strip()
    assert h.run("kanban", "tick").returncode == 0
    assert h.run("cron", "run", "tick", "--wait").returncode == 0
    session = h.run("run", "--wait", "--", "echo", "hello").stdout.strip()
    h.card, h.session = card, session  # type: ignore[attr-defined]
    h.config.write_text(GOOD + "  bogus: [\n")
    return h


READ_ONLY = [
    ("status",),
    ("status", "--json"),
    ("ps", "--all"),
    ("ps", "--all", "--json"),
    ("logs", "{session}"),
    ("events", "--all"),
    ("kanban", "list"),
    ("kanban", "show", "{card}"),
    ("kanban", "board"),
    ("cron", "list"),
    ("cron", "history"),
    ("wait", "{session}"),
]


@pytest.mark.parametrize("argv", READ_ONLY, ids=lambda a: " ".join(a))
def test_read_only_commands_work_and_warn_once(home: Home, argv: tuple[str, ...]) -> None:
    args = [a.format(card=home.card, session=home.session) for a in argv]  # type: ignore[attr-defined]
    done = home.run(*args)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("dispatch: warning: config not used")
    assert f"{home.config}:" in lines[0] and "invalid YAML" in lines[0]
    assert "Traceback" not in done.stderr


def test_the_views_still_show_the_state(home: Home) -> None:
    assert home.run("logs", home.session).stdout == "hello\n"  # type: ignore[attr-defined]
    cards = json.loads(home.run("kanban", "list", "--json").stdout)
    assert [c["id"] for c in cards] == [home.card]  # type: ignore[attr-defined]
    jobs = json.loads(home.run("cron", "list", "--json").stdout)
    assert [j["id"] for j in jobs] == ["tick"]
    assert jobs[0]["last_outcome"] == "completed"
    history = json.loads(home.run("cron", "history", "--json").stdout)
    assert history and history[0]["job_id"] == "tick"


WRITES = [
    ("kanban", "add", "x", "--assignee", "echo"),
    ("kanban", "tick"),
    ("run", "--", "true"),
    ("cron", "pause", "tick"),
    ("config", "show"),
    ("logs", "--redact", "{session}"),
    ("serve",),
]


@pytest.mark.parametrize("argv", WRITES, ids=lambda a: " ".join(a))
def test_writing_commands_still_refuse(home: Home, argv: tuple[str, ...]) -> None:
    args = [a.format(card=home.card, session=home.session) for a in argv]  # type: ignore[attr-defined]
    done = home.run(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "dispatch: error:" in lines[0] and f"{home.config}:" in lines[0]
