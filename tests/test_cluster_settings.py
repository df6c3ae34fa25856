"""The ``cluster:`` config section: defaults, cross-key rule, URL checks, no password shown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.cluster.settings import ENV_URL, ClusterSettings
from dispatcher.settings import SCHEMA
from scope.foundation.errors import ConfigError, Invalid
from scope.foundation.schema import Record


def test_defaults_mean_one_host_on_sqlite() -> None:
    settings = ClusterSettings()
    assert settings.url({}) is None
    assert (settings.heartbeat, settings.lease_ttl) == (5.0, 30.0)
    assert settings.effective_host_id()


def test_the_environment_overrides_the_config() -> None:
    settings = ClusterSettings(database="postgresql://a@h/x")
    assert settings.url({ENV_URL: "postgresql://b@h/y"}) == "postgresql://b@h/y"
    with pytest.raises(ConfigError):
        settings.url({ENV_URL: "http://nope"})


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"heartbeat": "20s"}, "at least 3 x heartbeat"),
        ({"host_id": "Bad Host"}, "lowercase"),
        ({"database": "mysql://x"}, "postgresql://"),
    ],
)
def test_bad_values_are_refused(section: dict[str, str], problem: str) -> None:
    with pytest.raises(Invalid, match=problem):
        Record(ClusterSettings).convert(section)


def test_config_show_hides_the_password(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("cluster:\n  database: postgresql://u:hunter2@db:5432/board\n")
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher.cli.main",
            "--config",
            str(config),
            "--json",
            "--state-dir",
            str(tmp_path / "state"),
            "config",
            "show",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "hunter2" not in shown.stdout + shown.stderr
    assert "postgresql://u@db:5432/board" in shown.stdout
    assert SCHEMA.dump(SCHEMA.convert({}))["cluster"]["database"] is None
