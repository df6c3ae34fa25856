"""The host loop (dispatcher.gateway.lease) on a real PostgreSQL, stepped with a fake clock.

The database is reached through a TCP proxy the test cuts, so outages are real connection
failures; lease expiry on the database clock is driven by shifting that clock for the other
hosts (``Hosts(shift=...)``), never by sleeping.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.app.clusterstate import ClusterState, open_cluster_state
from dispatcher.cluster.board import HostStamp, PgBoardStore
from dispatcher.cluster.database import ClusterDB
from dispatcher.cluster.faults import ClusterFault
from dispatcher.cluster.hosts import DuplicateHost, Hosts
from dispatcher.cluster.rescue import Rescuer
from dispatcher.cluster.settings import ClusterSettings
from dispatcher.gateway.lease import (
    FIRST_RETRY,
    Change,
    HostLoop,
    Membership,
    read_cluster_status,
)
from dispatcher.kanban.model import (
    CardChange,
    CardStatus,
    Limits,
    NewCard,
)
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.outcome import Outcome, Result
from dispatcher.settings import Settings
from registry.abc import Owner, SessionState, SpawnRequest
from registry.fake import FakeRegistry
from scope.foundation.clock import FakeClock
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.postgres

HEARTBEAT = 1.0
TTL = 3.0
ME = Claimant(pid=1, start=1, boot=None)


def _settings(url: str, host_id: str = "alpha") -> Settings:
    return dataclasses.replace(
        Settings(),
        cluster=ClusterSettings(database=url, host_id=host_id, heartbeat=HEARTBEAT, lease_ttl=TTL),
    )


def _via(url: str, port: int) -> str:
    head, _, tail = url.rpartition(":")
    return f"{head}:{port}/{tail.split('/', 1)[1]}"


class Rig:
    """One host ("alpha") behind a proxy, and the test's own view of the database."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.port = int(url.rsplit(":", 1)[1].split("/")[0])
        self.proxy = TcpProxy(self.port)
        self.clock = FakeClock(start=time.time())
        self.registry = FakeRegistry(clock=self.clock.time)
        self.changes: list[Change] = []
        self.state_dir = tmp / "alpha"
        self.state_dir.mkdir(mode=0o700)
        self.state: ClusterState = open_cluster_state(
            _settings(_via(url, self.proxy.port)),
            self.state_dir,
            {},
            pooled=True,
            connect_timeout=2.0,
        )
        self.loop = HostLoop(
            state=self.state,
            registry=self.registry,
            settings=_settings(url).cluster,
            state_dir=self.state_dir,
            clock=self.clock,
            heir_claimant="alpha:1:x",
            on_change=self.changes.append,
            boot_id="boot-alpha",
        )
        self.admin = ClusterDB(url)
        self.shift = 0.0
        self.hosts = Hosts(self.admin, lease_ttl=TTL, shift=lambda: self.shift)

    def step(self, seconds: float = 0.0) -> float:
        self.clock.advance(seconds)
        return self.loop.step(self.clock.monotonic())

    def close(self) -> None:
        self.state.close()
        self.admin.close()
        self.proxy.close()


@pytest.fixture
def rig(pg_url: str, tmp_path: Path) -> Iterator[Rig]:
    made = Rig(pg_url, tmp_path)
    try:
        yield made
    finally:
        made.close()


def _claim_one(rig: Rig) -> tuple[str, str]:
    board = rig.state.pg_board()
    card, _ = board.add_card(NewCard(title="t", assignee="w"), now=rig.clock.time())
    claim = board.claim(card.id, now=rig.clock.time(), claimer=ME, limits=Limits(max_in_progress=5))
    assert claim.run is not None, claim.verdict
    return card.id, claim.run.run_id


def _spawn_for(rig: Rig, run_id: str) -> str:
    session = rig.registry.spawn(
        SpawnRequest(argv=["true"], cwd="/", env={}, owner=Owner(kind="kanban", id=run_id))
    )
    return session.id


