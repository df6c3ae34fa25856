"""Host leases, epochs, rescue and fencing on a real PostgreSQL, with the database clock shifted
by the test instead of waiting for leases to run out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.cluster.board import HostStamp, PgBoardStore
from dispatcher.cluster.database import ClusterDB
from dispatcher.cluster.hosts import DuplicateHost, Hosts, Superseded
from dispatcher.cluster.rescue import Rescuer
from dispatcher.kanban.abc import ClaimVerdict
from dispatcher.kanban.errors import StaleRun
from dispatcher.kanban.model import (
    CardChange,
    CardStatus,
    EventKind,
    Limits,
    NewCard,
)
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.outcome import Outcome, Result
from scope.foundation.clock import FakeClock

pytestmark = pytest.mark.postgres

NOW = 1_800_000_000.0
TTL = 30.0
ME = Claimant(pid=1, start=1, boot=None)


class Shift:
    """The database clock as the hosts see it: real ``now()`` plus ``seconds``."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


@pytest.fixture
def db(cluster_db: ClusterDB) -> ClusterDB:
    return cluster_db


@pytest.fixture
def shift() -> Shift:
    return Shift()


@pytest.fixture
def hosts(db: ClusterDB, shift: Shift) -> Hosts:
    return Hosts(db, lease_ttl=TTL, shift=shift)


def test_a_restart_within_the_lease_keeps_the_epoch(hosts: Hosts, shift: Shift) -> None:
    first = hosts.join("a", boot_id="boot-1", version="1")
    assert first.epoch == 1 and not first.new_epoch
    assert first.lease_until == pytest.approx(first.db_now + TTL, abs=0.01)
    shift.seconds = 10
    again = hosts.join("a", boot_id="boot-1", version="1")
    assert again.epoch == 1 and not again.new_epoch
    renewed = hosts.renew("a", 1)
    assert renewed.lease_until > first.lease_until


def test_a_live_host_id_held_by_another_machine_is_refused(hosts: Hosts, shift: Shift) -> None:
    hosts.join("a", boot_id="boot-1", version="1")
    with pytest.raises(DuplicateHost, match="boot-1") as err:
        hosts.join("a", boot_id="boot-2", version="1")
    assert err.value.exit_code == 2
    assert hosts.rows()[0].boot_id == "boot-1"
    shift.seconds = TTL + 1
    rebooted = hosts.join("a", boot_id="boot-2", version="1")
    assert rebooted.epoch == 2 and rebooted.new_epoch


def test_leases_expire_on_the_database_clock(hosts: Hosts, shift: Shift) -> None:
    hosts.join("a", boot_id="b", version="1")
    hosts.join("b", boot_id="c", version="1")
    shift.seconds = TTL - 1
    assert hosts.expired() == []
    hosts.renew("b", 1)
    shift.seconds = TTL + 1
    assert hosts.expired() == [("a", 1)]
    rows = {row.host_id: row for row in hosts.rows()}
    assert not rows["a"].live and rows["b"].live


def test_rescue_closes_lost_runs_once_and_fences_the_old_host(
    db: ClusterDB, hosts: Hosts, shift: Shift
) -> None:
    hosts.join("a", boot_id="boot-a", version="1")
    hosts.join("b", boot_id="boot-b", version="1")
    on_a = PgBoardStore(db, HostStamp(host_id="a", epoch=1))
    on_b = PgBoardStore(db, HostStamp(host_id="b", epoch=1))
    card, _ = on_a.add_card(NewCard(title="t", assignee="x"), now=NOW)
    claim = on_a.claim(card.id, now=NOW, claimer=ME, limits=Limits(max_in_progress=5))
    assert claim.run is not None
    run_id = claim.run.run_id
    assert on_a.record_spawn(run_id, session_id="s_1", placement="scoped", unit="u", now=NOW)

    shift.seconds = TTL + 1  # a is partitioned away; b keeps renewing
    hosts.renew("b", 1)
    rescuer = Rescuer(on_b, hosts, on_b.stamp, heir_claimant="b:1:x")  # type: ignore[arg-type]
    rescued = rescuer.rescue("a", 1, now=NOW + 40)
    assert rescued is not None and rescued.runs == (run_id,) and rescued.epoch == 2
    assert rescuer.rescue("a", 1, now=NOW + 41) is None  # never twice

    run = on_b.get_run(run_id)
    assert run.outcome is Outcome.LOST and run.infrastructure
    rescued = on_b.get_card(card.id)
    assert rescued.status is CardStatus.READY and rescued.consecutive_failures == 0
    assert EventKind.INTERRUPTED in [e.kind for e in on_b.events_of(card.id)]

    # a comes back: every write it makes about its old run changes nothing.
    done = CardChange(fields={"status": CardStatus.DONE})
    result = Result(outcome=Outcome.COMPLETED, exit_code=0)
    assert on_a.close_run(run_id, result, lambda c, r: done, now=NOW + 50) is None
    with pytest.raises(StaleRun):
        on_a.worker_move(card.id, run_id, CardStatus.DONE, now=NOW + 50)
    with pytest.raises(Superseded):
        hosts.renew("a", 1)
    back = hosts.join("a", boot_id="boot-a", version="1")
    assert back.epoch == 2 and not back.new_epoch
    assert on_b.get_card(card.id).status is CardStatus.READY


