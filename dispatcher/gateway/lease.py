"""This serve's membership of a cluster: join, renew, rescue, skew, outage and supersede.

:class:`HostLoop` is one deterministic step with an injected clock, like the gateway's and
cron's loops: :meth:`HostLoop.step` renews the lease when a heartbeat is due, rescues hosts
whose lease ran out, stops workers that are no longer this host's, measures the clock skew
every ten minutes, and answers when it next needs to run. Tests drive it with a fake clock.
In ``dispatch serve`` a small :class:`LeaseDriver` thread calls it at that deadline, apart from
the main loop on purpose: a kanban tick that starts many workers can hold the main loop for
seconds, and a lease must never run out because this host was busy dispatching.

What each outcome of a heartbeat means:

* **renewed**: claims may go on until one heartbeat before the lease would run out without a
  renewal (measured on this host's monotonic clock from the moment the renewal was sent, so no
  comparison of two machines' clocks is involved); the gateway asks :meth:`HostLoop.may_claim`.
* **the database is unreachable** (an outage): nothing new is claimed, running workers keep
  running and keep their exit records on this host; the renewal is retried with backoff (from
  0.5 s up to one heartbeat) and the status says so. When it answers again, the gateway
  settles the runs that ended meanwhile, unless:
* **superseded**: another host rescued this host's runs while it was away. This host kills the
  workers of those runs (and of its fires that were settled meanwhile) through the registry,
  whose kill confirms each process's identity, records nothing for them (every write about
  them is fenced by the new epoch), logs one line and rejoins at the epoch the rescuer set.

The status of the membership is written to ``cluster.json`` in the state dir (0600, atomic)
for ``dispatch status``; :class:`DbClock` is the database's clock as seen from this host,
which the cron scheduler uses, so every host decides fires by the same clock.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dispatcher import __version__
from dispatcher.app.clusterstate import ClusterState
from dispatcher.cluster.database import ClusterError
from dispatcher.cluster.faults import ClusterFault
from dispatcher.cluster.hosts import DuplicateHost, Hosts, Lease, Superseded, host_boot_id
from dispatcher.cluster.ledger import PgLedger
from dispatcher.cluster.rescue import Rescuer
from dispatcher.cluster.settings import SKEW_REFUSE, SKEW_WARN, ClusterSettings
from dispatcher.cluster.url import redact
from dispatcher.gateway.statusfile import write_json
from registry.abc import OwnerKind, Registry
from scope.foundation.clock import Clock
from scope.foundation.errors import DispatchError, NotFoundError
from scope.foundation.text import plural

log = logging.getLogger("dispatch.cluster")

SKEW_EVERY = 600.0
"""Seconds between clock-skew measurements (and one at start)."""
FIRST_RETRY = 0.5
STATUS_NAME = "cluster.json"
_OWNED = (OwnerKind.KANBAN, OwnerKind.CRON)


class Membership(enum.StrEnum):
    """Where this host stands in the cluster."""

    LIVE = "live"
    OUTAGE = "outage"
    """The cluster database cannot be reached: nothing new is claimed."""
    SUPERSEDED = "superseded"
    """Taken over while away; rejoining."""


class Change(enum.StrEnum):
    """What the gateway is told about (from the driver thread)."""

    OUTAGE = "outage"
    RECOVERED = "recovered"
    """The database answers again: settle what ended meanwhile, catch up cron."""
    RESCUED = "rescued"
    """Another host's work was taken over: cards are ready, cron fires may be due."""
    REJOINED = "rejoined"
    CRON = "cron"
    """Whether cron may fire changed (clock skew)."""


@dataclass(frozen=True, kw_only=True)
class ClusterStatus:
    """What ``dispatch status`` shows about this serve's membership (``cluster.json``)."""

    pid: int
    url: str
    host_id: str
    boot_id: str
    epoch: int
    state: str
    updated_at: float
    lease_until: float | None = None
    """Database clock, epoch seconds."""
    renewed_at: float | None = None
    skew: float | None = None
    cron_refused: bool = False
    outage_since: float | None = None
    retry_in: float | None = None
    error: str | None = None
    rescued_runs: int = 0


