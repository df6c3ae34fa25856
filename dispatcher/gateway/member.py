"""The gateway's cluster side: what ``dispatch serve`` adds when cluster state is in PostgreSQL.

:func:`open_gateway_state` opens cluster state for the gateway (a pool of at most four
connections) and, in cluster mode, joins: a duplicate live host id, a refused or a newer
database end the start there, before anything is written to the cluster database. A single
host gets :class:`Alone`, which does nothing; in cluster mode the :class:`Member` it returns
runs beside the gateway's loop:

* the lease driver (:mod:`dispatcher.gateway.lease`) on its own thread, whose reports reach the
  main loop through :meth:`Member.events` (a tick after a rescue or a recovery, cron caught up,
  cron stopped or started as the clock skew allows);
* one LISTEN connection (:class:`~dispatcher.cluster.wake.Listener`) whose notifications wake
  the main loop like a poke; the board version is polled every :data:`CLUSTER_BOARD_POLL` s as
  the fallback;
* :meth:`Member.down` tells the main loop not to wait for an unreachable database at all, and
  :meth:`Member.claim_room` how many cards a tick may claim (none without a safe lease).
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.app.clusterstate import ClusterState, open_cluster_state
from dispatcher.app.runtime import Runtime
from dispatcher.cron.scheduler import CronScheduler
from dispatcher.cron.waker import CronWaker
from dispatcher.kanban.settings import KanbanSettings
from dispatcher.settings import Settings
from scope.foundation.clock import Clock
from scope.foundation.errors import DispatchError

if TYPE_CHECKING:  # the PostgreSQL side is imported only in cluster mode
    from dispatcher.cluster.wake import Listener
    from dispatcher.gateway.lease import Change, HostLoop, LeaseDriver

log = logging.getLogger("dispatch.cluster")

CLUSTER_BOARD_POLL = 2.0
"""Seconds between board-version checks in cluster mode (LISTEN/NOTIFY wakes sooner)."""


class Alone:
    """A single host on SQLite: nothing to join, renew or listen to."""

    def __init__(self, clock: Clock, board_poll: float) -> None:
        self.db_clock: Clock = clock
        self.board_poll = board_poll
        """Seconds between board-version checks of the gateway."""

    def start(self, cron: CronScheduler) -> None:
        """After adoption (nothing to do alone)."""

    def stop(self) -> None:
        """At shutdown (nothing to do alone)."""

    def down(self) -> bool:
        """Whether the cluster database is known to be unreachable now."""
        return False

    def cron_refused(self) -> bool:
        """Whether this host's clock is too far off the database's to fire cron."""
        return False

    def claim_room(self, kanban: KanbanSettings, now: float) -> int | None:
        """Claims a tick at monotonic ``now`` may make (None: no limit but the claim's)."""
        return None

    def note(self) -> str | None:
        """What the STATUS= line should say first, while something is wrong."""
        return None

    def events(self, cron: CronScheduler | None, waker: CronWaker | None) -> bool:
        """Apply what happened in the cluster (main loop); True when the board wants a tick."""
        return False


def open_gateway_state(
    settings: Settings,
    state_dir: Path,
    environ: Mapping[str, str],
    runtime: Runtime,
    nudge: Callable[[], None],
    board_poll: float,
) -> tuple[ClusterState, Alone]:
    """Cluster state for the gateway on ``runtime`` (its host state), and its :class:`Member`
    in cluster mode (joined), else :class:`Alone` (polling the board every ``board_poll`` s).
    ``nudge`` wakes the gateway's loop from another thread."""
    cluster = settings.cluster
    clock = runtime.registry.clock  # the gateway's (injected) clock
    state = open_cluster_state(
        settings,
        state_dir,
        environ,
        local=runtime.db,
        pooled=True,
        connect_timeout=min(5.0, max(2.0, cluster.heartbeat * 2)),
    )
    if not state.clustered:
        return state, Alone(clock, board_poll)
    from dispatcher.cluster.faults import ClusterFault
    from dispatcher.gateway.lease import HostLoop

    try:
        member = Member(
            HostLoop(
                state=state,
                registry=runtime.registry,
                settings=cluster,
                state_dir=state_dir,
                clock=clock,
                heir_claimant="",
                fault=ClusterFault.from_environ(environ),
            ),
            state,
            nudge,
        )
        member.loop.join(clock.monotonic())
    except BaseException:
        state.close()
        raise
    return state, member


class Member(Alone):
    """This serve as one host of the cluster (see the module docstring)."""

    def __init__(self, loop: HostLoop, state: ClusterState, nudge: Callable[[], None]) -> None:
        super().__init__(loop.db_clock, CLUSTER_BOARD_POLL)
        self.loop = loop
        self.state = state
        self._nudge = nudge
        self._changes: queue.SimpleQueue[Change] = queue.SimpleQueue()
        self._woken = False
        self._driver: LeaseDriver | None = None
        self._listener: Listener | None = None
        loop.on_change = self._changed

    def start(self, cron: CronScheduler) -> None:
        """After adoption: stop adopted workers whose runs other hosts took over while no
        serve ran here, then start the lease driver and the LISTEN connection."""
        from dispatcher.cluster.wake import Listener
        from dispatcher.gateway.lease import LeaseDriver

        self.loop.rescuer.heir_claimant = cron.claimant
        killed = self.loop.kill_foreign()
        if killed:
            log.warning("stopped %d adopted workers whose runs other hosts took over", killed)
        self._driver = LeaseDriver(self.loop)
        self._driver.start()
        assert self.state.db is not None
        self._listener = Listener(self.state.db, self._listened)
        self._listener.start()

    def stop(self) -> None:
        """Stop the driver and the listener. The lease is not given up: a restart within
        ``lease_ttl`` rejoins at the same epoch and adopts the workers."""
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.stop()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()

    def down(self) -> bool:
        return not self.loop.connected

    def cron_refused(self) -> bool:
        return self.loop.cron_refused

    def claim_room(self, kanban: KanbanSettings, now: float) -> int:
        """None without a safe lease, else up to the cluster-wide and this host's caps (the
        claim itself checks them again)."""
        if not self.loop.may_claim(now):
            return 0
        self.state.pg_board().host_max = kanban.max_in_progress_per_host
        room = self.state.claim_room(kanban.max_in_progress, kanban.max_in_progress_per_host)
        return 0 if room is None else room

    def note(self) -> str | None:
        return self.loop.status_line()

    def events(self, cron: CronScheduler | None, waker: CronWaker | None) -> bool:
        """What the lease driver and the listener reported."""
        from dispatcher.gateway.lease import Change

        wanted, self._woken = self._woken, False
        while True:
            try:
                change = self._changes.get_nowait()
            except queue.Empty:
                return wanted
            if change in (Change.RECOVERED, Change.RESCUED, Change.REJOINED):
                wanted = True
                _cron_catch_up(cron, waker, full=change is not Change.RESCUED)
            elif change is Change.CRON and waker is not None:
                if self.cron_refused() and waker.running:
                    waker.stop()
                elif not self.cron_refused() and not waker.running:
                    waker.start()

    def _listened(self) -> None:
        # LISTEN thread: a board change somewhere in the cluster.
        self._woken = True
        self._nudge()

    def _changed(self, change: Change) -> None:
        # Lease driver thread.
        self._changes.put(change)
        self._nudge()


def _cron_catch_up(cron: CronScheduler | None, waker: CronWaker | None, *, full: bool) -> None:
    """After an outage (``full``: settle what ended meanwhile) or a rescue (start the fires
    taken over from a dead host)."""
    if cron is None or waker is None or not waker.running:
        return
    if full:
        try:
            cron.catch_up()
        except DispatchError as err:
            log.error("cron: catching up failed: %s", err)
    waker.request(cron.clock.time())
