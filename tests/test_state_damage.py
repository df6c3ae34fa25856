"""A damaged state.db is named, not fatal: one line naming the file, what is wrong and the way
out (exit 1) from every command; `dispatch state check|backup|restore`; serve keeps its workers
when the database goes bad under it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from dispatcher.app.database import components, open_state
from dispatcher.gateway.lock import ServeLock
from registry.store.backup import integrity
from tests.support.wait import wait_for
from tests.test_gateway_serve import Serve

ROOT = Path(__file__).resolve().parent.parent

CONFIG = """
kanban:
  assignees:
    quick:
      command: [sh, -c, 'echo hi']
cron:
  jobs:
    - id: nightly
      schedule: "0 3 * * *"
      command: [sh, -c, 'echo nightly']
"""

# Commands a user runs; each must fail in one line or work, never show a traceback.
COMMANDS: list[list[str]] = [
    ["ps"],
    ["ps", "--all", "--json"],
    ["status"],
    ["kanban", "list"],
    ["kanban", "add", "title", "--assignee", "quick"],
    ["kanban", "tick"],
    ["cron", "list"],
    ["cron", "pause", "nightly"],
    ["events"],
    ["run", "--", "true"],
    ["serve"],
]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "config.yaml").write_text(CONFIG)
    return tmp_path


def dispatch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("DISPATCH_CONFIG", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher.cli.main",
            "--config",
            str(home / "config.yaml"),
            "--state-dir",
            str(home / "state"),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def populated(home: Path) -> Path:
    """A state dir with a card, a finished session and a cron pause; everything checkpointed
    into the main file (so damage to it is damage to the data)."""
    for args in (
        ["kanban", "add", "a card", "--assignee", "quick"],
        ["run", "--wait", "--", "true"],
    ):
        done = dispatch(home, *args)
        assert done.returncode == 0, done.stderr
    db = home / "state" / "state.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db


def truncate(db: Path) -> None:
    os.truncate(db, db.stat().st_size // 3)


def overwrite_root_pages(db: Path) -> None:
    """Random bytes over the root page of every table (page 1, the header, stays)."""
    with sqlite3.connect(db) as conn:
        roots = [r[0] for r in conn.execute("SELECT rootpage FROM sqlite_schema WHERE rootpage>1")]
    with open(db, "r+b") as f:
        for page in roots:
            f.seek((page - 1) * 4096)
            f.write(os.urandom(4096))


def foreign_file(db: Path) -> None:
    db.write_bytes(b"%PDF-1.7\n" + os.urandom(20000))
    for side in ("-wal", "-shm"):
        Path(f"{db}{side}").unlink(missing_ok=True)


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": truncate,
    "random pages": overwrite_root_pages,
    "foreign file": foreign_file,
}


def assert_named(done: subprocess.CompletedProcess[str], db: Path) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, (done.returncode, done.stderr)
    line = lines[0]
    assert str(db) in line and ("damaged" in line or "not a database" in line), line
    assert "dispatch state restore" in line and "mv " in line, line


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_every_command_names_the_damage(kind: str, home: Path) -> None:
    db = populated(home)
    DAMAGE[kind](db)
    damaged = db.read_bytes()
    for args in COMMANDS:
        assert_named(dispatch(home, *args), db)
    check = dispatch(home, "state", "check")
    assert check.returncode == 1 and "damaged" in check.stdout
    assert db.read_bytes() == damaged  # nothing wrote into (or "repaired") the damaged file


def test_check_backup_restore_round_trip(home: Path) -> None:
    db = populated(home)
    assert dispatch(home, "state", "check").returncode == 0
    backup = home / "backup.db"
    made = dispatch(home, "state", "backup", str(backup), "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["ok"] is True
    assert backup.stat().st_mode & 0o777 == 0o600
    assert dispatch(home, "state", "backup", str(backup)).returncode == 2  # never overwritten
    overwrite_root_pages(db)
    assert_named(dispatch(home, "kanban", "list"), db)
    restored = dispatch(home, "state", "restore", str(backup))
    assert restored.returncode == 0, restored.stderr
    aside = list(db.parent.glob("state.db.replaced-*"))
    assert len(aside) == 1 and "kept as" in restored.stdout
    listed = dispatch(home, "kanban", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["title"] == "a card"
    assert dispatch(home, "state", "check").returncode == 0


def test_restore_refuses_damaged_newer_or_while_serve_runs(home: Path) -> None:
    db = populated(home)
    backup = home / "backup.db"
    assert dispatch(home, "state", "backup", str(backup)).returncode == 0
    before = db.read_bytes()
    lock = ServeLock(home / "state")
    lock.acquire()
    try:
        refused = dispatch(home, "state", "restore", str(backup))
    finally:
        lock.release()
    assert refused.returncode == 1 and "stop it first" in refused.stderr
    newer = home / "newer.db"
    assert dispatch(home, "state", "backup", str(newer)).returncode == 0
    with sqlite3.connect(newer) as conn:
        conn.execute("UPDATE schema_versions SET version = 99 WHERE component = 'kanban'")
    refused = dispatch(home, "state", "restore", str(newer))
    assert refused.returncode == 1 and "newer dispatch" in refused.stderr
    broken = home / "broken.db"
    broken.write_bytes(backup.read_bytes()[:8192])
    refused = dispatch(home, "state", "restore", str(broken))
    assert refused.returncode == 1 and "not usable" in refused.stderr
    assert db.read_bytes() == before
    assert not list(db.parent.glob("state.db.replaced-*"))


def test_backup_is_consistent_while_others_write(home: Path) -> None:
    populated(home)
    stop = threading.Event()
    written: list[int] = []

    def writer() -> None:
        with open_state(home / "state") as db:
            n = 0
            while not stop.is_set():
                with db.write() as conn:
                    conn.execute(
                        "INSERT INTO kanban_meta (key, value) VALUES (?, ?)"
                        " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        ("storm", str(n)),
                    )
                n += 1
                written.append(n)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_for(lambda: len(written) > 20, 10, what="writes under way")
        copies = []
        for i in range(3):
            target = home / f"copy{i}.db"
            done = dispatch(home, "state", "backup", str(target))
            assert done.returncode == 0, done.stderr
            copies.append(target)
    finally:
        stop.set()
        thread.join(10)
    for copy in copies:
        checked = integrity(copy)
        assert checked.ok, checked.problems
        assert checked.versions == {c.name: c.latest for c in components()}


def test_serve_keeps_workers_when_the_database_goes_bad(tmp_path: Path) -> None:
    serve = Serve(tmp_path)
    serve.start()
    try:
        card = json.loads(
            serve.dispatch("kanban", "add", "g", "--assignee", "gated", "--json").stdout
        )
        wait_for(lambda: serve.card(card["id"])["status"] == "running", 20, what="card running")
        db = serve.state / "state.db"
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        overwrite_root_pages(db)
        with sqlite3.connect(db) as conn:  # another writer: serve's page cache is stale now
            conn.execute("PRAGMA user_version = 1")
        status = serve.wait_message("damaged", timeout=20)
        assert "workers keep running" in status
        assert serve.proc is not None and serve.proc.poll() is None
        status = serve.dispatch("status", check=False)
        assert status.returncode == 1 and f"running, pid {serve.proc.pid}" in status.stdout
        assert_named(status, db)
        started = (tmp_path / "state" / "sessions").iterdir()
        (session,) = list(started)
        assert not (session / "exit.json").exists()  # the worker still runs
        serve.release.touch()
        wait_for((session / "exit.json").exists, 20, what="worker finished on release")
        assert serve.proc.poll() is None
    finally:
        serve.stop()
    log = serve.log()
    # Once per component that meets it (the dispatcher, the registry follower, the cron stop,
    # the final bookkeeping), plus a repeat where a read happened to succeed in between; a
    # line per poll would be dozens.
    assert log.count("damaged (database disk image is malformed); check it") <= 6, log
    assert "Traceback" not in log


def test_only_damage_full_and_lock_errors_are_translated(tmp_path: Path) -> None:
    """Constraint violations and SQL errors reach their caller as sqlite3 errors (a store may
    rely on them); only what means damage, a full disk or a lock becomes ours."""
    with open_state(tmp_path / "state") as db:
        with pytest.raises(sqlite3.IntegrityError), db.write() as conn:
            conn.execute("INSERT INTO kanban_meta (key, value) VALUES ('paused', 1)")
        with pytest.raises(sqlite3.OperationalError, match="malformed JSON"), db.read() as conn:
            conn.execute("SELECT json('{bad')").fetchone()
        with db.read() as conn:  # the connection is usable afterwards
            assert conn.execute("SELECT COUNT(*) FROM kanban_meta").fetchone()[0] >= 2
