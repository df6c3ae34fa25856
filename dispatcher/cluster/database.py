"""The cluster database: a small connection pool, transactions, the schema, and its errors.

One :class:`ClusterDB` per process holds a :class:`psycopg_pool.ConnectionPool` of at most four
connections (the issue's budget: workers never connect, a host holds its pool plus one LISTEN
connection). Every connection has TCP keepalives, a TCP user timeout and a statement timeout, so
a half-open socket or a stuck lock surfaces as an error instead of a silent stall, and a pooled
connection is checked before it is handed out, so a server restart costs no failed transaction.

**Locks.** Board writes keep SQLite's single-writer semantics with one transaction-scoped
advisory lock (:data:`BOARD_LOCK`): a board change re-reads what it depends on and writes its
answer with no other board change in between, so every compare-and-set of the board store is
exactly as it is on SQLite. Claims are the one exception (they are most of the write traffic
of a busy cluster): they hold that lock *shared*, so claims of different hosts run side by side
while every other write still excludes them, pick their card with ``FOR UPDATE SKIP LOCKED``
(two claimers never wait for, let alone take, the same card) and take :data:`BUDGET_LOCK` only
for the few statements that count open runs and insert the new one (see
:meth:`dispatcher.cluster.board.PgBoardStore.claim`). Ledger writes take their own lock and rely
on the unique fire key (:mod:`dispatcher.cluster.ledger`).

The URL a user sees never carries a password (:func:`redact`); a password may come from a 0600
file (:func:`password_from_file`). Every psycopg error is translated here, once, into a
:class:`ClusterError` (exit 1: the database cannot be used now), its
:class:`ClusterUnreachable` (exit 1, no connection: the one a restart of ``serve`` may cure) or
:class:`ClusterRefused` (exit 2: the URL, user or password is wrong).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import stat
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from dispatcher.cluster import tables
from dispatcher.cluster.url import check_url, redact
from registry.errors import StateError
from scope.foundation.errors import ConfigError

BOARD_LOCK = 0x64697370_6B616E  # "disp" "kan": the board's advisory lock key
BUDGET_LOCK = 0x64697370_627564  # "disp" "bud": claims count open runs one at a time
SCHEMA_LOCK = 0x64697370_736368  # "disp" "sch": migrations run one at a time
POOL_MAX = 4

# The pool logs every failed reconnection attempt; the gateway names an outage once itself.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

# libpq's own words for a connection the server refused for who we are (not for being down).
_REFUSED = (
    "password authentication failed",
    "no password supplied",
    "does not exist",
    "no pg_hba.conf entry",
    "authentication failed",
    "permission denied",
)


class ClusterError(StateError):
    """The cluster database cannot be reached or used now (exit 1).

    A :class:`~registry.errors.StateError`: the cluster database holds the board and the
    ledger, so whatever keeps a gateway going while its state database is unusable (workers
    keep running, nothing new is claimed, the problem is named once) applies to it too."""

    def __init__(self, problem: str, *, url: str, remedy: str | None = None, **fields: Any):
        super().__init__(problem, path=redact(url), remedy=remedy, url=redact(url), **fields)

    def describe(self) -> str:
        return f"cluster database {self.fields['url']}: {self.fields['problem']}"


class ClusterRefused(ClusterError):
    """The server refused us: wrong URL, user, database or password (exit 2: configuration)."""

    exit_code = 2


class ClusterUnreachable(ClusterError):
    """No connection to the server now: refused, timed out, cut (exit 1; ``serve`` asks for a
    restart at start, since the server may come back)."""

    restart_helps = True


def password_from_file(path: Path) -> str:
    """The first line of a password file that only its owner may read (ssh's rule)."""
    try:
        info = path.stat()
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(
            f"cannot read the password file {path}: {err.strerror}", key="cluster.password_file"
        ) from None
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"password file {path} must be owned by you and mode 0600",
            key="cluster.password_file",
            remedy=f"chmod 600 {path}",
        )
    return text.splitlines()[0] if text else ""


