"""The state database: one SQLite file (WAL) under the state dir, shared by every package.

Each package describes its tables as a :class:`Component`: a name and an ordered list of
forward :class:`Migration` steps. :class:`StateDB` applies the missing steps of every component
it is opened with, inside one write transaction, so an older database upgrades on open and two
processes opening it at once cannot both migrate. A database whose recorded version of a
component is newer than the code's is refused (downgrades are not supported; the data stays
untouched).

Concurrency: several ``dispatch`` processes share the file. Writers take the lock up front
(``BEGIN IMMEDIATE``) and wait up to ``busy_timeout`` for it, so nobody sees "database is
locked" under normal contention. Within a process one connection is shared behind a lock.

The registry owns this module because it is the lowest package that stores anything; it knows
nothing about the tables other packages register.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from registry.errors import StateError

FORMAT_VERSION = 1
"""Version of the bookkeeping itself (``PRAGMA user_version``)."""

DB_NAME = "state.db"


@dataclass(frozen=True, kw_only=True)
class Migration:
    """One forward step of a component's schema: SQL text or a function of the connection."""

    version: int
    apply: str | Callable[[sqlite3.Connection], None]
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Component:
    """A package's tables: versions must be 1, 2, 3 ... in order."""

    name: str
    migrations: Sequence[Migration]

    def __post_init__(self) -> None:
        versions = [m.version for m in self.migrations]
        if versions != list(range(1, len(versions) + 1)):
            raise ValueError(f"component {self.name}: migration versions must be 1..N in order")

    @property
    def latest(self) -> int:
        """The version this code brings the component to."""
        return len(self.migrations)


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) with mode 0700; tighten it when it is ours and looser."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise StateError("not a directory", path=str(path))
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


class StateDB:
    """A connection to the state database with migrations applied.

    Use :meth:`write` for changes (one immediate transaction) and :meth:`read` for queries.
    Thread-safe; not fork-safe (open a new one in a child).
    """

    def __init__(
        self,
        path: Path,
        components: Sequence[Component],
        *,
        busy_timeout: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.components = tuple(components)
        self.busy_timeout = busy_timeout
        self._lock = threading.RLock()
        self._conn = self._connect()
        try:
            self._migrate()
        except BaseException:
            self._conn.close()
            raise

    @classmethod
    def in_dir(cls, state_dir: Path, components: Sequence[Component], **kwargs: float) -> StateDB:
        """Open ``state_dir/state.db``, creating the directory (0700) when needed."""
        ensure_private_dir(Path(state_dir))
        return cls(Path(state_dir) / DB_NAME, components, **kwargs)

    # -- opening -----------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            # Create the file ourselves so it is 0600 from the first byte; SQLite gives the
            # -wal and -shm files the same mode as the database file.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            os.close(fd)
        except OSError as err:
            raise StateError(
                f"cannot open: {err.strerror}",
                path=str(self.path),
                remedy="check the --state-dir permissions",
            ) from None
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            mode = self._enable_wal(conn)
            if str(mode).lower() != "wal":
                raise StateError(f"cannot switch to WAL mode (got {mode})", path=str(self.path))
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.OperationalError as err:
            conn.close()
            if "locked" in str(err) or "busy" in str(err):
                raise StateError(
                    f"stayed locked for {self.busy_timeout:g} s while opening",
                    path=str(self.path),
                    remedy="another process holds it; retry",
                ) from None
            raise StateError(
                f"cannot be opened ({err})",
                path=str(self.path),
                remedy="check the file and --state-dir permissions",
            ) from None
        except sqlite3.DatabaseError as err:
            conn.close()
            raise StateError(
                f"not a usable SQLite database ({err})",
                path=str(self.path),
                remedy="move the file away or use another --state-dir",
            ) from None
        conn.row_factory = sqlite3.Row
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> str:
        """Switch to WAL (persistent in the file), tolerating racing first openers.

        Changing the journal mode needs an exclusive lock and SQLite may answer "database is
        locked" at once instead of calling the busy handler while another process is opening
        the same new file; retry within the busy timeout."""
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.001
        while True:
            try:
                mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
                if mode.lower() == "wal":
                    return mode
                return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) and "busy" not in str(err):
                    raise
                if time.monotonic() >= deadline:
                    raise
                # Bounded back-off while another opener finishes its switch.
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def _migrate(self) -> None:
        with self.write() as conn:
            user_version = conn.execute("PRAGMA user_version").fetchone()[0]
            if user_version > FORMAT_VERSION:
                raise StateError(
                    f"written by a newer version of dispatch (format {user_version}, this code "
                    f"knows {FORMAT_VERSION})",
                    path=str(self.path),
                    remedy="upgrade dispatch or use another --state-dir",
                )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_versions ("
                " component TEXT PRIMARY KEY, version INTEGER NOT NULL,"
                " updated_at REAL NOT NULL)"
            )
            if user_version < FORMAT_VERSION:
                conn.execute(f"PRAGMA user_version = {FORMAT_VERSION}")
            for component in self.components:
                row = conn.execute(
                    "SELECT version FROM schema_versions WHERE component = ?", (component.name,)
                ).fetchone()
                current = row[0] if row else 0
                if current > component.latest:
                    raise StateError(
                        f"written by a newer version of dispatch ({component.name} schema "
                        f"v{current}, this code knows v{component.latest})",
                        path=str(self.path),
                        remedy="upgrade dispatch or use another --state-dir",
                    )
                for migration in component.migrations[current:]:
                    if isinstance(migration.apply, str):
                        for statement in _split_sql(migration.apply):
                            conn.execute(statement)
                    else:
                        migration.apply(conn)
                if component.latest > current:
                    conn.execute(
                        "INSERT INTO schema_versions (component, version, updated_at)"
                        " VALUES (?, ?, ?) ON CONFLICT(component) DO UPDATE SET"
                        " version = excluded.version, updated_at = excluded.updated_at",
                        (component.name, component.latest, time.time()),
                    )

    # -- use ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``): committed on success, else rolled back."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as err:
                raise StateError(
                    f"cannot start a write ({err})",
                    path=str(self.path),
                    remedy="another process holds the database; retry",
                ) from None
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            else:
                self._conn.execute("COMMIT")

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A consistent read snapshot (a deferred transaction)."""
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                self._conn.execute("COMMIT")

    def versions(self) -> dict[str, int]:
        """Recorded schema version of every component in the file."""
        with self.read() as conn:
            rows = conn.execute("SELECT component, version FROM schema_versions").fetchall()
        return {row[0]: row[1] for row in rows}

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> StateDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (``;``-terminated, as sqlite3 judges)."""
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements
