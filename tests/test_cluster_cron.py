"""Cron in cluster mode on a real PostgreSQL ledger: three hosts' schedulers (fake clocks and
fake registries, one ledger) fire every occurrence exactly once with no leader, catch up once
after a whole-cluster outage, share pause state, a dead host's fires are settled, and a
fire's retry is started by whichever host comes to it first."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pytest

from dispatcher.app.database import open_state
from dispatcher.cluster.board import HostStamp, PgBoardStore
from dispatcher.cluster.database import ClusterDB
from dispatcher.cluster.hosts import Hosts
from dispatcher.cluster.ledger import PgLedger
from dispatcher.cluster.rescue import Rescuer
from dispatcher.cron.records import Status
from dispatcher.cron.scheduler import CronScheduler
from dispatcher.cron.settings import CatchUpPolicy, CronJob, CronSettings
from dispatcher.cron.zones import fixed_zone
from dispatcher.launch.outcome import Outcome
from dispatcher.launch.retry import Backoff, Jitter, RetryPolicy
from registry.fake import FakeRegistry
from scope.foundation.clock import FakeClock

pytestmark = pytest.mark.postgres

T0 = dt.datetime(2026, 1, 5, 10, 0, 0, tzinfo=dt.UTC).timestamp()
EVERY_SECOND = CronJob(id="tick", every=1.0, command=("work",))


class Host:
    """One host's scheduler on the shared ledger."""

    def __init__(self, name: str, db: ClusterDB, tmp: Path, clock: FakeClock, *jobs: CronJob):
        self.name = name
        self.stamp = HostStamp(host_id=name, epoch=1)
        self.ledger = PgLedger(db, self.stamp)
        self.registry = FakeRegistry(clock=clock)
        self.local = open_state(tmp / name)
        self.scheduler = CronScheduler(
            CronSettings(jobs=jobs),
            self.registry,
            self.local,
            clock=clock,
            environ={"PATH": "/usr/bin:/bin"},
            state_dir=tmp / name,
            zone_resolver=fixed_zone("UTC"),
            rng=random.Random(1),
            ledger=self.ledger,
        )

    def close(self) -> None:
        self.local.close()


@pytest.fixture
def db(cluster_db: ClusterDB) -> ClusterDB:
    return cluster_db


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


def _hosts(db: ClusterDB, tmp: Path, clock: FakeClock, *jobs: CronJob) -> list[Host]:
    return [Host(name, db, tmp, clock, *jobs) for name in ("a", "b", "c")]