class DbClock:
    """The database's clock as seen from here: this host's wall clock minus its measured skew
    (monotonic time is this host's)."""

    def __init__(self, inner: Clock) -> None:
        self.inner = inner
        self.skew = 0.0

    def time(self) -> float:
        return self.inner.time() - self.skew

    def monotonic(self) -> float:
        return self.inner.monotonic()

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class HostLoop:
    """This host's lease and duties in the cluster (see the module docstring)."""

    def __init__(
        self,
        *,
        state: ClusterState,
        registry: Registry,
        settings: ClusterSettings,
        state_dir: Path,
        clock: Clock,
        heir_claimant: str,
        on_change: Callable[[Change], None] = lambda change: None,
        fault: ClusterFault | None = None,
        boot_id: str | None = None,
    ) -> None:
        assert state.db is not None and state.hosts is not None and state.stamp is not None
        self.state = state
        self.board = state.pg_board()
        assert isinstance(state.ledger, PgLedger)
        self.ledger: PgLedger = state.ledger
        self.hosts: Hosts = state.hosts
        self.stamp = state.stamp
        self.registry = registry
        self.settings = settings
        self.state_dir = Path(state_dir)
        self.clock = clock
        self.db_clock = DbClock(clock)
        self.on_change = on_change
        self.fault = fault or ClusterFault()
        self.boot_id = boot_id or host_boot_id(self.state_dir)
        self.rescuer = Rescuer(
            self.board, self.hosts, self.stamp, heir_claimant=heir_claimant, fault=self.fault
        )
        self.membership = Membership.LIVE
        self.skew: float | None = None
        self.cron_refused = False
        self.rescued_runs = 0
        self._lock = threading.RLock()
        self._lease: Lease | None = None
        self._lease_end: float | None = None
        """Monotonic instant the lease runs out without a renewal."""
        self._renewed_wall: float | None = None
        self._live_since: float | None = None
        """Monotonic instant since which this host has reached the database without a break."""
        self._next_beat = 0.0
        self._next_skew = 0.0
        self._retry = FIRST_RETRY
        self._outage_since: float | None = None
        self._error: str | None = None
        self._skew_level = 0

    # -- what the gateway asks ---------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the cluster database answered the last heartbeat."""
        return self.membership is Membership.LIVE

    def may_claim(self, now: float) -> bool:
        """Whether this host may claim at monotonic instant ``now``: its lease is live and
        more than one heartbeat away from running out without a renewal."""
        with self._lock:
            return (
                self.membership is Membership.LIVE
                and self._lease_end is not None
                and now < self._lease_end - self.settings.heartbeat
            )

    # -- joining -----------------------------------------------------------------------------

    def join(self, now: float) -> Lease:
        """Take this host's lease at start (DuplicateHost: another live machine holds the id;
        nothing is written then). A new boot closes its runs of the old epoch; a restart keeps
        its epoch and adopts its workers (the gateway then stops those whose runs were taken
        over while no serve ran here: :meth:`kill_foreign`)."""
        with self._lock:
            lease = self.hosts.join(self.stamp.host_id, boot_id=self.boot_id, version=__version__)
            self.fault.reach("joined")
            self.stamp.epoch = lease.epoch
            self._renewed(now, lease)
            self._close_stale()
            log.info(
                "joined the cluster at %s as host %s (epoch %d, lease %g s, heartbeat %g s)",
                redact(self.state.db.url if self.state.db else ""),
                self.stamp.host_id,
                lease.epoch,
                self.settings.lease_ttl,
                self.settings.heartbeat,
            )
            self._measure_skew(now)
            self._next_beat = now + self.settings.heartbeat
            return lease

    def _close_stale(self) -> None:
        # Runs of this host from older epochs are dead (a previous boot) or were taken over;
        # closed at every join, so a serve that died right after joining leaves none behind.
        stale = self.board.rescue_stale(self.stamp.host_id, self.stamp.epoch, now=self.clock.time())
        if stale:
            log.warning(
                "host %s: %s of an earlier epoch (a previous boot) closed lost",
                self.stamp.host_id,
                plural(len(stale), "run"),
            )

    # -- the step ----------------------------------------------------------------------------

    def step(self, now: float) -> float:
        """Whatever is due at monotonic instant ``now``; returns when to step next."""
        with self._lock:
            if now >= self._next_beat:
                self._beat(now)
            if now >= self._next_skew and self.membership is Membership.LIVE:
                self._measure_skew(now)
            self._write_status()
            return min(self._next_beat, self._next_skew)

    def _beat(self, now: float) -> None:
        try:
            lease = self.hosts.renew(self.stamp.host_id, self.stamp.epoch, skew=self.skew)
        except Superseded:
            self._rejoin(now)
            return
        except ClusterError as err:
            self._outage(now, err)
            return
        recovered = self.membership is Membership.OUTAGE
        self._renewed(now, lease)
        if recovered:
            log.warning(
                "cluster database reachable again after %.1f s; settling what ended meanwhile",
                now - (self._outage_since or now),
            )
            self._outage_since = None
            self.on_change(Change.RECOVERED)
        try:
            self._sweep(now)
        except ClusterError as err:
            self._outage(now, err)
            return
        self._next_beat = now + self.settings.heartbeat

    def _renewed(self, now: float, lease: Lease) -> None:
        if self.membership is not Membership.LIVE or self._live_since is None:
            self._live_since = now
        self._lease = lease
        # The lease as granted, on the database clock, counted from when we asked for it.
        self._lease_end = now + (lease.lease_until - lease.db_now)
        self._renewed_wall = self.clock.time()
        self.membership = Membership.LIVE
        self._retry = FIRST_RETRY
        self._error = None

    def _sweep(self, now: float) -> None:
        # Whatever kept this host from the database may have kept the others from it too: they
        # get a whole lease from the moment it answers again before anything of theirs is taken.
        rescued = []
        if self._live_since is not None and now - self._live_since >= self.settings.lease_ttl:
            rescued = self.rescuer.sweep(now=self.clock.time())
        for done in rescued:
            log.warning("%s", done.describe())
            self.rescued_runs += len(done.runs)
        if rescued:
            self.on_change(Change.RESCUED)
        self.kill_foreign()

    def _outage(self, now: float, err: ClusterError) -> None:
        if self.membership is not Membership.OUTAGE:
            self._outage_since = now
            log.error(
                "%s; workers keep running and keep their exit records on this host, nothing "
                "new is claimed; retrying with backoff",
                err.message,
            )
            self.membership = Membership.OUTAGE
            self.on_change(Change.OUTAGE)
        else:
            self._retry = min(self._retry * 2, max(FIRST_RETRY, self.settings.heartbeat))
        self._error = err.message
        self._next_beat = now + self._retry

    def _rejoin(self, now: float) -> None:
        old = self.stamp.epoch
        self.membership = Membership.SUPERSEDED
        self._lease_end = None
        try:
            killed = self.kill_foreign()
            self.fault.reach("superseded")
            lease = self.hosts.join(self.stamp.host_id, boot_id=self.boot_id, version=__version__)
        except DuplicateHost as err:
            if self._error != err.message:
                log.error("cannot rejoin: %s", err.message)
            self._error = err.message
            self._next_beat = now + self.settings.heartbeat
            return
        except ClusterError as err:
            self._outage(now, err)
            return
        self.stamp.epoch = lease.epoch
        self._renewed(now, lease)
        try:
            self._close_stale()
        except ClusterError as err:
            self._outage(now, err)
            return
        log.error(
            "host %s was taken over while away (epoch %d is no longer current): killed %s, "
            "recorded nothing for them, rejoined at epoch %d",
            self.stamp.host_id,
            old,
            plural(killed, "now-foreign worker"),
            lease.epoch,
        )
        self.on_change(Change.REJOINED)
        self._next_beat = now + self.settings.heartbeat

    # -- foreign workers ---------------------------------------------------------------------

    def kill_foreign(self) -> int:
        """Stop every local worker whose run or fire is no longer this host's (rescued
        elsewhere, or replaced by a fire decided on another host). Returns how many."""
        sessions = [s for s in self.registry.list_sessions() if not s.finished]
        runs = [s.owner.id for s in sessions if s.owner.kind is OwnerKind.KANBAN]
        fires = [s.owner.id for s in sessions if s.owner.kind is OwnerKind.CRON]
        foreign = self.board.foreign_runs(runs) | self.ledger.foreign_fires(fires)
        killed = 0
        for session in sessions:
            if session.owner.kind not in _OWNED or session.owner.id not in foreign:
                continue
            try:
                self.registry.kill(
                    session.id, reason="its run or fire is no longer this host's (cluster)"
                )
                killed += 1
            except NotFoundError:
                continue
            except (DispatchError, OSError) as err:
                log.warning("could not stop foreign worker %s: %s", session.id, err)
        return killed

    # -- clock -------------------------------------------------------------------------------

    def _measure_skew(self, now: float) -> None:
        try:
            skew = self.hosts.measure_skew(self.clock)
        except ClusterError as err:
            self._outage(now, err)
            return
        self.skew = skew
        self.db_clock.skew = skew
        self._next_skew = now + SKEW_EVERY
        level = 2 if abs(skew) >= SKEW_REFUSE else 1 if abs(skew) >= SKEW_WARN else 0
        if level != self._skew_level:
            self._report_skew(skew, level)
        refused = level == 2
        if refused != self.cron_refused:
            self.cron_refused = refused
            self.on_change(Change.CRON)

    def _report_skew(self, skew: float, level: int) -> None:
        self._skew_level = level
        if level == 2:
            log.error(
                "this host's clock is %+.1f s off the database's: cron fires nothing here until "
                "it is corrected (kanban still runs); check NTP (timedatectl status)",
                skew,
            )
        elif level == 1:
            log.warning(
                "this host's clock is %+.2f s off the database's; leases use the database's "
                "clock, but check NTP (timedatectl status)",
                skew,
            )
        else:
            log.info("this host's clock is within %.2f s of the database's again", abs(skew))

    # -- status ------------------------------------------------------------------------------

    def status(self) -> ClusterStatus:
        """The membership as ``dispatch status`` shows it."""
        with self._lock:
            now = self.clock.monotonic()
            return ClusterStatus(
                pid=os.getpid(),
                url=redact(self.state.db.url) if self.state.db else "",
                host_id=self.stamp.host_id,
                boot_id=self.boot_id,
                epoch=self.stamp.epoch,
                state=self.membership.value,
                updated_at=self.clock.time(),
                lease_until=None if self._lease is None else self._lease.lease_until,
                renewed_at=self._renewed_wall,
                skew=self.skew,
                cron_refused=self.cron_refused,
                outage_since=None
                if self._outage_since is None
                else self.clock.time() - (now - self._outage_since),
                retry_in=max(0.0, self._next_beat - now)
                if self.membership is Membership.OUTAGE
                else None,
                error=self._error,
                rescued_runs=self.rescued_runs,
            )

    def status_line(self) -> str | None:
        """A few words for sd_notify's STATUS= while something is wrong (None: all well)."""
        current = self.status()
        if current.state == Membership.OUTAGE.value:
            return (
                f"cluster database unreachable, retrying in {current.retry_in or 0:.0f} s; "
                "workers keep running, nothing new is claimed"
            )
        if current.state == Membership.SUPERSEDED.value:
            return "taken over while away; rejoining the cluster"
        if current.cron_refused:
            return f"clock {current.skew or 0:+.0f} s off the database: cron fires nothing"
        return None

    def _write_status(self) -> None:
        try:
            write_json(Path(self.state_dir) / STATUS_NAME, asdict(self.status()))
        except OSError as err:
            log.error("cannot write %s: %s", STATUS_NAME, err)


class LeaseDriver:
    """Calls :meth:`HostLoop.step` at the deadline it answers, on its own thread."""

    def __init__(self, loop: HostLoop) -> None:
        self.loop = loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dispatch-lease", daemon=True)

    def start(self) -> None:
        """Start stepping."""
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop (the lease is left to run out or to the next serve's join)."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        clock = self.loop.clock
        while not self._stop.is_set():
            try:
                deadline = self.loop.step(clock.monotonic())
            except Exception:
                log.exception("cluster: lease step failed; retrying")
                deadline = clock.monotonic() + FIRST_RETRY
            self._stop.wait(max(0.01, deadline - clock.monotonic()))


def read_cluster_status(state_dir: Path) -> dict[str, Any] | None:
    """The last ``cluster.json`` (None: none, or unreadable)."""
    try:
        raw = json.loads((Path(state_dir) / STATUS_NAME).read_text())
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None