class ClusterDB:
    """A pool of connections to the cluster database (see the module docstring).

    ``connect_timeout`` bounds how long a caller waits for a connection (a server that is down
    costs a caller at most that); ``io_timeout`` how long sent data may stay unacknowledged
    before the connection counts as dead (TCP user timeout). ``pooled=False`` (one CLI
    command) uses one direct connection, opened on first use and shared by the command's
    threads one transaction at a time: no pool threads, and a refused connection is named at
    once instead of after the pool's timeout."""

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        statement_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        io_timeout: float = 20.0,
        max_size: int = POOL_MAX,
        application_name: str = "dispatch",
        pooled: bool = True,
    ) -> None:
        self.url = check_url(url)
        self.application_name = application_name
        """How this process's connections show in ``pg_stat_activity``."""
        self._password = password
        self.options: dict[str, Any] = {
            # libpq reads values below 2 s as 2 s.
            "connect_timeout": max(2, round(connect_timeout)),
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "tcp_user_timeout": int(io_timeout * 1000),
            "application_name": application_name,
        }
        if password is not None:
            self.options["password"] = password
        self._connect_timeout = connect_timeout
        self._session = {
            "autocommit": False,
            "row_factory": named_tuple_rows,
            "options": f"-c statement_timeout={int(statement_timeout * 1000)}",
        }
        self.pool: ConnectionPool[Any] | None = None
        self._direct: psycopg.Connection[Any] | None = None
        self._direct_lock = threading.Lock()
        self._holder: int | None = None
        if pooled:
            self.pool = ConnectionPool(
                url,
                min_size=0,
                max_size=max_size,
                kwargs={**self.options, **self._session},
                open=False,
                name="dispatch",
                check=ConnectionPool.check_connection,
                timeout=connect_timeout,
                # A failed attempt to grow the pool backs off exponentially and blocks new
                # attempts until it gives up: give up soon, so that the first request after
                # an outage connects at once instead of after a long backoff.
                reconnect_timeout=max(1.0, connect_timeout),
            )
            self.pool.open(wait=False)

    def connect(self, **overrides: Any) -> psycopg.Connection[Any]:
        """A connection outside the pool (errors translated as everywhere here)."""
        try:
            return psycopg.connect(self.url, **{**self.options, **overrides})
        except psycopg.Error as err:
            raise self.translate(err) from None

    def check(self) -> None:
        """Connect once, directly, so a wrong URL, user or password is named now in one line
        (the pool would only time out) and an unreachable server within ``connect_timeout``."""
        self.connect(autocommit=True).close()

    def translate(self, err: BaseException) -> ClusterError:
        """The one translation of a psycopg error (no password in it, ever)."""
        text = _first_line(err)
        if "failed: " in text:
            text = text.rsplit("failed: ", 1)[1]
        text = text.removeprefix("FATAL:").strip()
        if self._password:
            text = text.replace(self._password, "***")
        if any(words in text for words in _REFUSED):
            return ClusterRefused(
                text,
                url=self.url,
                remedy="check the URL's user and database, and cluster.password_file",
            )
        if "Connection refused" in text:
            return ClusterUnreachable(
                text, url=self.url, remedy="is the server running on that host?"
            )
        if isinstance(err, psycopg.OperationalError):
            return ClusterUnreachable(text, url=self.url)
        return ClusterError(text, url=self.url)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            if self.pool is None:
                with self._one_connection() as conn:
                    yield conn
                return
            with self.pool.connection(timeout=self._connect_timeout) as conn:
                yield conn
        except PoolTimeout as err:
            raise ClusterUnreachable(
                f"no connection within {self._connect_timeout:g} s",
                url=self.url,
                remedy="check that the server runs and the URL, user and password are right",
            ) from err
        except psycopg.Error as err:
            raise self.translate(err) from err

    @contextlib.contextmanager
    def _one_connection(self) -> Iterator[psycopg.Connection[Any]]:
        """The direct connection for one transaction (commit on success, else roll back)."""
        if self._holder == threading.get_ident():
            raise RuntimeError("a cluster transaction inside another one on the same thread")
        with self._direct_lock:
            self._holder = threading.get_ident()
            try:
                if self._direct is None or self._direct.closed or self._direct.broken:
                    self._direct = psycopg.connect(self.url, **{**self.options, **self._session})
                conn = self._direct
                try:
                    yield conn
                except BaseException:
                    if not (conn.closed or conn.broken):
                        conn.rollback()
                    raise
                conn.commit()
            finally:
                self._holder = None

    @contextlib.contextmanager
    def read(self) -> Iterator[Qmark]:
        """A transaction for reading (committed or rolled back when the block ends)."""
        with self._connection() as conn:
            yield Qmark(conn)

    @contextlib.contextmanager
    def write(self, lock: int | None = BOARD_LOCK, *, shared: bool = False) -> Iterator[Qmark]:
        """A write transaction, holding the advisory ``lock`` (None: no lock; ``shared``: in
        shared mode, excluding only exclusive holders) until it ends."""
        with self._connection() as conn:
            if lock is not None:
                function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
                conn.execute(f"SELECT {function}(%s)", (lock,))
            yield Qmark(conn)

    def schema_version(self) -> int:
        """The schema version the database records (0: none yet)."""
        with self.read() as conn:
            row = conn.execute("SELECT to_regclass('dispatch_schema') IS NOT NULL").fetchone()
            if row is None or not row[0]:
                return 0
            row = conn.execute("SELECT max(version) FROM dispatch_schema").fetchone()
        return int(row[0] or 0) if row is not None else 0

    def migrate(self) -> int:
        """Bring the schema to :data:`tables.VERSION`; refuse a newer one, changing nothing.
        Returns the version. A database already at this version is only read."""
        current = self.schema_version()
        self._refuse_newer(current)
        if current == tables.VERSION:
            return current
        with self.write(SCHEMA_LOCK) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS dispatch_schema ("
                " version integer NOT NULL, note text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT max(version) AS v FROM dispatch_schema").fetchone()
            current = int(row["v"] or 0) if row is not None else 0
            self._refuse_newer(current)
            for version, note, sql in tables.MIGRATIONS:
                if version > current:
                    conn.raw.execute(sql)
                    conn.execute(
                        "INSERT INTO dispatch_schema (version, note) VALUES (?, ?)",
                        (version, note),
                    )
        return tables.VERSION

    def _refuse_newer(self, current: int) -> None:
        if current > tables.VERSION:
            raise ClusterError(
                f"its schema version {current} is newer than this dispatch understands "
                f"({tables.VERSION}); nothing was changed",
                url=self.url,
                remedy="upgrade dispatch on this host",
            )

    def close(self) -> None:
        """Close every connection (pooled or direct)."""
        if self.pool is not None:
            self.pool.close()
        with self._direct_lock:
            if self._direct is not None:
                self._direct.close()
                self._direct = None

    def __enter__(self) -> ClusterDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def database_clock(conn: Qmark) -> float:
    """The database server's clock now, in epoch seconds (``clock_timestamp()``: the time of
    this statement, not of the transaction's start, so read after a lock it is later than
    everything the lock's previous holders wrote)."""
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None  # a SELECT without FROM returns its one row
    return float(row[0])


