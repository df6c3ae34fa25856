"""What a user reads (issue 19, section 6): plurals, units, the source of a bad value, the
fix for YAML's booleans, and the quickstart matching the program line for line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dispatcher.cli.main import main
from dispatcher.cluster.settings import ClusterSettings
from dispatcher.config import load_config
from dispatcher.gateway import summary
from dispatcher.web.errors import ListenRefused
from dispatcher.web.server import parse_listen
from scope.foundation.errors import ConfigError
from scope.foundation.text import plural
from tests.support.env import no_bus_env

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "docs" / "quickstart.md"
SAMPLE = ROOT / "contrib" / "config.example.yaml"


def test_plural_is_one_rule() -> None:
    assert plural(1, "cron job") == "1 cron job"
    assert plural(0, "cron job") == "0 cron jobs"
    assert plural(2, "entry", "entries") == "2 entries"
    assert (
        summary.adopted(1, 0, 0)
        == "adopted 1 running worker, 0 finished while nobody watched, 0 lost"
    )
    assert summary.adopted(2, 1, 0).startswith("adopted 2 running workers, 1 finished")
    assert summary.stopping(1) == "stopping; 1 worker keeps running in its own scope or session"
    assert summary.stopping(3).startswith("stopping; 3 workers keep running")
    assert summary.degraded_lost(1, "s_1").startswith("1 degraded (unscoped) worker is lost")


def run_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str, config: Path = SAMPLE):
    capsys.readouterr()
    code = main(
        ["--config", str(config), "--state-dir", str(tmp_path / "state"), *argv],
        environ={**no_bus_env(tmp_path), "TZ": "Etc/UTC"},
    )
    out, err = capsys.readouterr()
    return code, out, err


def test_config_check_counts_in_the_singular(tmp_path: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, tmp_path, "config", "check")
    assert code == 0
    assert out.rstrip().endswith("ok (1 cron job, 1 assignee)")


def test_run_wait_timeout_names_its_unit(tmp_path: Path, capsys) -> None:
    code, out, err = run_cli(
        capsys, tmp_path, "run", "--wait", "--timeout", "1", "--", "sleep", "30"
    )
    session = out.strip().splitlines()[0]
    try:
        assert code == 124
        assert f"{session} still running after 1 s; it keeps running" in err
    finally:
        run_cli(capsys, tmp_path, "kill", session)


@pytest.mark.parametrize("text", ["localhost:99999", "127.0.0.1:65536"])
def test_listen_port_out_of_range_says_so(text: str) -> None:
    with pytest.raises(ListenRefused) as caught:
        parse_listen(text)
    assert "out of range" in caught.value.describe()


def test_bad_database_url_from_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        ClusterSettings().url({"DISPATCH_DATABASE_URL": "mysql://db/x"})
    line = caught.value.describe()
    assert "DISPATCH_DATABASE_URL" in line
    assert "cluster.database" not in line


def test_yaml_boolean_for_a_string_suggests_quoting(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        'kanban:\n  assignees:\n    a:\n      command: ["true"]\n      env: {COUNTRY: no}\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    line = caught.value.describe()
    assert "kanban.assignees.a.env.COUNTRY" in line
    assert "boolean" in line and "quote" in line and '"no"' in line


def _after(doc: list[str], command: str, count: int) -> list[str]:
    index = doc.index(command)
    return doc[index + 1 : index + 1 + count]


def test_quickstart_matches_the_program(tmp_path: Path, capsys) -> None:
    doc = QUICKSTART.read_text().splitlines()
    code, out, _ = run_cli(capsys, tmp_path, "config", "check")
    assert code == 0
    shown = out.strip().split(": ", 1)[1]
    assert any(line.endswith(f"config.yaml: {shown}") for line in doc)
    # The fire line is the launch core's: "cron fire KEY: session ID (PLACEMENT)".
    fires = [line for line in doc if "INFO dispatch.cron: cron fire" in line]
    assert fires
    for line in fires:
        assert re.search(r"cron fire \S+: session s_[0-9a-f]{12} \(in_process\)$", line), line
    # cron next, from the instant the doc's example runs at (after the 09:28:10 fire).
    start = "2026-11-30T09:28:14+00:00"
    for command, argv in (
        ("$ dispatch cron next heartbeat --count 3", ["heartbeat"]),
        (
            '$ dispatch cron next --expr "0 9 * * mon-fri" --tz Europe/Berlin --count 3',
            ["--expr", "0 9 * * mon-fri", "--tz", "Europe/Berlin"],
        ),
    ):
        code, out, err = run_cli(
            capsys, tmp_path, "cron", "next", *argv, "--from", start, "--count", "3"
        )
        assert code == 0, err
        assert _after(doc, command, 3) == out.splitlines(), command