def test_joining_renewing_and_the_claim_window(rig: Rig) -> None:
    lease = rig.loop.join(rig.clock.monotonic())
    assert lease.epoch == 1 and rig.loop.connected
    assert rig.loop.may_claim(rig.clock.monotonic())
    # Without renewals, claiming stops one heartbeat before the lease would run out.
    start = rig.clock.monotonic()
    assert rig.loop.may_claim(start + TTL - HEARTBEAT - 0.01)
    assert not rig.loop.may_claim(start + TTL - HEARTBEAT)
    deadline = rig.step()
    assert deadline == pytest.approx(start + HEARTBEAT)
    rig.step(HEARTBEAT)
    assert rig.loop.may_claim(start + TTL - 0.01)  # renewed at start + 1 s
    status = read_cluster_status(rig.state_dir)
    assert status is not None and status["state"] == "live" and status["epoch"] == 1
    assert "@127.0.0.1" in status["url"] and status["host_id"] == "alpha"


def test_a_second_machine_with_a_live_host_id_is_refused(rig: Rig, tmp_path: Path) -> None:
    rig.loop.join(rig.clock.monotonic())
    before = rig.hosts.row("alpha")
    other = _restarted(rig)
    other.boot_id = "boot-other"  # another machine presenting the same host id
    with pytest.raises(DuplicateHost, match="boot-alpha") as err:
        other.join(rig.clock.monotonic())
    assert err.value.exit_code == 2
    assert rig.hosts.row("alpha") == before  # nothing written


def test_an_outage_stops_claims_backs_off_and_recovers(rig: Rig) -> None:
    rig.loop.join(rig.clock.monotonic())
    card_id, run_id = _claim_one(rig)
    rig.proxy.cut()
    deadline = rig.step(HEARTBEAT)
    assert rig.loop.membership is Membership.OUTAGE and not rig.loop.connected
    assert not rig.loop.may_claim(rig.clock.monotonic())
    assert rig.changes == [Change.OUTAGE]
    assert deadline == pytest.approx(rig.clock.monotonic() + FIRST_RETRY)
    waits = []
    for _ in range(2):
        now = rig.clock.monotonic()
        rig.clock.advance(deadline - now)
        deadline = rig.loop.step(rig.clock.monotonic())
        waits.append(round(deadline - rig.clock.monotonic(), 3))
    assert waits == [1.0, 1.0]  # doubling from 0.5 s, at most one heartbeat
    status = read_cluster_status(rig.state_dir)
    assert status is not None and status["state"] == "outage" and status["error"]
    assert rig.loop.status_line() is not None
    rig.proxy.restore()
    # The first attempt after the restore may still time out on a loaded host (a 2 s connect
    # bound); each later one is due at the deadline the loop returned. Bounded in real time.
    give_up = time.monotonic() + 60
    deadline = rig.step(1.0)
    while not rig.loop.connected and time.monotonic() < give_up:
        rig.clock.advance(max(deadline - rig.clock.monotonic(), 0.0))
        deadline = rig.loop.step(rig.clock.monotonic())
    assert rig.loop.connected and Change.RECOVERED in rig.changes
    # Nothing was lost meanwhile: the run is still open and this host's.
    run = rig.state.pg_board().get_run(run_id)
    assert run.open and rig.state.pg_board().foreign_runs([run_id]) == set()
    assert rig.state.pg_board().get_card(card_id).status is CardStatus.RUNNING