class Row(tuple[Any, ...]):
    """A result row read by position (``row[0]``) or by column name (``row["id"]``), as
    :class:`sqlite3.Row` is, so the SQL shared with SQLite reads the same records."""

    names: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self.names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        """Column names in order (as :meth:`sqlite3.Row.keys`)."""
        return list(self.names)


def named_tuple_rows(cursor: psycopg.Cursor[Any]) -> Any:
    """psycopg row factory making :class:`Row` objects."""
    names = {column.name: i for i, column in enumerate(cursor.description or ())}
    row_type = type("Row", (Row,), {"names": names})

    def make(values: Sequence[Any]) -> Row:
        return row_type(values)

    return make


class Qmark:
    """A psycopg connection that takes SQLite's ``?`` placeholders (see :mod:`.database`).

    The shared SQL never contains a literal ``?`` or ``%``, so the translation is a plain
    replacement, cached per statement."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[Any]:
        """Run one statement with ``?`` placeholders."""
        return self.raw.execute(_translate(sql), tuple(parameters))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> psycopg.Cursor[Any]:
        """Run one statement for each parameter row."""
        cursor = self.raw.cursor()
        cursor.executemany(_translate(sql), [tuple(r) for r in rows])
        return cursor


@functools.lru_cache(maxsize=512)
def _translate(sql: str) -> str:
    return sql.replace("?", "%s")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
