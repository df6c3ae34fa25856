"""Config loading and validation: defaults, file:line errors, the sample config."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.config import (
    default_config_path,
    load_config,
    parse_config,
    resolve_config_path,
)
from dispatcher.settings import CatchUpPolicy, OverlapPolicy, Settings
from scope.abc import BackendKind
from scope.foundation.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_empty_file_gives_defaults() -> None:
    assert parse_config("", "c.yaml") == Settings()
    assert parse_config("# only a comment\n", "c.yaml") == Settings()


def test_defaults_match_the_design() -> None:
    s = Settings()
    assert s.scope.probe_ttl == 60
    assert s.scope.backend is BackendKind.AUTO
    assert s.scope.memory_max is None
    assert s.registry.tail_chars == 200_000
    assert s.registry.max_log_bytes == 256 * 1024**2
    assert s.registry.kill_grace == 2
    assert s.cron.require_restart_safe_scope is False
    assert s.kanban.degrade_without_scope is False
    assert s.kanban.failure_limit is None and s.kanban.limit_for() == 2


def test_sample_config_is_valid() -> None:
    loaded = load_config(ROOT / "contrib" / "config.example.yaml")
    assert loaded.settings.cron.jobs
    assert loaded.settings.kanban.assignees


def test_full_job_parses() -> None:
    text = """
cron:
  jobs:
    - id: nightly-backup
      schedule: "30 2 * * mon-fri"
      timezone: Europe/Berlin
      command: [backup, --full]
      timeout: 1h30m
      overlap: queue_one
      catch_up: all
      env: {A: "1"}
"""
    job = parse_config(text, "c.yaml").cron.jobs[0]
    assert job.command == ("backup", "--full")
    assert job.timeout == 5400
    assert job.overlap is OverlapPolicy.QUEUE_ONE
    assert job.catch_up is CatchUpPolicy.ALL
    assert job.env == {"A": "1"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("scope:\n  probe_ttl: soon\n", "c.yaml:2: scope.probe_ttl: invalid duration 'soon'"),
        ("scope:\n  backend: magic\n", "c.yaml:2: scope.backend: invalid value 'magic'"),
        ("nope: 1\n", "c.yaml:1: nope: unknown key 'nope'"),
        ("- a\n", "c.yaml:1: the top level must be a mapping"),
        ("registry:\n  tail_chars: many\n", "c.yaml:2: registry.tail_chars: expected an integer"),
        (
            "cron:\n  jobs:\n    - id: Bad\n      every: 1m\n      command: [x]\n",
            "c.yaml:3: cron.jobs[0].id: invalid value 'Bad'",
        ),
        (
            "cron:\n  jobs:\n    - id: a\n      every: 1m\n      command: x y\n",
            "c.yaml:5: cron.jobs[0].command: a command string needs 'shell: true'",
        ),
        (
            "cron:\n  jobs:\n    - id: a\n      every: 1m\n      timezone: Mars/Base\n"
            "      command: [x]\n",
            "c.yaml:5: cron.jobs[0].timezone: unknown time zone 'Mars/Base'",
        ),
        (
            "kanban:\n  assignees:\n    bot:\n      command: [x]\n      max_in_progress: 0\n",
            "c.yaml:5: kanban.assignees.bot.max_in_progress: must be at least 1",
        ),
        ("kanban:\n  degrade_without_scope: yes please\n", "c.yaml:2: kanban.degrade_"),
    ],
)
def test_bad_values_name_file_line_and_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    message = info.value.message
    assert message.startswith(expected), message
    assert "\n" not in message
    assert info.value.exit_code == 2


def test_default_path_follows_xdg(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path), "HOME": "/nonexistent"}
    assert default_config_path(env) == tmp_path / "dispatch" / "config.yaml"
    assert resolve_config_path(None, env) is None
    (tmp_path / "dispatch").mkdir()
    (tmp_path / "dispatch" / "config.yaml").write_text("{}\n")
    assert resolve_config_path(None, env) == tmp_path / "dispatch" / "config.yaml"


def test_relative_xdg_is_ignored() -> None:
    env = {"XDG_CONFIG_HOME": "relative", "HOME": "/home/u"}
    assert default_config_path(env) == Path("/home/u/.config/dispatch/config.yaml")


def test_explicit_missing_config_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        resolve_config_path(str(tmp_path / "missing.yaml"), {})
    with pytest.raises(ConfigError, match="DISPATCH_CONFIG"):
        resolve_config_path(None, {"DISPATCH_CONFIG": str(tmp_path / "missing.yaml")})


def test_invalid_utf8_is_reported_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"scope:\n  backend: \xff\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: not valid UTF-8"):
        load_config(path)