def test_a_partitioned_host_kills_its_foreign_workers_and_rejoins(rig: Rig) -> None:
    rig.loop.join(rig.clock.monotonic())
    card_id, run_id = _claim_one(rig)
    session_id = _spawn_for(rig, run_id)
    board = rig.state.pg_board()
    assert board.record_spawn(
        run_id, session_id=session_id, placement="in_process", unit=None, now=rig.clock.time()
    )
    # Cut off longer than the lease; "beta" sees it expire and rescues its run.
    rig.proxy.cut()
    rig.step(HEARTBEAT)
    rig.shift = TTL + 1
    rig.hosts.join("beta", boot_id="boot-beta", version="1")
    beta = PgBoardStore(rig.admin, HostStamp(host_id="beta", epoch=1), shift=lambda: rig.shift)
    rescued = Rescuer(beta, rig.hosts, beta.stamp, heir_claimant="b").sweep(  # type: ignore[arg-type]
        now=rig.clock.time()
    )
    assert [r.runs for r in rescued] == [(run_id,)]
    assert beta.get_card(card_id).status is CardStatus.READY
    events_before = len(beta.events_of(card_id))
    # Back: the renewal says "superseded"; the worker is killed, nothing recorded for it.
    rig.proxy.restore()
    rig.step(HEARTBEAT)
    assert rig.registry.get(session_id).state is SessionState.KILLED
    assert Change.REJOINED in rig.changes and rig.loop.connected
    assert rig.loop.stamp.epoch == 2
    # The worker's end would be recorded now: the fence refuses it.
    completed = Result(outcome=Outcome.COMPLETED, exit_code=0)
    assert board.close_run(run_id, completed, lambda c, r: CardChange(), now=0.0) is None
    run = beta.get_run(run_id)
    assert run.outcome is Outcome.LOST and run.infrastructure
    assert len(beta.events_of(card_id)) == events_before
    # Rejoined at the new epoch: it claims again.
    assert rig.loop.may_claim(rig.clock.monotonic())
    again = board.claim(card_id, now=rig.clock.time(), claimer=ME, limits=Limits(max_in_progress=5))
    assert again.run is not None


def test_claims_need_a_live_lease_at_the_current_epoch(rig: Rig) -> None:
    rig.loop.join(rig.clock.monotonic())
    board = rig.state.pg_board()
    card, _ = board.add_card(NewCard(title="t", assignee="w"), now=rig.clock.time())
    stale = PgBoardStore(rig.admin, HostStamp(host_id="alpha", epoch=7))
    verdict = stale.claim(
        card.id, now=rig.clock.time(), claimer=ME, limits=Limits(max_in_progress=5)
    ).verdict
    assert verdict.value == "no_lease"
    expired = PgBoardStore(rig.admin, HostStamp(host_id="alpha", epoch=1), shift=lambda: TTL + 1)
    verdict = expired.claim(
        card.id, now=rig.clock.time(), claimer=ME, limits=Limits(max_in_progress=5)
    ).verdict
    assert verdict.value == "no_lease"
    assert board.get_card(card.id).status is CardStatus.READY


def test_skew_at_a_minute_refuses_cron(pg_url: str, tmp_path: Path) -> None:
    rig = Rig(pg_url, tmp_path)
    try:
        rig.clock.set(time.time() + 90)  # this host's clock runs 90 s ahead of the database
        rig.loop.join(rig.clock.monotonic())
        assert rig.loop.skew is not None and rig.loop.skew > 80
        assert rig.loop.cron_refused and rig.changes == [Change.CRON]
        assert rig.loop.db_clock.time() == pytest.approx(time.time(), abs=5)
        rig.step()
        status = read_cluster_status(rig.state_dir) or {}
        assert status.get("cron_refused") is True
        assert "cron fires nothing" in (rig.loop.status_line() or "")
        # The renewal records the skew for `dispatch hosts`.
        rig.step(HEARTBEAT)
        row = rig.hosts.row("alpha")
        assert row is not None and row.skew is not None and row.skew > 80
    finally:
        rig.close()


class Crash(Exception):
    """Stands for the SIGKILL of DISPATCH_CLUSTER_FAULT: nothing after the step runs."""


class CrashAt(ClusterFault):
    def reach(self, step: str) -> None:
        if step == self.step:
            raise Crash(step)


