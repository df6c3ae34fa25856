"""The state database: one SQLite file (WAL) under the state dir, shared by every package.

Each package describes its tables as a :class:`Component`: a name and an ordered list of
forward :class:`Migration` steps. :class:`StateDB` applies the missing steps of every component
it is opened with, inside one write transaction, so an older database upgrades on open and two
processes opening it at once cannot both migrate. A database whose recorded version of a
component is newer than the code's is refused (downgrades are not supported; the data stays
untouched).

Concurrency: several ``dispatch`` processes share the file. Writers take the lock up front
(``BEGIN IMMEDIATE``) and wait up to ``busy_timeout`` for it (retrying the few busy answers
SQLite gives without calling its busy handler), so nobody sees "database is locked" under normal
contention. Within a process one connection is shared behind a lock.

Damage is named, not fatal: SQLite's "file is not a database", "database disk image is
malformed" and "database or disk is full" become :class:`StateDamaged` and :class:`StateFull`
(one line naming the file and the way out) at this one boundary; nothing above sees sqlite3's
exceptions for them. The state dir and what the program trusts from it must be ours and not
writable by anyone else (:func:`ensure_private_dir`, :class:`UnsafeStatePath`), like ssh's
strict modes.

Errors (joining :class:`registry.errors.StateError`)::

    StateError
    ├── StateDamaged       the file is not a database or is malformed (restore or move aside)
    ├── StateFull          no space left for a write (resumes by itself once space returns)
    ├── StateDirUnusable   the state dir cannot be created or written, or is not a directory
    └── UnsafeStatePath    a state path is owned by someone else, group/other-writable or a
                           symlink where none may be

Every one of them exits 1, whichever command meets it (the state dir is not an argument
error: the same path works for another user or on another mount).

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

_DAMAGED_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_FULL_CODES = frozenset({sqlite3.SQLITE_FULL})
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_WORDING = (
    ("database disk image is malformed", sqlite3.SQLITE_CORRUPT),
    ("file is not a database", sqlite3.SQLITE_NOTADB),
    ("database or disk is full", sqlite3.SQLITE_FULL),
    ("database is locked", sqlite3.SQLITE_BUSY),
)


class StateDamaged(StateError):
    """The state database file is damaged or not a database at all (exit 1)."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            f"damaged ({detail})",
            path=path,
            detail=detail,
            remedy=(
                f"check it with 'dispatch state check', restore a backup with 'dispatch state "
                f"restore BACKUP', or move it aside ('mv {path} {path}.damaged') to start empty"
            ),
        )


