"""The CLI in cluster mode, as real processes against a real PostgreSQL: every command uses the
cluster database for cluster state, and bad input is one line with the right exit code,
nothing written and no password shown."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from dispatcher.app.database import open_state
from dispatcher.cluster import tables
from dispatcher.cluster.board import HostStamp, PgBoardStore
from dispatcher.cluster.database import ClusterDB
from dispatcher.cluster.hosts import Hosts
from dispatcher.kanban.model import Limits
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant
from tests.support.cli import run_dispatch
from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.postgres

SECRET = "s3cret-Pw.42"
ME = Claimant(pid=1, start=1, boot=None)


class Cli:
    def __init__(self, tmp: Path, url: str, host_id: str = "alpha") -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.config = tmp / "config.yaml"
        self.config.write_text(
            f"cluster:\n  host_id: {host_id}\n"
            "kanban:\n  assignees:\n    w:\n      command: [sh, -c, 'echo hi']\n"
        )
        self.state = tmp / "state"
        self.env = {**os.environ, "DISPATCH_DATABASE_URL": url, "PYTHONPATH": str(Path.cwd())}

    def __call__(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return run_dispatch(self.config, self.state, self.env, *args, check=check)


def _one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture
def db(cluster_db: ClusterDB) -> ClusterDB:
    return cluster_db


def test_commands_share_the_cluster_board(db: ClusterDB, pg_url: str, tmp_path: Path) -> None:
    here = Cli(tmp_path / "a", pg_url)
    there = Cli(tmp_path / "b", pg_url, host_id="beta")
    added = json.loads(here("kanban", "add", "shared", "--assignee", "w", "--json").stdout)
    listed = json.loads(there("kanban", "list", "--json").stdout)
    assert [c["id"] for c in listed] == [added["id"]]
    assert there("kanban", "pause").returncode == 0
    assert PgBoardStore(db).paused()
    assert (
        not (tmp_path / "b" / "state" / "state.db").exists()
        or not SqliteBoardStore(open_state(tmp_path / "b" / "state")).list_cards()
    )
    # Runs carry their host.
    Hosts(db, lease_ttl=30).join("alpha", boot_id="x", version="1")
    store = PgBoardStore(db, HostStamp(host_id="alpha", epoch=1))
    store.set_paused(False)
    store.claim(
        added["id"],
        now=time.time(),
        claimer=ME,
        limits=Limits(max_in_progress=3),
    )
    shown = json.loads(there("kanban", "show", added["id"], "--json").stdout)
    assert [run["host"] for run in shown["runs"]] == ["alpha"]
    hosts = there("hosts")
    assert hosts.returncode == 0, hosts.stderr
    header, row = hosts.stdout.splitlines()[:2]
    assert header.split()[:3] == ["HOST", "BOOT", "ID"] and "VERSION" in header
    assert row.split()[0] == "alpha" and " live " in row


def test_bad_urls_are_one_line(
    pg_url: str, tmp_path: Path, postgres_server: PostgresServer
) -> None:
    cli = Cli(tmp_path, pg_url)
    cli.env["DISPATCH_DATABASE_URL"] = "postgresql://nobody:topsecret@127.0.0.1:1/x"
    line = _one_line_error(cli("kanban", "list"), 1)
    assert "Connection refused" in line and "topsecret" not in line
    cli.env["DISPATCH_DATABASE_URL"] = postgres_server.url("no_such_db")
    line = _one_line_error(cli("kanban", "list"), 2)
    assert 'database "no_such_db" does not exist' in line
    cli.env["DISPATCH_DATABASE_URL"] = "mysql://root:topsecret@h/db"
    line = _one_line_error(cli("kanban", "list"), 2)
    assert "postgresql://" in line and "topsecret" not in line


@pytest.fixture(scope="module")
def password_role(postgres_server: PostgresServer) -> str:
    """A role that must log in with a password (scram), on the session's server."""
    with ClusterDB(postgres_server.url(), pooled=False) as admin, admin.write(None) as conn:
        conn.execute(
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pwuser') THEN"
            f" CREATE ROLE pwuser LOGIN SUPERUSER PASSWORD '{SECRET}'; END IF; END $$"
        )
    hba = postgres_server.data / "pg_hba.conf"
    text = hba.read_text()
    if "pwuser" not in text:
        hba.write_text("host all pwuser 127.0.0.1/32 scram-sha-256\n" + text)
        postgres_server.pg_ctl("reload")
        time.sleep(0.5)  # the postmaster rereads pg_hba.conf asynchronously
    return "pwuser"


def test_passwords_come_from_a_private_file_and_are_never_shown(
    pg_url: str, tmp_path: Path, password_role: str
) -> None:
    cli = Cli(tmp_path, pg_url)
    cli.env["DISPATCH_DATABASE_URL"] = pg_url.replace("postgres@", f"{password_role}@")
    secret = tmp_path / "pw"
    secret.write_text("wrong-one\n")
    secret.chmod(0o600)
    cli.config.write_text(
        f"cluster:\n  host_id: alpha\n  password_file: {secret}\n"
        "kanban:\n  assignees:\n    w:\n      command: [sh, -c, 'echo hi']\n"
    )
    line = _one_line_error(cli("kanban", "list"), 2)
    assert "password authentication failed" in line and "wrong-one" not in line
    secret.write_text(SECRET + "\n")
    ok = cli("kanban", "list")
    assert ok.returncode == 0, ok.stderr
    shown = cli("config", "show")
    assert SECRET not in shown.stdout + shown.stderr
    secret.chmod(0o644)
    line = _one_line_error(cli("kanban", "list"), 2)
    assert "chmod 600" in line


def test_a_newer_schema_is_refused_and_nothing_written(
    db: ClusterDB, pg_url: str, tmp_path: Path
) -> None:
    with db.write(None) as conn:
        conn.execute(
            "INSERT INTO dispatch_schema (version, note) VALUES (?, 'future')",
            (tables.VERSION + 1,),
        )
    cli = Cli(tmp_path, pg_url)
    line = _one_line_error(cli("kanban", "add", "x", "--assignee", "w"), 1)
    assert "newer" in line and "upgrade dispatch" in line
    with db.read() as conn:
        assert conn.execute("SELECT count(*) FROM kanban_cards").fetchone()[0] == 0
        assert (
            conn.execute("SELECT count(*) FROM dispatch_schema").fetchone()[0]
            == len(tables.MIGRATIONS) + 1
        )


def test_serve_refuses_a_live_host_id_of_another_machine(
    db: ClusterDB, pg_url: str, tmp_path: Path
) -> None:
    hosts = Hosts(db, lease_ttl=30)
    hosts.join("alpha", boot_id="the-other-machine", version="1")
    before = hosts.row("alpha")
    cli = Cli(tmp_path, pg_url)
    line = _one_line_error(cli("serve"), 2)
    assert "the-other-machine" in line and "cluster.host_id" in line
    after = hosts.row("alpha")
    assert after is not None and before is not None
    assert (after.boot_id, after.epoch) == (before.boot_id, before.epoch)


def test_state_migrate(pg_url: str, tmp_path: Path, postgres_server: PostgresServer) -> None:
    cli = Cli(tmp_path, pg_url)
    alone = dict(cli.env)
    del alone["DISPATCH_DATABASE_URL"]
    for title in ("one", "two"):
        run_dispatch(cli.config, cli.state, alone, "kanban", "add", title, "--assignee", "w")
    run_dispatch(cli.config, cli.state, alone, "kanban", "pause")
    target = postgres_server.url(postgres_server.create_database())
    moved = run_dispatch(
        cli.config, cli.state, alone, "state", "migrate", "--to", target, "--json", check=False
    )
    assert moved.returncode == 0, moved.stderr
    doc = json.loads(moved.stdout)
    assert doc["counts"]["kanban_cards"] == 2 and doc["kanban_paused"] is True
    with ClusterDB(target) as db:
        assert {c.title for c in PgBoardStore(db).list_cards()} == {"one", "two"}
    again = run_dispatch(
        cli.config, cli.state, alone, "state", "migrate", "--to", target, check=False
    )
    assert "already has rows" in _one_line_error(again, 1)
    # Work in flight stays: an open run refuses the copy.
    with open_state(cli.state) as local:
        board = SqliteBoardStore(local)
        board.set_paused(False)
        card = board.list_cards()[0]
        board.claim(
            card.id,
            now=1.0,
            claimer=ME,
            limits=Limits(max_in_progress=2),
        )
    fresh = postgres_server.url(postgres_server.create_database())
    busy = run_dispatch(
        cli.config, cli.state, alone, "state", "migrate", "--to", fresh, check=False
    )
    assert "still open" in _one_line_error(busy, 1)
    with ClusterDB(fresh) as db, db.read() as conn:
        assert conn.execute("SELECT to_regclass('kanban_cards')").fetchone()[0] is None


def test_status_and_doctor_show_the_cluster(db: ClusterDB, pg_url: str, tmp_path: Path) -> None:
    Hosts(db, lease_ttl=30).join("alpha", boot_id="x", version="1")
    cli = Cli(tmp_path, pg_url)
    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert "cluster:    postgresql://postgres@127.0.0.1" in status.stdout
    assert "lease:      live (epoch 1" in status.stdout
    doc = json.loads(cli("status", "--json").stdout)
    assert doc["cluster"]["host_id"] == "alpha" and doc["cluster"]["state"] == "live"
    report = json.loads(cli("doctor", "--json").stdout)
    cluster = report["cluster"]
    assert cluster["ok"] is True and cluster["lease"] == "live"
    assert cluster["schema_version"] == tables.VERSION and abs(cluster["skew"]) < 1
