"""``dispatch cron list/next/history/pause/resume`` and cron config errors, through the CLI's
``main`` (real config files, real state database). ``cron run`` with real workers is in
test_cron_process.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from dispatcher.app.database import open_state
from dispatcher.cli.main import main
from dispatcher.cron.scheduler import CronScheduler
from dispatcher.cron.zones import fixed_zone
from registry.fake import FakeRegistry
from scope.foundation.clock import FakeClock

CONFIG = """\
cron:
  jobs:
    - id: backup
      schedule: "30 2 * * *"
      timezone: Europe/Berlin
      command: ["backup"]
    - id: beat
      every: 10m
      offset: 1m
      timezone: UTC
      command: ["beat"]
      jitter: 5s
      overlap: queue_one
      catch_up: all
      catch_up_window: 2h
      catch_up_max: 3
      timeout: 30s
"""


class Cli:
    def __init__(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.tmp_path = tmp_path
        self.capsys = capsys
        self.config = tmp_path / "config.yaml"
        self.config.write_text(CONFIG)
        self.state = tmp_path / "state"
        self.environ = {"HOME": str(tmp_path), "TZ": "America/New_York", "PATH": os.defpath}

    def __call__(self, *args: str, config: Path | None = None) -> tuple[int, str, str]:
        argv = ["--config", str(config or self.config), "--state-dir", str(self.state), *args]
        code = main(argv, self.environ)
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        code, out, err = self(*args, "--json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(tmp_path, capsys)


def one_line_error(code: int, err: str, expected_code: int = 2) -> str:
    assert code == expected_code
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# -- next ------------------------------------------------------------------------------------


def test_next_expr_follows_the_dst_rule(cli: Cli) -> None:
    got = cli.json(
        "cron", "next", "--expr", "0,30 2 * * *", "--tz", "Europe/Berlin",
        "--from", "2026-03-28T12:00", "--count", "3",
    )  # fmt: skip
    assert got == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    got = cli.json(
        "cron", "next", "--expr", "*/30 2 * * *", "--tz", "Australia/Sydney",
        "--from", "2026-04-05T00:00", "--count", "4",
    )  # fmt: skip
    assert got == [
        "2026-04-05T02:00:00+11:00",
        "2026-04-05T02:30:00+11:00",
        "2026-04-05T02:00:00+10:00",
        "2026-04-05T02:30:00+10:00",
    ]


def test_next_defaults_host_zone_exclusive_from_and_count(cli: Cli) -> None:
    # No --tz: the host zone (TZ=America/New_York here); naive --from read in it; exclusive.
    got = cli.json("cron", "next", "--expr", "0 * * * *", "--from", "2026-07-01T10:00")
    assert got == [f"2026-07-01T{h}:00:00-04:00" for h in (11, 12, 13, 14, 15)]
    aware = cli.json(
        "cron", "next", "--expr", "0 * * * *", "--from", "2026-07-01T10:00:00+00:00",
        "--count", "1",
    )  # fmt: skip
    assert aware == ["2026-07-01T07:00:00-04:00"]
    code, out, _ = cli("cron", "next", "--expr", "@daily", "--from", "2026-07-01", "--count", "2")
    assert code == 0
    assert out.splitlines() == ["2026-07-02T00:00:00-04:00", "2026-07-03T00:00:00-04:00"]
    assert len(cli.json("cron", "next", "--expr", "* * * * *", "--count", "1000")) == 1000


def test_next_of_a_job_uses_its_zone(cli: Cli) -> None:
    got = cli.json("cron", "next", "backup", "--from", "2026-10-24T12:00", "--count", "2")
    assert got == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
    got = cli.json("cron", "next", "beat", "--from", "2026-01-01T00:00:00Z", "--count", "2")
    assert got == ["2026-01-01T00:01:00+00:00", "2026-01-01T00:11:00+00:00"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--expr", "61 * * * *"], "61 is out of range 0-59"),
        (["--expr", "* * * *"], "expected 5 fields"),
        (["--expr", "* * * * *", "--tz", "Mars/Olympus"], "unknown time zone 'Mars/Olympus'"),
        (["--expr", "* * * * *", "--count", "0"], "--count"),
        (["--expr", "* * * * *", "--count", "1001"], "--count"),
        (["--expr", "* * * * *", "--from", "yesterday"], "--from"),
        (["backup", "--expr", "* * * * *"], "either JOB_ID or --expr"),
        ([], "either JOB_ID or --expr"),
        (["backup", "--tz", "UTC"], "--tz applies to --expr only"),
        (["nosuch"], "no cron job 'nosuch'"),
    ],
)
def test_next_errors_are_one_line_exit_2(cli: Cli, args: list[str], fragment: str) -> None:
    code, out, err = cli("cron", "next", *args)
    assert fragment in one_line_error(code, err)
    assert out == ""


# -- list, pause, resume ---------------------------------------------------------------------


def test_list_shows_policies_with_defaults(cli: Cli) -> None:
    entries = cli.json("cron", "list")
    assert [e["id"] for e in entries] == ["backup", "beat"]
    backup, beat = entries
    assert backup["schedule"] == "30 2 * * *"
    assert backup["timezone"] == "Europe/Berlin"
    assert backup["paused"] is False and backup["enabled"] is True
    assert backup["next_fire"].endswith(("+01:00", "+02:00"))
    assert backup["last_outcome"] is None
    assert {k: backup[k] for k in ("overlap", "catch_up", "catch_up_window", "catch_up_max")} == {
        "overlap": "skip",
        "catch_up": "latest",
        "catch_up_window": 3600.0,
        "catch_up_max": 100,
    }
    assert backup["jitter"] == 0.0 and backup["timeout"] is None
    assert beat["schedule"] == "every 10m offset 1m"
    assert (beat["overlap"], beat["catch_up"], beat["catch_up_max"]) == ("queue_one", "all", 3)
    assert (beat["jitter"], beat["timeout"], beat["catch_up_window"]) == (5.0, 30.0, 7200.0)
    code, out, _ = cli("cron", "list")
    assert code == 0
    assert "overlap=skip catch_up=latest window=1h max=100" in out


def test_pause_and_resume_are_stored(cli: Cli) -> None:
    assert cli.json("cron", "pause", "backup") == {"id": "backup", "paused": True, "changed": True}
    code, out, _ = cli("cron", "pause", "backup")
    assert (code, out.strip()) == (0, "backup: already paused")
    entry = cli.json("cron", "list")[0]
    assert entry["paused"] is True and entry["next_fire"] is None
    code, out, _ = cli("cron", "resume", "backup")
    assert (code, out.strip()) == (0, "backup: resumed")
    assert cli.json("cron", "list")[0]["paused"] is False
    code, _, err = cli("cron", "pause", "nosuch")
    assert "no cron job 'nosuch'" in one_line_error(code, err)


def test_list_warns_about_an_unsafe_env_file(cli: Cli) -> None:
    env_file = cli.tmp_path / "job.env"
    env_file.write_text("A=1\n")
    os.chmod(env_file, 0o644)
    config = cli.tmp_path / "env.yaml"
    config.write_text(
        f"cron:\n  jobs:\n    - id: e\n      every: 1h\n      command: [x]\n"
        f"      env_file: {env_file}\n"
    )
    code, out, err = cli("cron", "list", "--json", config=config)
    assert code == 0
    (entry,) = json.loads(out)
    assert entry["warnings"] and "chmod 600" in entry["warnings"][0]
    assert "chmod 600" in err


# -- history ---------------------------------------------------------------------------------


def test_history_rows(cli: Cli) -> None:
    assert cli.json("cron", "history") == []
    # Produce some rows with a scheduler on the same state database.
    from dispatcher.config import load_config

    settings = load_config(cli.config).settings
    db = open_state(cli.state)
    clock = FakeClock(1_767_225_000.0)  # 2025-12-31T23:50:00Z
    registry = FakeRegistry(clock=clock)
    scheduler = CronScheduler(
        settings.cron, registry, db, clock=clock, zone_resolver=fixed_zone("UTC")
    )
    scheduler.tick()
    clock.set(1_767_225_660.0 + 600)  # 00:11:00: the 00:01 fire is late, 00:11 on time
    scheduler.tick()
    clock.advance(10)
    scheduler.tick()
    for session in registry.running():
        registry.finish(session.id, exit_code=2)
    scheduler.tick()
    scheduler.stop()
    db.close()
    rows = cli.json("cron", "history", "beat")
    # catch_up: all runs the two late fires, queue_one queues the second and skips the on-time
    # third; the first fails with exit 2; the queued one was still in its jitter delay when the
    # scheduler stopped, so it is settled failed_start and never run.
    assert [(r["fire_key"], r["outcome"]) for r in rows] == [
        ("beat@2026-01-01T00:11:00", "skipped_overlap"),
        ("beat@2026-01-01T00:01:00", "failed_start"),
        ("beat@2025-12-31T23:51:00", "failed"),
    ]
    assert rows[2]["exit_code"] == 2 and rows[2]["error"] == "exited with code 2"
    assert rows[2]["placement"] == "in_process" and rows[2]["session_id"].startswith("s_")
    assert "stopped" in rows[1]["error"]
    for row in rows:
        assert set(row) >= {
            "job_id", "fire_key", "nominal", "actual", "outcome", "placement", "session_id",
            "exit_code", "started_at", "ended_at", "error",
        }  # fmt: skip
        assert row["job_id"] == "beat"
        assert row["nominal"].endswith("+00:00")
    keys = [r["fire_key"] for r in rows]
    assert keys == sorted(keys, reverse=True)
    assert cli.json("cron", "history", "--limit", "1") == rows[:1]
    code, _, err = cli("cron", "history", "nosuch")
    assert "no cron job 'nosuch'" in one_line_error(code, err)
    code, _, err = cli("cron", "history", "--limit", "0")
    assert "--limit" in one_line_error(code, err)


# -- config errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "line", "fragment"),
    [
        ('schedule: "0 25 * * *"', 5, "cron.jobs[0].schedule: invalid crontab expression"),
        ('schedule: "* * * * * *"', 5, "expected 5 fields"),
        ('schedule: "@reboot"', 5, "@reboot"),
        ("every: 1h\n      timezone: Nowhere/Land", 6, "unknown time zone 'Nowhere/Land'"),
        ("every: 1h\n      offset: 2h", 6, "offset must be less than every"),
        ('schedule: "@daily"\n      offset: 1m', 6, "offset only applies to every"),
        ("every: 1h\n      overlap: sometimes", 6, "use one of: skip, queue_one, replace, allow"),
        ("every: 1h\n      catch_up: never", 6, "use one of: latest, skip, all"),
    ],
)
def test_config_errors_name_file_and_line(cli: Cli, job: str, line: int, fragment: str) -> None:
    config = cli.tmp_path / "bad.yaml"
    config.write_text(f"cron:\n  jobs:\n    - id: ok\n      command: [x]\n      {job}\n")
    # `cron list` only reads, so it goes on with a warning (issue 14); a write or
    # `config check` refuses.
    code, out, err = cli("config", "check", config=config)
    message = one_line_error(code, err)
    assert f"{config}:{line}:" in message
    assert fragment in message
    assert out == ""
    assert not cli.state.exists()


def test_duplicate_job_ids_are_a_config_error(cli: Cli) -> None:
    config = cli.tmp_path / "dup.yaml"
    config.write_text(
        "cron:\n  jobs:\n"
        "    - id: a\n      every: 1h\n      command: [x]\n"
        "    - id: a\n      every: 2h\n      command: [y]\n"
    )
    code, _, err = cli("cron", "pause", "a", config=config)
    message = one_line_error(code, err)
    assert "duplicate job id 'a'" in message and f"{config}:6:" in message


def test_cron_list_shows_each_job_in_its_own_zone_not_the_shells_tz(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import datetime as dt
    import zoneinfo

    from dispatcher.cli.main import main as cli_main
    from dispatcher.cron.zones import host_zone_name
    from scope.foundation.clock import FakeClock

    config = tmp_path / "config.yaml"
    config.write_text(
        "cron:\n  jobs:\n"
        "    - id: ny\n      schedule: '0 9 * * *'\n      timezone: America/New_York\n"
        "      command: [sh, -c, ':']\n"
        "    - id: local\n      schedule: '30 6 * * *'\n      command: [sh, -c, ':']\n"
    )
    env = {
        "DISPATCH_CONFIG": str(config),
        "DISPATCH_STATE_DIR": str(tmp_path / "state"),
        "HOME": str(tmp_path),
        "TZ": "Asia/Tokyo",  # the viewer's zone: must not become the jobs' zone
    }
    ny = zoneinfo.ZoneInfo("America/New_York")
    now = dt.datetime(2026, 11, 30, 8, 56, 0, tzinfo=ny).timestamp()
    assert cli_main(["cron", "list"], environ=env, clock=FakeClock(now)) == 0
    lines = capsys.readouterr().out.splitlines()
    ny_row = next(line for line in lines if line.startswith("ny "))
    assert "America/New_York" in ny_row and "09:00:00 EST" in ny_row and "in 4m" in ny_row
    local_row = next(line for line in lines if line.startswith("local "))
    assert host_zone_name({}) in local_row and "Asia/Tokyo" not in local_row
    assert cli_main(["cron", "list", "--json"], environ=env, clock=FakeClock(now)) == 0
    jobs = {j["id"]: j for j in json.loads(capsys.readouterr().out)}
    assert jobs["ny"]["next_fire"] == "2026-11-30T09:00:00-05:00"
    assert jobs["local"]["timezone"] == host_zone_name({})
    assert "next_fire_at" not in jobs["ny"]  # JSON carries ISO-8601 only
