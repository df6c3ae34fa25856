"""dispatcher/cluster/: cluster state in PostgreSQL (cluster mode).

Several hosts, each with its own ``dispatch serve``, systemd manager and state dir, share one
board and one cron ledger in PostgreSQL. This package holds the PostgreSQL side of the board-store
and ledger seams (:mod:`dispatcher.kanban.abc`, :mod:`dispatcher.cron.abc`): the connection pool
(:mod:`~dispatcher.cluster.database`), the versioned schema (:mod:`~dispatcher.cluster.tables`),
the board (:mod:`~dispatcher.cluster.board`) and the ledger (:mod:`~dispatcher.cluster.ledger`).
Host-local state (registry sessions, keepers, logs, exit records) never comes here.
"""