def _fires(db: ClusterDB) -> list[tuple[str, str | None, str | None, str | None]]:
    with db.read() as conn:
        rows = conn.execute(
            "SELECT fire_key, host_id, outcome, session_id FROM cron_fires ORDER BY nominal"
        ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def test_every_fire_once_with_no_leader(db: ClusterDB, tmp_path: Path, clock: FakeClock) -> None:
    hosts = _hosts(db, tmp_path, clock, EVERY_SECOND)
    try:
        for host in hosts:
            host.scheduler.catch_up(clock.time())
        for second in range(1, 31):
            clock.set(T0 + second + 0.001)
            # Every host tries every fire; the order in which they come round varies.
            for host in hosts[second % 3 :] + hosts[: second % 3]:
                host.scheduler.tick(clock.time())
            for host in hosts:
                for session in host.registry.running():
                    host.registry.finish(session.id, exit_code=0)
                host.scheduler.tick(clock.time())  # settles its own (the finish listener's part)
        fires = _fires(db)
        keys = [key for key, *_ in fires]
        assert len(keys) == len(set(keys)) == 30  # none twice, none missed
        assert {host for _, host, _, _ in fires} == {"a", "b", "c"}
        started = sum(len(h.registry.sessions) for h in hosts)
        assert started == 30  # each fire's worker started on exactly one host
        assert all(outcome == "completed" for _, _, outcome, _ in fires)
        # Each host's ledger view holds only its own started fires.
        assert all(h.ledger.count_workers() == 0 for h in hosts)
    finally:
        for host in hosts:
            host.close()


def test_catch_up_after_a_whole_cluster_outage_is_decided_once(
    db: ClusterDB, tmp_path: Path, clock: FakeClock
) -> None:
    job = CronJob(
        id="m",
        schedule="* * * * *",
        command=("work",),
        catch_up=CatchUpPolicy.LATEST,
        catch_up_window=3600.0,
    )
    hosts = _hosts(db, tmp_path, clock, job)
    try:
        for host in hosts:
            host.scheduler.catch_up(clock.time())
        clock.set(T0 + 10 * 60 + 5)  # every host was down for ten minutes
        for host in hosts:
            host.scheduler.catch_up(clock.time())
        fires = _fires(db)
        outcomes = [outcome for _, _, outcome, _ in fires]
        assert len(fires) == 10 and len({key for key, *_ in fires}) == 10
        assert outcomes.count(Outcome.COALESCED.value) == 9  # the policy, applied once
        assert sum(len(h.registry.sessions) for h in hosts) == 1
    finally:
        for host in hosts:
            host.close()


def test_pause_is_cluster_wide(db: ClusterDB, tmp_path: Path, clock: FakeClock) -> None:
    hosts = _hosts(db, tmp_path, clock, EVERY_SECOND)
    try:
        for host in hosts:
            host.scheduler.catch_up(clock.time())
        assert hosts[0].ledger.set_paused("tick", True, clock.time())
        for second in range(1, 6):
            clock.set(T0 + second)
            for host in hosts:
                host.scheduler.tick(clock.time())
        assert _fires(db) == []
        assert hosts[2].ledger.job_states()["tick"].paused is True
    finally:
        for host in hosts:
            host.close()


def test_a_dead_hosts_fires_are_settled_by_the_rescuer(
    db: ClusterDB, tmp_path: Path, clock: FakeClock
) -> None:
    hosts = Hosts(db, lease_ttl=30)
    for name in ("a", "b"):
        hosts.join(name, boot_id=f"boot-{name}", version="1")
    job = CronJob(id="j", every=1.0, command=("work",), jitter=30.0)
    a, b = Host("a", db, tmp_path, clock, job), Host("b", db, tmp_path, clock, job)
    try:
        a.scheduler.catch_up(clock.time())
        clock.set(T0 + 1.001)
        a.scheduler.tick(clock.time())  # decided and claimed, waiting for its jitter
        with db.write(None) as conn:
            conn.execute(
                "INSERT INTO cron_fires (fire_key, job_id, kind, nominal_wall, zone, nominal,"
                " decided_at, status, session_id, host_id, claimant)"
                " VALUES ('j@started', 'j', 'schedule', 'w', 'UTC', 1, 1, 'running', 's_x', 'a',"
                " 'dead')"
            )
        claimed = [r for r in a.ledger.open_rows((Status.CLAIMED,))]
        assert len(claimed) == 1 and b.ledger.open_rows((Status.CLAIMED,)) == []
        later = Hosts(db, lease_ttl=30, shift=lambda: 60.0)
        board = PgBoardStore(db, b.stamp)
        rescued = Rescuer(board, later, b.stamp, heir_claimant=b.scheduler.claimant).sweep(
            now=clock.time()
        )
        assert [(r.fires_lost, r.fires_taken) for r in rescued] == [
            (("j@started",), (claimed[0].fire_key,))
        ]
        assert b.ledger.by_key("j@started").outcome is Outcome.LOST  # type: ignore[union-attr]
        clock.set(T0 + 40)
        b.scheduler.tick(clock.time())  # the inherited fire runs here
        assert next(s.owner.id for s in b.registry.sessions.values()) == claimed[0].fire_key
        assert PgLedger(db).by_key(claimed[0].fire_key).status is Status.RUNNING  # type: ignore[union-attr]
    finally:
        a.close()
        b.close()


def test_a_retry_outlives_the_host_that_ran_the_failed_try(
    db: ClusterDB, tmp_path: Path, clock: FakeClock
) -> None:
    retry = RetryPolicy(attempts=2, backoff=Backoff(initial=10.0, jitter=Jitter.NONE))
    job = CronJob(id="r", schedule="*/5 * * * *", command=("work",), retry=retry)
    a, b = Host("a", db, tmp_path, clock, job), Host("b", db, tmp_path, clock, job)
    try:
        for host in (a, b):
            host.scheduler.catch_up(clock.time())
        clock.set(T0 + 300.001)
        a.scheduler.tick(clock.time())  # a decides and runs the fire's first try
        (first,) = a.registry.running()
        a.registry.finish(first.id, exit_code=1)
        a.scheduler.tick(clock.time())
        waiting = PgLedger(db).by_key("r@2026-01-05T10:05:00")
        assert waiting is not None and waiting.status is Status.RETRY
        # Every host sees a waiting retry; a is gone, so b starts it at its time.
        assert [r.id for r in b.ledger.open_rows((Status.RETRY,))] == [waiting.id]
        clock.set(T0 + 311)
        b.scheduler.tick(clock.time())
        (second,) = b.registry.running()
        assert second.owner.id == waiting.fire_key and second.labels["try"] == "2"
        b.registry.finish(second.id, exit_code=0)
        b.scheduler.tick(clock.time())
        done = PgLedger(db).by_key(waiting.fire_key)
        assert done is not None and done.outcome is Outcome.COMPLETED
        assert [t.session_id for t in done.tries] == [first.id, second.id]
        assert _fires(db)[0][1] == "b"  # the host that ran the last try
        assert a.scheduler.tick(clock.time()).started == ()  # never twice
    finally:
        a.close()
        b.close()