def _restarted(rig: Rig, fault: ClusterFault | None = None) -> HostLoop:
    """A new serve on the same state dir (same boot id), as after a crash and a restart."""
    return HostLoop(
        state=rig.state,
        registry=rig.registry,
        settings=rig.loop.settings,
        state_dir=rig.state_dir,
        clock=rig.clock,
        heir_claimant="alpha:2:x",
        on_change=rig.changes.append,
        boot_id="boot-alpha",
        fault=fault,
    )


def test_a_crash_right_after_a_rebooted_join_leaves_no_stale_run(rig: Rig) -> None:
    rig.loop.join(rig.clock.monotonic())
    card_id, run_id = _claim_one(rig)
    rig.shift = TTL + 1  # the machine was down longer than its lease ...
    rig.hosts.join("alpha", boot_id="boot-new", version="1")  # ... and booted anew: epoch 2
    with pytest.raises(Crash):
        crashing = _restarted(rig, CrashAt("joined"))
        crashing.boot_id = "boot-new"
        crashing.join(rig.clock.monotonic())
    again = _restarted(rig)
    again.boot_id = "boot-new"
    assert again.join(rig.clock.monotonic()).epoch == 2
    run = rig.state.pg_board().get_run(run_id)
    assert run.outcome is Outcome.LOST and run.infrastructure
    assert rig.state.pg_board().get_card(card_id).status is CardStatus.READY


def test_a_crash_between_killing_foreign_workers_and_rejoining(rig: Rig) -> None:
    rig.loop.join(rig.clock.monotonic())
    _card_id, run_id = _claim_one(rig)
    session_id = _spawn_for(rig, run_id)
    rig.loop.fault = CrashAt("superseded")
    rig.shift = TTL + 1
    rig.hosts.join("beta", boot_id="boot-beta", version="1")
    beta = PgBoardStore(rig.admin, HostStamp(host_id="beta", epoch=1))
    Rescuer(beta, rig.hosts, HostStamp(host_id="beta", epoch=1), heir_claimant="b").sweep(now=0.0)
    with pytest.raises(Crash):
        rig.step(HEARTBEAT)
    assert rig.registry.get(session_id).state is SessionState.KILLED
    # The restarted serve rejoins at the rescuer's epoch; nothing is killed or closed twice.
    again = _restarted(rig)
    assert again.join(rig.clock.monotonic()).epoch == 2
    assert again.kill_foreign() == 0
    assert again.may_claim(rig.clock.monotonic())


def test_after_an_outage_the_others_get_a_whole_lease_before_any_rescue(rig: Rig) -> None:
    rig.loop.join(rig.clock.monotonic())
    rig.hosts.join("beta", boot_id="boot-beta", version="1")
    beta = PgBoardStore(rig.admin, HostStamp(host_id="beta", epoch=1))
    card, _ = beta.add_card(NewCard(title="t", assignee="w"), now=rig.clock.time())
    assert beta.claim(card.id, now=0.0, claimer=ME, limits=Limits(max_in_progress=5)).run
    rig.proxy.cut()
    rig.step(HEARTBEAT)
    assert not rig.loop.connected
    rig.proxy.restore()
    # Everyone was cut off meanwhile: beta's lease ran out on the database clock.
    with rig.admin.write(None) as conn:
        conn.execute(
            "UPDATE hosts SET lease_until = now() - interval '1 hour' WHERE host_id = ?", ("beta",)
        )
    rig.step(1.0)
    assert rig.loop.connected and beta.get_card(card.id).status is CardStatus.RUNNING
    for _ in range(int(TTL / HEARTBEAT) - 1):
        rig.step(HEARTBEAT)  # renewing and sweeping, but a whole lease has not passed yet
    assert beta.get_card(card.id).status is CardStatus.RUNNING
    rig.step(HEARTBEAT)
    assert beta.get_card(card.id).status is CardStatus.READY
    assert Change.RESCUED in rig.changes
