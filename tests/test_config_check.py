"""``dispatch config check`` reports every error in the file, and warns about programs that
are not on PATH (issue 14)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BROKEN = """\
scope:
  probe_ttl: often
cron:
  jobs:
    - id: a
      every: 1h
      command: [echo]
    - id: b
      schedule: "61 * * * *"
      command: [echo]
    - id: c
      every: 1h
      command: "echo no shell"
kanban:
  failure_limt: 3
  assignees:
    w:
      command: [sh, -c, 'true']
      bogus: 1
"""


def check(path: Path, *extra: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.main", "config", "check", str(path), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


def test_every_error_is_reported_one_line_each_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(BROKEN)
    done = check(path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert [line.split(":")[3] for line in lines] == ["2", "9", "13", "15", "19"], lines
    assert all(line.startswith(f"dispatch: error: {path}:") for line in lines)
    assert "scope.probe_ttl: invalid duration" in lines[0]
    assert "cron.jobs[1].schedule: invalid crontab expression" in lines[1]
    assert "cron.jobs[2].command" in lines[2] and "shell: true" in lines[2]
    assert "did you mean 'failure_limit'" in lines[3]
    assert "kanban.assignees.w.bogus: unknown key" in lines[4]
    assert done.stdout == ""
    doc = json.loads(check(path, "--json").stdout)
    assert doc["ok"] is False and len(doc["errors"]) == 5
    # Loading (every other command) still stops at the first one.
    loaded = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.main", "--config", str(path), "config", "show"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert loaded.returncode == 2 and len(loaded.stderr.splitlines()) == 1


def test_a_program_not_on_path_is_a_warning_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "cron:\n  jobs:\n    - id: a\n      every: 1h\n      command: [no-such-program-x]\n"
        "kanban:\n  assignees:\n    w:\n      command: [./local-tool]\n      cwd: /\n"
        "    fine:\n      command: [sh, -c, ':']\n"
        "    shelled:\n      command: 'anything | here'\n      shell: true\n"
    )
    done = check(path)
    assert done.returncode == 0, done.stderr
    warnings = done.stderr.strip().splitlines()
    assert warnings == [
        f"dispatch: warning: {path}:5: cron.jobs[0].command: program 'no-such-program-x' not "
        "found on PATH",
        f"dispatch: warning: {path}:9: kanban.assignees.w.command: program './local-tool' not "
        "found on PATH",
    ]
    assert "ok (1 cron job, 3 assignees)" in done.stdout
    # The worker's own PATH counts: found there, no warning.
    tool = tmp_path / "bin" / "no-such-program-x"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    text = path.read_text().replace(
        "command: [no-such-program-x]\n",
        f"command: [no-such-program-x]\n      env: {{PATH: {tool.parent}}}\n",
    )
    path.write_text(text)
    assert "cron.jobs[0]" not in check(path).stderr


NOTIFY = """\
notify:
  channels:
    local: {command: ["/bin/cat"]}
  rules:
    - {on: [card.blocked, cron.failed], to: [local]}
    - on: [card.review]
      assignees: [coder]
      to: [%s]
"""


def test_notify_rules_written_with_a_bare_on_key_are_checked_like_any_key(
    tmp_path: Path,
) -> None:
    # YAML 1.1 reads a bare `on:` as the boolean true; the issue's own example writes it so.
    path = tmp_path / "config.yaml"
    path.write_text(NOTIFY % "local")
    done = check(path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    path.write_text(NOTIFY % "pagr")
    done = check(path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"dispatch: error: {path}:8: notify.rules[1].to[0]: unknown channel 'pagr'; define it"
        " under notify.channels"
    ]
