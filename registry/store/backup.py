"""Checking, copying and putting back the state database (``dispatch state check|backup|restore``).

A backup is taken with SQLite's online backup API, so it is consistent while ``dispatch serve``
and other commands keep writing (WAL readers never block writers). A restore only verifies and
swaps files: the caller must make sure no gateway runs (the serve lock lives in dispatcher/),
and the file it replaces is kept aside, never deleted.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from registry.store.database import DB_NAME, FORMAT_VERSION, Component, StateError, translate
from scope.foundation.errors import UsageError

__all__ = ["Integrity", "backup", "integrity", "restore"]

_SIDE_FILES = ("-wal", "-shm")


@dataclass(frozen=True, kw_only=True)
class Integrity:
    """What ``PRAGMA integrity_check`` (and a look at the bookkeeping) found in one file."""

    path: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    size: int = 0

    def to_dict(self) -> dict[str, object]:
        """The JSON form."""
        return {
            "path": self.path,
            "ok": self.ok,
            "problems": list(self.problems),
            "versions": dict(self.versions),
            "size": self.size,
        }


def integrity(path: Path, *, limit: int = 20) -> Integrity:
    """Run SQLite's integrity check on ``path`` (read-only; never creates or migrates it)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        return Integrity(path=str(path), ok=False, problems=[f"cannot read: {err.strerror}"])
    problems: list[str] = []
    versions: dict[str, int] = {}
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as err:
        return Integrity(path=str(path), ok=False, problems=[str(err)], size=size)
    try:
        rows = conn.execute(f"PRAGMA integrity_check({int(limit)})").fetchall()
        problems = [str(row[0]) for row in rows if str(row[0]) != "ok"]
        if not problems:
            versions, problem = _versions(conn)
            if problem:
                problems.append(problem)
    except sqlite3.Error as err:
        problems.append(str(err))
    finally:
        conn.close()
    return Integrity(
        path=str(path), ok=not problems, problems=problems, versions=versions, size=size
    )


def _versions(conn: sqlite3.Connection) -> tuple[dict[str, int], str | None]:
    """Recorded component versions, or a problem when the file is not a dispatch database."""
    user_version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if user_version > FORMAT_VERSION:
        return {}, f"written by a newer dispatch (format {user_version})"
    try:
        rows = conn.execute("SELECT component, version FROM schema_versions").fetchall()
    except sqlite3.OperationalError:
        return {}, "not a dispatch state database (no schema_versions table)"
    return {str(r[0]): int(r[1]) for r in rows}, None


def backup(db_path: Path, target: Path) -> Integrity:
    """Copy the database at ``db_path`` into ``target`` (a new file, mode 0600), consistently
    while others write; the copy is checked before it is named ``target``."""
    db_path, target = Path(db_path), Path(target)
    if not db_path.exists():
        raise UsageError(f"no state database at {db_path}", remedy="nothing to back up yet")
    if target.exists() or target.is_symlink():
        raise UsageError(
            f"backup file {target} already exists", remedy="name a new file or remove the old one"
        )
    if not target.parent.is_dir():
        raise UsageError(f"no directory {target.parent}", remedy="create it first")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise UsageError(f"cannot write {target}: {err.strerror}") from None
    os.close(fd)
    try:
        _copy(db_path, tmp)
        checked = integrity(tmp)
        if not checked.ok:
            raise StateError(
                f"the copy failed its check ({'; '.join(checked.problems[:3])})",
                path=str(db_path),
                remedy="run 'dispatch state check'",
            )
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return Integrity(
        path=str(target), ok=True, versions=checked.versions, size=target.stat().st_size
    )


def _copy(source: Path, dest: Path) -> None:
    try:
        src = sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True, isolation_level=None)
        try:
            dst = sqlite3.connect(dest, isolation_level=None)
            try:
                src.backup(dst)
                # One self-contained file: no -wal beside the copy.
                dst.execute("PRAGMA journal_mode = DELETE")
            finally:
                dst.close()
        finally:
            src.close()
    except sqlite3.Error as err:
        raise translate(err, source) or StateError(
            f"backup failed ({err})", path=str(source)
        ) from None
    fd = os.open(dest, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def restore(state_dir: Path, source: Path, components: Sequence[Component]) -> Path:
    """Put the backup ``source`` in place as ``state_dir/state.db``; returns where the old file
    went (``state.db.replaced-<time>``, with its -wal/-shm), or the new path when there was none.

    The backup must pass the integrity check and carry no component newer than this code
    knows (older ones migrate on the next open). The caller makes sure no gateway runs."""
    state_dir, source = Path(state_dir), Path(source)
    if not source.is_file():
        raise UsageError(f"no backup file {source}", remedy="name a file made by 'state backup'")
    checked = integrity(source)
    if not checked.ok:
        raise StateError(
            f"the backup is not usable ({'; '.join(checked.problems[:3])})",
            path=str(source),
            remedy="pick another backup",
        )
    known = {c.name: c.latest for c in components}
    for name, version in checked.versions.items():
        if name in known and version > known[name]:
            raise StateError(
                f"the backup was written by a newer dispatch ({name} schema v{version}, this "
                f"code knows v{known[name]})",
                path=str(source),
                remedy="upgrade dispatch first",
            )
    target = state_dir / DB_NAME
    tmp = state_dir / f".{DB_NAME}.restore-{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    try:
        _copy(source, tmp)
        aside = _move_aside(target)
        os.replace(tmp, target)
        _fsync_dir(state_dir)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return aside or target


def _move_aside(target: Path) -> Path | None:
    if not target.exists():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    aside = target.with_name(f"{target.name}.replaced-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = target.with_name(f"{target.name}.replaced-{stamp}-{n}")
    # The -wal may hold committed pages: it moves with its database, never left behind to be
    # replayed into the restored file.
    for suffix in _SIDE_FILES:
        side = target.with_name(target.name + suffix)
        if side.exists():
            os.replace(side, aside.with_name(aside.name + suffix))
    os.replace(target, aside)
    return aside


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
