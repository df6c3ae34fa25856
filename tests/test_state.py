"""The state database: WAL, 0600, migrations, refusal of newer files, concurrent writers."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from registry.errors import StateError
from registry.store.database import Component, Migration, StateDB

V1 = Component(
    name="demo",
    migrations=[Migration(version=1, apply="CREATE TABLE items (id TEXT PRIMARY KEY, n INT);")],
)
V2 = Component(
    name="demo",
    migrations=[
        *V1.migrations,
        Migration(
            version=2,
            apply="ALTER TABLE items ADD COLUMN note TEXT DEFAULT 'x';\n"
            "CREATE INDEX items_n ON items (n);",
        ),
    ],
)


def test_new_database_is_wal_and_private(tmp_path: Path) -> None:
    with StateDB.in_dir(tmp_path / "state", [V1]) as db:
        with db.write() as conn:
            conn.execute("INSERT INTO items VALUES ('a', 1)")
        with db.read() as conn:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"
        assert db.versions() == {"demo": 1}
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        path = tmp_path / "state" / name
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, name


def test_loose_state_dir_is_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    StateDB.in_dir(state, [V1]).close()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


def test_older_database_upgrades_on_open_and_keeps_data(tmp_path: Path) -> None:
    with StateDB(tmp_path / "s.db", [V1]) as db, db.write() as conn:
        conn.execute("INSERT INTO items VALUES ('a', 1)")
    with StateDB(tmp_path / "s.db", [V2]) as db:
        assert db.versions() == {"demo": 2}
        with db.read() as conn:
            row = conn.execute("SELECT id, n, note FROM items").fetchone()
        assert tuple(row) == ("a", 1, "x")


def test_newer_database_is_refused_untouched(tmp_path: Path) -> None:
    with StateDB(tmp_path / "s.db", [V2]) as db, db.write() as conn:
        conn.execute("INSERT INTO items VALUES ('a', 1, 'kept')")
    before = (tmp_path / "s.db").read_bytes()
    with pytest.raises(StateError) as info:
        StateDB(tmp_path / "s.db", [V1])
    assert "newer version" in info.value.message
    assert "demo schema v2" in info.value.message
    assert "upgrade dispatch" in info.value.message
    with StateDB(tmp_path / "s.db", [V2]) as db, db.read() as conn:
        assert conn.execute("SELECT note FROM items").fetchone()[0] == "kept"
    assert len(before) > 0


def test_failed_migration_changes_nothing(tmp_path: Path) -> None:
    broken = Component(
        name="demo",
        migrations=[*V1.migrations, Migration(version=2, apply="ALTER TABLE nope ADD x INT;")],
    )
    StateDB(tmp_path / "s.db", [V1]).close()
    with pytest.raises(sqlite3.OperationalError):
        StateDB(tmp_path / "s.db", [broken])
    with StateDB(tmp_path / "s.db", [V1]) as db:
        assert db.versions() == {"demo": 1}


def test_garbage_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "s.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StateError, match=r"damaged \(file is not a database\).*state restore"):
        StateDB(tmp_path / "s.db", [V1])


def test_components_migrate_independently(tmp_path: Path) -> None:
    other = Component(name="other", migrations=[Migration(version=1, apply="CREATE TABLE o (x);")])
    StateDB(tmp_path / "s.db", [V1]).close()
    with StateDB(tmp_path / "s.db", [V1, other]) as db:
        assert db.versions() == {"demo": 1, "other": 1}
    # Code that knows only one component leaves the other alone.
    with StateDB(tmp_path / "s.db", [V1]) as db:
        assert db.versions() == {"demo": 1, "other": 1}


def test_migration_versions_must_be_contiguous() -> None:
    with pytest.raises(ValueError):
        Component(name="x", migrations=[Migration(version=2, apply="")])


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from registry.store.database import Component, Migration, StateDB
    comp = Component(name="demo", migrations=[Migration(version=1,
        apply="CREATE TABLE items (id TEXT PRIMARY KEY, n INT);")])
    db = StateDB(Path(sys.argv[1]), [comp])
    for i in range(200):
        with db.write() as conn:
            n = conn.execute("SELECT count(*) FROM items").fetchone()[0]
            conn.execute("INSERT INTO items VALUES (?, ?)", (f"{sys.argv[2]}-{i}", n))
    db.close()
    """
)


def test_concurrent_processes_never_see_database_locked(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), f"w{k}"],
            stderr=subprocess.PIPE,
        )
        for k in range(4)
    ]
    errors = []
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            errors.append(err.decode())
    assert not errors, errors
    with StateDB(path, [V1]) as db, db.read() as conn:
        assert conn.execute("SELECT count(*) FROM items").fetchone()[0] == 800


def test_opening_an_existing_database_never_opens_its_file_outside_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Closing any descriptor of a database file drops every POSIX lock the process holds on
    # it: a second connection opened beside a long-lived one (dispatch web's reader) must not
    # do that, or another process may checkpoint and truncate the WAL under the first.
    first = StateDB.in_dir(tmp_path, [V1])
    opened: list[str] = []
    real_open = os.open

    def recording(path: object, *args: object, **kwargs: object) -> int:
        fd = real_open(path, *args, **kwargs)  # type: ignore[arg-type]
        opened.append(os.fspath(path))  # type: ignore[arg-type]  # a descriptor was made
        return fd

    monkeypatch.setattr(os, "open", recording)
    with first.read() as conn:
        conn.execute("SELECT 1").fetchone()
        second = StateDB.in_dir(tmp_path, [V1])
    second.close()
    first.close()
    assert str(tmp_path / "state.db") not in opened
