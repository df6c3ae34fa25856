"""The board in the cluster database: :class:`PgBoardStore`.

The board's SQL is the SQLite store's (:class:`dispatcher.kanban.store.SqlBoardStore`), run
through :class:`~dispatcher.cluster.database.ClusterDB`, whose write transactions hold the
board's advisory lock; only the two spellings that differ between the backends are set here.
"""

from __future__ import annotations

from dispatcher.cluster.database import ClusterDB
from dispatcher.kanban.store import SqlBoardStore


class PgBoardStore(SqlBoardStore):
    """Cards, runs and events shared by every host of a cluster."""

    PARENT_ORDER = "position"
    PREFIX_MATCH = "starts_with({column}, ?)"

    def __init__(self, db: ClusterDB) -> None:
        super().__init__(db)
