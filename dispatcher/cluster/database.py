"""The cluster database: a small connection pool, transactions, the schema, and its errors.

One :class:`ClusterDB` per process holds a :class:`psycopg_pool.ConnectionPool` of at most four
connections (the issue's budget: workers never connect, a host holds its pool plus one LISTEN
connection). Every connection has TCP keepalives and a statement timeout, so a half-open socket
or a stuck lock surfaces as an error instead of a silent stall.

Writes to the board take one transaction-scoped advisory lock, the PostgreSQL counterpart of
SQLite's single writer: a board change re-reads what it depends on and writes its answer with no
other board change in between, which keeps every compare-and-set of the board store exactly as
it is on SQLite (budgets included). Ledger writes rely on the unique fire key instead.

The URL a user sees never carries a password (:func:`redact`); a password may come from a 0600
file (:func:`password_from_file`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from dispatcher.cluster import schema
from dispatcher.cluster.url import check_url, redact
from dispatcher.errors import DispatcherError
from scope.foundation.errors import ConfigError

BOARD_LOCK = 0x64697370_6B616E  # "disp" "kan": the board's advisory lock key
SCHEMA_LOCK = 0x64697370_736368  # "disp" "sch": migrations run one at a time
POOL_MAX = 4


class ClusterError(DispatcherError):
    """The cluster database cannot be reached or used (exit 1; a bad URL is a ConfigError)."""

    def __init__(self, problem: str, *, url: str, remedy: str | None = None, **fields: Any):
        super().__init__(remedy=remedy, problem=problem, url=redact(url), **fields)

    def describe(self) -> str:
        return f"cluster database {self.fields['url']}: {self.fields['problem']}"


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
    """A pool of connections to the cluster database (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        statement_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        max_size: int = POOL_MAX,
        application_name: str = "dispatch",
    ) -> None:
        self.url = check_url(url)
        options: dict[str, Any] = {
            "autocommit": False,
            "row_factory": named_tuple_rows,
            "connect_timeout": max(1, int(connect_timeout)),
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "application_name": application_name,
            "options": f"-c statement_timeout={int(statement_timeout * 1000)}",
        }
        self.extra_options: dict[str, Any] = {} if password is None else {"password": password}
        options.update(self.extra_options)
        self._connect_timeout = connect_timeout
        self.pool: ConnectionPool[Any] = ConnectionPool(
            url, min_size=0, max_size=max_size, kwargs=options, open=False, name="dispatch"
        )
        self.pool.open(wait=False)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            with self.pool.connection(timeout=self._connect_timeout) as conn:
                yield conn
        except PoolTimeout as err:
            raise ClusterError(
                "no connection within the timeout",
                url=self.url,
                remedy="check that the server runs and the URL, user and password are right",
            ) from err
        except psycopg.OperationalError as err:
            raise ClusterError(_first_line(err), url=self.url) from err

    @contextlib.contextmanager
    def read(self) -> Iterator[Qmark]:
        """A transaction for reading (committed or rolled back when the block ends)."""
        with self._connection() as conn:
            yield Qmark(conn)

    @contextlib.contextmanager
    def write(self, lock: int | None = BOARD_LOCK) -> Iterator[Qmark]:
        """A write transaction, holding the advisory ``lock`` (None: no lock) until it ends."""
        with self._connection() as conn:
            if lock is not None:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
            yield Qmark(conn)

    def migrate(self) -> int:
        """Bring the schema to :data:`schema.VERSION`; refuse a newer one. Returns the version."""
        with self.write(SCHEMA_LOCK) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS dispatch_schema ("
                " version integer NOT NULL, note text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT max(version) AS v FROM dispatch_schema").fetchone()
            current = int(row["v"] or 0) if row is not None else 0
            if current > schema.VERSION:
                raise ClusterError(
                    f"its schema version {current} is newer than this dispatch understands "
                    f"({schema.VERSION}); nothing was changed",
                    url=self.url,
                    remedy="upgrade dispatch on this host",
                )
            for version, note, sql in schema.MIGRATIONS:
                if version > current:
                    conn.raw.execute(sql)
                    conn.execute(
                        "INSERT INTO dispatch_schema (version, note) VALUES (?, ?)",
                        (version, note),
                    )
        return schema.VERSION

    def close(self) -> None:
        """Close every pooled connection."""
        self.pool.close()

    def __enter__(self) -> ClusterDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
