"""The cron ledger in the cluster database: :class:`PgLedger`.

The ledger's SQL is the SQLite ledger's (:class:`dispatcher.cron.ledger.Ledger`). Two things
differ: a failed ``INSERT`` aborts a PostgreSQL transaction, so a fire key that is already taken
is skipped with ``ON CONFLICT DO NOTHING`` instead of caught; and a tick's transaction holds the
ledger's advisory lock, as SQLite's single writer does, so the keys a tick found free are still
free when it inserts them. Any host may try any fire; the unique fire key decides which one runs
it, and the others see ``None``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from dispatcher.cluster.database import ClusterDB, Qmark
from dispatcher.cron.ledger import Ledger, Tx, insert_sql

LEDGER_LOCK = 0x64697370_6C6467  # "disp" "ldg": one ledger writer at a time


class PgTx(Tx):
    """A ledger transaction on PostgreSQL."""

    def insert(self, **values: Any) -> int | None:
        sql = insert_sql(tuple(values)) + " ON CONFLICT DO NOTHING RETURNING id"
        row = self.conn.execute(sql, tuple(values.values())).fetchone()
        return None if row is None else int(row[0])


class _LedgerDB:
    """The cluster database as the ledger uses it: writes take the ledger's lock."""

    def __init__(self, cluster: ClusterDB) -> None:
        self.cluster = cluster

    def read(self) -> contextlib.AbstractContextManager[Qmark]:
        return self.cluster.read()

    @contextlib.contextmanager
    def write(self) -> Iterator[Qmark]:
        with self.cluster.write(LEDGER_LOCK) as conn:
            yield conn


class PgLedger(Ledger):
    """Fire decisions and job state shared by every host of a cluster."""

    TX = PgTx
    GREATEST = "GREATEST"

    def __init__(self, db: ClusterDB) -> None:
        super().__init__(_LedgerDB(db))