def test_a_run_of_a_current_epoch_is_never_rescued(
    db: ClusterDB, hosts: Hosts, shift: Shift
) -> None:
    hosts.join("a", boot_id="boot-a", version="1")
    store = PgBoardStore(db, HostStamp(host_id="a", epoch=1))
    card, _ = store.add_card(NewCard(title="t", assignee="x"), now=NOW)
    store.claim(card.id, now=NOW, claimer=ME, limits=Limits(max_in_progress=5))
    shift.seconds = TTL - 1
    other = HostStamp(host_id="b", epoch=1)
    assert Rescuer(store, hosts, other, heir_claimant="x").rescue("a", 1, now=NOW) is None
    assert Rescuer(store, hosts, other, heir_claimant="x").sweep(now=NOW) == []
    assert store.get_card(card.id).status is CardStatus.RUNNING


def test_a_rebooted_host_rescues_its_own_old_runs(
    db: ClusterDB, hosts: Hosts, shift: Shift
) -> None:
    hosts.join("a", boot_id="boot-1", version="1")
    store = PgBoardStore(db, HostStamp(host_id="a", epoch=1))
    card, _ = store.add_card(NewCard(title="t", assignee="x"), now=NOW)
    run = store.claim(card.id, now=NOW, claimer=ME, limits=Limits(max_in_progress=5)).run
    assert run is not None
    shift.seconds = TTL + 1
    lease = hosts.join("a", boot_id="boot-2", version="1")
    assert lease.new_epoch
    store.stamp = HostStamp(host_id="a", epoch=lease.epoch)
    assert store.rescue_stale("a", lease.epoch, now=NOW + 40) == [run.run_id]
    assert store.get_card(card.id).status is CardStatus.READY


def test_the_per_host_budget(db: ClusterDB, hosts: Hosts) -> None:
    hosts.join("a", boot_id="x", version="1")
    hosts.join("b", boot_id="y", version="1")
    on_a = PgBoardStore(db, HostStamp(host_id="a", epoch=1))
    on_b = PgBoardStore(db, HostStamp(host_id="b", epoch=1))
    ids = [on_a.add_card(NewCard(title=f"{i}", assignee="x"), now=NOW)[0].id for i in range(3)]
    limits = Limits(max_in_progress=10, host_max=1)
    assert on_a.claim(ids[0], now=NOW, claimer=ME, limits=limits).verdict is ClaimVerdict.CLAIMED
    refused = on_a.claim(ids[1], now=NOW, claimer=ME, limits=limits)
    assert refused.verdict is ClaimVerdict.HOST_BUDGET
    assert on_b.claim(ids[1], now=NOW, claimer=ME, limits=limits).verdict is ClaimVerdict.CLAIMED


def test_skew_is_measured_against_the_database(hosts: Hosts) -> None:
    assert abs(hosts.measure_skew()) < 1.0
    assert hosts.measure_skew(FakeClock(0.0)) < -1e9


def test_dispatch_hosts_lists_leases(
    db: ClusterDB, hosts: Hosts, shift: Shift, pg_url: str, tmp_path: Path
) -> None:
    hosts.join("alpha", boot_id="boot-a", version="0.1.0")
    hosts.join("beta", boot_id="boot-b", version="0.1.0")
    store = PgBoardStore(db, HostStamp(host_id="alpha", epoch=1))
    card, _ = store.add_card(NewCard(title="t", assignee="x"), now=NOW)
    store.claim(card.id, now=NOW, claimer=ME, limits=Limits(max_in_progress=5))
    env = {**os.environ, "DISPATCH_DATABASE_URL": pg_url}
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher.cli.main",
            "hosts",
            "--json",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    rows = {row["host_id"]: row for row in json.loads(shown.stdout)}
    assert rows["alpha"]["lease"] == "live" and rows["alpha"]["running_runs"] == 1
    assert rows["beta"]["running_runs"] == 0 and rows["beta"]["boot_id"] == "boot-b"
    alone = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.main", "hosts", "--state-dir", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        env={k: v for k, v in env.items() if k != "DISPATCH_DATABASE_URL"},
        timeout=60,
        check=False,
    )
    assert alone.returncode == 2 and "no cluster database" in alone.stderr
    assert len(alone.stderr.strip().splitlines()) == 1
