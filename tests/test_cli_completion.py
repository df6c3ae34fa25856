"""Shell completion and the man page, generated from the one parser (issue 14)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dispatcher.cli.main import build_parser
from tests.test_cli_parser import walk

ROOT = Path(__file__).resolve().parent.parent
ENTRY = [sys.executable, "-c", "from dispatcher.cli.main import entry; entry()"]


def dispatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.main", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def complete(line: str, env: dict[str, str]) -> list[str]:
    """What a shell's hook gets for ``line`` (argcomplete's protocol, answers in a file)."""
    with tempfile.TemporaryDirectory() as scratch:
        answers = Path(scratch) / "answers"
        full = {
            **os.environ,
            **env,
            "_ARGCOMPLETE": "1",
            "_ARGCOMPLETE_IFS": "\n",
            "_ARGCOMPLETE_STDOUT_FILENAME": str(answers),
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "PYTHONPATH": str(ROOT),
        }
        done = subprocess.run(
            ENTRY, env=full, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == ""  # nothing reaches the terminal
        out = answers.read_text()
    return [word.strip() for word in out.split("\n") if word.strip()]


@pytest.fixture
def state(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "config.yaml"
    config.write_text(
        "kanban:\n  assignees:\n    echo:\n      command: [sh, -c, 'echo hi']\n"
        "cron:\n  jobs:\n    - id: nightly\n      schedule: '0 3 * * *'\n"
        "      command: [sh, -c, ':']\n"
    )
    env = {"DISPATCH_CONFIG": str(config), "DISPATCH_STATE_DIR": str(tmp_path / "state")}
    assert dispatch("run", "--wait", "--", "true", env=env).returncode == 0
    assert dispatch("kanban", "add", "one", "--assignee", "echo", env=env).returncode == 0
    return env


def test_commands_options_and_live_ids_complete(state: dict[str, str]) -> None:
    assert "kanban" in complete("dispatch kan", state)
    assert {"add", "archive"} <= set(complete("dispatch kanban a", state))
    assert "--state" in complete("dispatch ps --st", state)
    db = sqlite3.connect(Path(state["DISPATCH_STATE_DIR"]) / "state.db")
    (session,) = db.execute("SELECT id FROM registry_sessions").fetchone()
    (card,) = db.execute("SELECT id FROM kanban_cards").fetchone()
    db.close()
    assert complete("dispatch logs s_", state) == [session]
    assert complete("dispatch kanban show c_", state) == [card]
    assert complete("dispatch cron pause ni", state) == ["nightly"]
    assert complete("dispatch kanban add x --assignee e", state) == ["echo"]
    # Another state dir on the command line is the one asked.
    assert complete("dispatch --state-dir /nonexistent logs s_", state) == []


def test_completing_never_creates_a_state_dir(tmp_path: Path) -> None:
    env = {"DISPATCH_STATE_DIR": str(tmp_path / "nowhere"), "XDG_CONFIG_HOME": str(tmp_path)}
    assert complete("dispatch logs s_", env) == []
    assert not (tmp_path / "nowhere").exists()


def test_the_bash_hook_is_valid_bash_and_wires_dispatch(tmp_path: Path) -> None:
    script = dispatch("completion", "bash").stdout
    path = tmp_path / "dispatch.bash"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    loaded = subprocess.run(
        ["bash", "-c", f"source {path}; complete -p dispatch"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert loaded.returncode == 0 and "dispatch" in loaded.stdout, loaded.stderr


@pytest.mark.parametrize(("shell", "marker"), [("zsh", "#compdef dispatch"), ("fish", "dispatch")])
def test_zsh_and_fish_hooks(shell: str, marker: str, tmp_path: Path) -> None:
    done = dispatch("completion", shell)
    assert done.returncode == 0 and marker in done.stdout
    if shell == "fish":
        assert "complete " in done.stdout and "--command dispatch" in done.stdout
    binary = shutil.which(shell)
    if binary is None:
        return  # structure checked above; the syntax check needs the shell
    path = tmp_path / f"dispatch.{shell}"
    path.write_text(done.stdout)
    assert subprocess.run([binary, "-n", str(path)], check=False).returncode == 0


def test_the_man_page_lists_every_command_and_option() -> None:
    done = dispatch("manpage")
    assert done.returncode == 0, done.stderr
    page = done.stdout
    assert page.startswith('.TH DISPATCH "1"')
    for path, parser in walk(build_parser()):
        if len(path) > 1:
            assert f"'{' '.join(path)}'" in page, path
        for action in parser._actions:
            for option in action.option_strings:
                assert option.replace("-", "\\-") in page or option in page, (path, option)
    for section in ("EXIT STATUS", "ENVIRONMENT", "FILES", "SEE ALSO"):
        assert f".SH {section}" in page
    if shutil.which("man"):
        rendered = subprocess.run(
            ["man", "-l", "-"], input=page, capture_output=True, text=True, check=False
        )
        assert rendered.returncode == 0 and "kanban add" in rendered.stdout