class StateFull(StateError):
    """A write found no space left on the state dir's file system (exit 1); nothing stored
    is lost and writes succeed again by themselves once space returns."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            f"no space left to write ({detail})",
            path=path,
            detail=detail,
            remedy="free space on its file system; stored state is intact and writes resume",
        )

    restart_helps = True  # space may come back by itself (a cleanup job, a rotated log)


class StateDirUnusable(StateError):
    """The state dir (or a directory in it) cannot be created or written, or is not a
    directory (exit 1; nothing is run)."""

    def __init__(self, path: str, problem: str, remedy: str) -> None:
        super().__init__(problem, path=path, remedy=remedy)

    def describe(self) -> str:
        return f"state dir {self.fields['path']} {self.fields['problem']}"

    @classmethod
    def not_a_directory(cls, path: Path | str) -> StateDirUnusable:
        """The path names a file (or something below a file)."""
        return cls(str(path), "is not a directory", "pass --state-dir with a directory path")

    @classmethod
    def from_os_error(cls, path: Path | str, err: OSError, doing: str) -> StateDirUnusable:
        """The error for ``err``, met while ``doing`` (``"cannot be created"``, ...)."""
        if isinstance(err, FileExistsError | NotADirectoryError):
            return cls.not_a_directory(path)
        reason = err.strerror or type(err).__name__
        if err.filename is not None and str(err.filename) != str(path):
            reason = f"{reason}: {err.filename}"
        return cls(
            str(path),
            f"{doing} ({reason})",
            "pass --state-dir with a directory this user can write, or run as its owner",
        )


class UnsafeStatePath(StateError):
    """A path under the state dir that the program executes or trusts is not private to the
    running user (exit 1; nothing is run)."""

    def __init__(self, path: str, problem: str, remedy: str) -> None:
        super().__init__(problem, path=path, remedy=remedy)

    def describe(self) -> str:
        return f"unsafe state path {self.fields['path']}: {self.fields['problem']}"


def translate(err: sqlite3.Error, path: Path | str) -> StateError | None:
    """Our error for a sqlite3 error that means damage, a full disk or a lock that outlasted
    the busy timeout; None for anything else (constraint violations stay with their caller)."""
    code = getattr(err, "sqlite_errorcode", None)
    text = str(err)
    if isinstance(code, int):
        primary = code & 0xFF
    else:  # an error raised by the sqlite3 module itself carries no code: SQLite's wording
        primary = next((c for words, c in _WORDING if words in text), sqlite3.SQLITE_ERROR)
    if primary in _DAMAGED_CODES:
        return StateDamaged(str(path), text)
    if primary in _FULL_CODES:
        return StateFull(str(path), text)
    if primary in _BUSY_CODES:
        return StateError(
            f"stayed locked ({text})", path=str(path), remedy="another process holds it; retry"
        )
    return None


def _is_busy(err: sqlite3.Error) -> bool:
    code = getattr(err, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _BUSY_CODES
    return "locked" in str(err) or "busy" in str(err)


SPACE_RESERVE = 4 * 1024 * 1024
"""Bytes that must stay free on the state dir's file system before new work is claimed: a
claim, its session directory and the first output need a little room, and a database write
that meets a full disk fails instead of landing half-done."""


def space_problem(state_dir: Path, reserve: int = SPACE_RESERVE) -> str | None:
    """Why no new work should be claimed for lack of space on ``state_dir``, or None."""
    try:
        info = os.statvfs(state_dir)
    except OSError:
        return None  # unknown: let the write itself report what is wrong
    free = info.f_bavail * info.f_frsize
    if free >= reserve:
        return None
    return (
        f"the state dir {state_dir} is nearly full ({free // 1024} KiB free, "
        f"{reserve // 1024} KiB needed): no new claims until space returns; running "
        "workers keep running"
    )


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


def ensure_private_dir(path: Path, *, allow_symlink: bool = True) -> Path:
    """Create ``path`` (and parents) with mode 0700 and check that it is private.

    An existing directory must be owned by the running user and not writable by group or
    others (then refused with :class:`UnsafeStatePath`: another user could plant files the
    program trusts); one that is merely readable by others is tightened to 0700. With
    ``allow_symlink=False`` the last component must not be a symlink (a cache of code).

    Called at every spawn for the directories a spawn writes in, so an existing directory
    costs one ``lstat`` (a symlink one more ``stat``); only a missing one is created."""
    path = Path(path)
    try:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            if not allow_symlink:
                raise UnsafeStatePath(
                    str(path),
                    "is a symlink",
                    remedy=f"remove the link ('rm {path}'); dispatch recreates the directory",
                )
            info = path.stat()
    except OSError as err:
        raise StateDirUnusable.from_os_error(path, err, "cannot be created") from None
    if not stat.S_ISDIR(info.st_mode):
        raise StateDirUnusable.not_a_directory(path)
    check_private(path, info)
    if stat.S_IMODE(info.st_mode) & 0o077:
        try:
            os.chmod(path, 0o700)
        except OSError as err:
            raise StateDirUnusable.from_os_error(path, err, "cannot be made private") from None
    return path


def check_private(path: Path, info: os.stat_result | None = None) -> None:
    """Refuse ``path`` unless the running user owns it and group/others cannot write it."""
    info = path.lstat() if info is None else info
    uid = os.getuid()
    if info.st_uid != uid:
        raise UnsafeStatePath(
            str(path),
            f"owned by {_user_name(info.st_uid)}, not by the running user {_user_name(uid)}",
            # The command must paste as it is: a name (or the bare uid), nothing around it.
            remedy=f"use a state dir you own (--state-dir), or 'chown -R {_owner_word(uid)} "
            f"{path}' if its content is trusted",
        )
    if stat.S_IMODE(info.st_mode) & 0o022:
        mode = stat.S_IMODE(info.st_mode)
        fix = "700" if stat.S_ISDIR(info.st_mode) else "600"
        raise UnsafeStatePath(
            str(path),
            f"writable by group or others (mode {mode:04o})",
            remedy=f"'chmod {fix} {path}' once you have checked its content",
        )


def _owner_word(uid: int) -> str:
    """What ``chown`` takes for ``uid``: the user's name, or the number without one."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _user_name(uid: int) -> str:
    name = _owner_word(uid)
    return f"uid {uid}" if name == str(uid) else f"{name} (uid {uid})"


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
            # -wal and -shm files the same mode as the database file. An existing file is
            # never opened here: closing any descriptor of the file would drop every POSIX
            # lock this process holds on it, so another connection of this process (dispatch
            # web's long-lived reader) would lose its locks and another process could
            # checkpoint and truncate the WAL under it, which corrupts the database.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.close(fd)
        except FileExistsError:
            if not os.access(self.path, os.R_OK | os.W_OK):
                raise StateError(
                    "cannot open: Permission denied",
                    path=str(self.path),
                    remedy="check the --state-dir permissions",
                ) from None
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
            if "malformed" in str(err) or "not a database" in str(err):
                raise StateDamaged(str(self.path), str(err)) from None
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
            raise translate(err, self.path) or StateDamaged(str(self.path), str(err)) from None
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
        """One write transaction (``BEGIN IMMEDIATE``): committed on success, else rolled back.

        Damage and a full disk raise :class:`StateDamaged` / :class:`StateFull`; the
        transaction is rolled back, so what was stored before stays as it was."""
        with self._lock:
            self._begin("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except sqlite3.Error as err:
                self._rollback()
                raise translate(err, self.path) or err from None
            except BaseException:
                self._rollback()
                raise

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A consistent read snapshot (a deferred transaction)."""
        with self._lock:
            self._begin("BEGIN")
            try:
                yield self._conn
            except sqlite3.Error as err:
                self._rollback()
                raise translate(err, self.path) or err from None
            except BaseException:
                self._rollback()
                raise
            else:
                self._conn.execute("COMMIT")

    def _begin(self, statement: str) -> None:
        """Start a transaction, retrying busy answers until the busy timeout.

        SQLite calls its busy handler for most waits but answers some at once (a WAL being
        recovered or restarted by another connection); those are retried here with a short,
        growing pause, so contention never reaches the user as "database is locked"."""
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.001
        while True:
            try:
                self._conn.execute(statement)
                return
            except sqlite3.Error as err:
                if _is_busy(err) and time.monotonic() < deadline:
                    time.sleep(delay)  # bounded back-off: another process holds the lock
                    delay = min(delay * 2, 0.05)
                    continue
                translated = translate(err, self.path)
                if translated is not None and not _is_busy(err):
                    raise translated from None
                raise StateError(
                    f"cannot start a transaction ({err})",
                    path=str(self.path),
                    remedy="another process holds the database; retry",
                ) from None

    def _rollback(self) -> None:
        # A damaged or full database may refuse the rollback too; SQLite has then already
        # rolled the transaction back itself.
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

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
