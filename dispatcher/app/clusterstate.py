"""Where cluster state lives: the one place that picks the board store and the cron ledger.

Cluster state is the kanban board (cards, runs, events, the pause flag), the cron ledger (fires,
job state, cron pause state) and, in cluster mode, the hosts table. Without a cluster database
it lives in the host's own ``state.db`` (:class:`~dispatcher.kanban.store.SqliteBoardStore`,
:class:`~dispatcher.cron.ledger.Ledger`): one host, no server, exactly as always. With
``cluster.database`` (or ``DISPATCH_DATABASE_URL``) it lives in PostgreSQL
(:class:`~dispatcher.cluster.board.PgBoardStore`, :class:`~dispatcher.cluster.ledger.PgLedger`),
stamped with this host's id, while host state (registry sessions, keepers, logs, exit records)
stays in the state dir either way.

Every command, the runtime and the gateway take what :func:`open_cluster_state` opens; nothing
else constructs a board store or a ledger. The PostgreSQL driver is imported only in cluster
mode, so a single host's commands start as fast as before.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.app.database import open_state
from dispatcher.kanban.store import SqlBoardStore, SqliteBoardStore
from dispatcher.launch.outbox import OUTPUT_TAIL, Outbox
from registry.store.database import StateDB
from scope.foundation.clock import Clock, SystemClock

if TYPE_CHECKING:
    from dispatcher.cluster.board import HostStamp, PgBoardStore
    from dispatcher.cluster.database import ClusterDB
    from dispatcher.cluster.hosts import Hosts
    from dispatcher.cron.ledger import Ledger
    from dispatcher.launch.outbox import Route
    from dispatcher.notify.store import NotifyStore
    from dispatcher.settings import Settings
    from dispatcher.tokens.store import TokenStore

__all__ = [
    "ClusterState",
    "DatabaseClock",
    "cluster_url",
    "open_cluster_state",
    "open_local_state",
]


def cluster_url(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """The cluster database URL in force (``DISPATCH_DATABASE_URL``, else the config's), or
    None for a single host on SQLite."""
    return settings.cluster.url(environ)


class DatabaseClock:
    """The cluster database's clock as one command sees it: this host's wall clock minus the
    skew measured on first use (one query), so times a command stores (a deferral's ``until``,
    a board change) are on the clock every host compares them with."""

    def __init__(self, hosts: Hosts, inner: Clock | None = None) -> None:
        self.hosts = hosts
        self.inner = inner or SystemClock()
        self._skew: float | None = None

    def time(self) -> float:
        if self._skew is None:
            self._skew = self.hosts.measure_skew(self.inner)
        return self.inner.time() - self._skew

    def monotonic(self) -> float:
        return self.inner.monotonic()

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


@dataclass(kw_only=True)
class ClusterState:
    """The board store and ledger one process uses (see the module docstring)."""

    board: SqlBoardStore
    local: StateDB
    """The host's own state database (host state; in single-host mode cluster state too)."""
    db: ClusterDB | None = None
    """The cluster database, None for a single host."""
    hosts: Hosts | None = None
    stamp: HostStamp | None = None
    """This host's id and lease epoch, stamped on every run and fire it writes."""
    owns_local: bool = False
    pg_ledger: Ledger | None = None
    """The cluster's ledger (cluster mode); a single host's is made on first use."""
    outbox: Outbox | None = None
    """Where the board's and the ledger's events queue notifications (None: no rules)."""
    _closed: bool = field(default=False, repr=False)

    @functools.cached_property
    def ledger(self) -> Ledger:
        """The cron ledger (a single host's in ``state.db``: imported and made on first use,
        since most commands never touch cron)."""
        if self.pg_ledger is not None:
            self.pg_ledger.outbox = self.outbox
            return self.pg_ledger
        from dispatcher.cron.ledger import Ledger

        ledger = Ledger(self.local)
        ledger.outbox = self.outbox
        return ledger

    @functools.cached_property
    def clock(self) -> Clock:
        """The clock cluster state is compared on: the database's in cluster mode (measured
        on first use), this host's otherwise."""
        return DatabaseClock(self.hosts) if self.hosts is not None else SystemClock()

    @property
    def clustered(self) -> bool:
        """Whether cluster state is in PostgreSQL."""
        return self.db is not None

    def pg_board(self) -> PgBoardStore:
        """The PostgreSQL board (cluster mode only)."""
        from dispatcher.cluster.board import PgBoardStore

        assert isinstance(self.board, PgBoardStore)
        return self.board

    def claim_room(self, max_in_progress: int, host_max: int | None) -> int | None:
        """How many claims a tick of this host may make now (None: no cluster limit; the
        claim itself still checks every cap). Lets a tick stop at this host's cap instead of
        asking card after card."""
        if self.db is None:
            return None
        total, mine = self.pg_board().open_counts()
        room = max_in_progress - total
        if host_max is not None:
            room = min(room, host_max - mine)
        return max(0, room)

    def lease_live(self) -> bool:
        """Whether this host's lease is live at the epoch this process stamps (single host:
        always)."""
        if self.hosts is None or self.stamp is None:
            return True
        row = self.hosts.row(self.stamp.host_id)
        return row is not None and row.live and row.epoch == self.stamp.epoch

    def notify_store(self) -> NotifyStore:
        """The notification outbox beside the board (cluster mode: claims skip locked rows,
        and take no board lock)."""
        from dispatcher.notify.store import NotifyStore

        if self.db is not None:
            db = self.db
            return NotifyStore(db.read, lambda: db.write(None), skip_locked=True)
        return NotifyStore(self.local.read, self.local.write)

    def token_store(self) -> TokenStore:
        """The HTTP API's tokens beside the board (cluster mode: every host's web accepts
        them)."""
        from dispatcher.tokens.store import TokenStore

        if self.db is not None:
            db = self.db
            return TokenStore(db.read, lambda: db.write(None))
        return TokenStore(self.local.read, self.local.write)

    def run_hosts(self, card_id: str) -> dict[str, str | None]:
        """The host of each run of a card (empty for a single host)."""
        return self.pg_board().run_hosts(card_id) if self.db is not None else {}

    def close(self) -> None:
        """Close the cluster database (and the state database when opened here)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.db is not None:
                self.db.close()
        finally:
            if self.owns_local:
                self.local.close()

    def __enter__(self) -> ClusterState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_cluster_state(
    settings: Settings,
    state_dir: Path,
    environ: Mapping[str, str],
    *,
    local: StateDB | None = None,
    pooled: bool = False,
    connect_timeout: float = 10.0,
    epoch: int | None = None,
) -> ClusterState:
    """Open cluster state for one process.

    ``local`` is the host's state database when the caller has it open already (it then
    stays the caller's to close). In cluster mode the database is checked (a wrong URL, user
    or password is one line, exit 2; an unreachable server exit 1), its schema brought up to
    date or refused when newer (nothing written), and the stores stamped with this host's id
    and ``epoch`` (default: the epoch this host's serve holds now, read from the hosts table).
    ``pooled``: a pool of at most four connections (the gateway) instead of one direct one.
    """
    owns_local = local is None
    db_local = open_state(Path(state_dir)) if local is None else local
    url = cluster_url(settings, environ)
    if url is None:
        state = _single_host(db_local, owns_local)
    else:
        try:
            state = _open_cluster(
                settings, url, db_local, owns_local, pooled, connect_timeout, epoch, environ
            )
        except BaseException:
            if owns_local:
                db_local.close()
            raise
    _route(state, settings.notify.routes(), settings.notify.output_tail)
    return state


def open_local_state(state_dir: Path, routes: Sequence[Route]) -> ClusterState:
    """A single host's cluster state (the state dir's SQLite file) with its events routed by
    ``routes``: what :func:`open_cluster_state` opens when no cluster database is set, for a
    caller that knows the notification routes but not the whole settings (the short write
    commands' config snapshot, :mod:`dispatcher.app.snapshot`)."""
    state = _single_host(open_state(Path(state_dir)), True)
    _route(state, routes)
    return state


def _single_host(local: StateDB, owns_local: bool) -> ClusterState:
    return ClusterState(board=SqliteBoardStore(local), local=local, owns_local=owns_local)


def _route(state: ClusterState, routes: Sequence[Route], output_tail: int = OUTPUT_TAIL) -> None:
    # Every process that changes the board routes its events to the outbox the same way.
    # Always an outbox (maybe routing nothing): a reload that adds rules changes its routes.
    state.outbox = Outbox(routes, output_tail=output_tail)
    state.board.outbox = state.outbox


def _open_cluster(
    settings: Settings,
    url: str,
    local: StateDB,
    owns_local: bool,
    pooled: bool,
    connect_timeout: float,
    epoch: int | None,
    environ: Mapping[str, str],
) -> ClusterState:
    from dispatcher.cluster.board import HostStamp, PgBoardStore
    from dispatcher.cluster.database import ClusterDB, password_from_file
    from dispatcher.cluster.faults import ClusterFault
    from dispatcher.cluster.hosts import Hosts
    from dispatcher.cluster.ledger import PgLedger

    cluster = settings.cluster
    password = None
    if cluster.password_file:
        password = password_from_file(Path(cluster.password_file).expanduser())
    host_id = cluster.effective_host_id()
    db = ClusterDB(
        url,
        password=password,
        pooled=pooled,
        connect_timeout=connect_timeout,
        io_timeout=max(5.0, min(20.0, cluster.lease_ttl / 2)),
        application_name=f"dispatch {host_id}",
    )
    try:
        db.check()
        db.migrate()
        hosts = Hosts(db, lease_ttl=cluster.lease_ttl)
        if epoch is None:
            row = hosts.row(host_id)
            epoch = 0 if row is None else row.epoch
        stamp = HostStamp(host_id=host_id, epoch=epoch)
        board = PgBoardStore(
            db,
            stamp,
            host_max=settings.kanban.max_in_progress_per_host,
            fault=ClusterFault.from_environ(environ),
        )
    except BaseException:
        db.close()
        raise
    return ClusterState(
        board=board,
        pg_ledger=PgLedger(db, stamp),
        local=local,
        db=db,
        hosts=hosts,
        stamp=stamp,
        owns_local=owns_local,
    )
