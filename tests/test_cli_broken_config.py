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


def test_views_mark_what_they_cannot_know(home: Home, tmp_path: Path) -> None:
    """Issue 19 §4: a broken config never reads as "nothing configured" or "nothing fires"."""
    listed = home.run("cron", "list")
    assert "no cron jobs configured" not in listed.stdout
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("tick ")]
    assert row.split()[4:6] == ["?", "?"] and "(config not loaded)" in row
    status = home.run("status")
    assert "next fires: none" not in status.stdout
    assert "next fires: unknown (config not loaded; jobs the state dir knows: tick)" in (
        status.stdout
    )
    (placement,) = [line for line in status.stdout.splitlines() if line.startswith("placement:")]
    assert "as a gateway under its unit would get it" in placement
    assert "config not loaded" in placement
    doc = json.loads(home.run("status", "--json").stdout)
    assert doc["next_cron_fires"] is None and doc["cron_jobs_known"] == ["tick"]
    limits = home.run("limits")
    assert limits.returncode == 0 and "no limits are configured" not in limits.stdout
    assert limits.stdout.startswith("limits: unknown (config not loaded")
    assert json.loads(home.run("limits", "--json").stdout) is None
    # A state dir that has seen no fire yet: the configured jobs are unknown, not absent.
    empty = home.run("--state-dir", str(tmp_path / "fresh"), "cron", "list")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.startswith("no cron jobs known to the state dir (config not loaded")


@pytest.mark.parametrize(
    "argv",
    [
        ("--config", "{missing}", "status"),
        ("--config", "{missing}", "kanban", "list"),
        ("--config", "{missing}", "cron", "list"),
        ("--config", "{missing}", "kanban", "add", "x", "--assignee", "echo"),
    ],
    ids=lambda a: " ".join(a[2:]),
)
def test_an_explicit_missing_config_is_exit_2_everywhere(
    home: Home, tmp_path: Path, argv: tuple[str, ...]
) -> None:
    """Issue 19 §4: one rule for ``--config`` naming a missing file (docs/configuration.md)."""
    done = home.run(*[a.format(missing=tmp_path / "nope.yaml") for a in argv])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "config file not found (from --config)" in lines[0], lines
