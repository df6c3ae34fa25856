"""Cluster claims on a real PostgreSQL: skip-locked picks, caps under concurrent hosts, the
query plans, and crash points inside a claim and a rescue."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dispatcher.cluster.board import _FACTS, _PICK, HostStamp, PgBoardStore
from dispatcher.cluster.database import BUDGET_LOCK, ClusterDB
from dispatcher.cluster.faults import ENV_CLUSTER_FAULT
from dispatcher.cluster.hosts import Hosts
from dispatcher.cluster.rescue import Rescuer
from dispatcher.kanban.abc import ClaimVerdict
from dispatcher.kanban.model import (
    CardChange,
    CardStatus,
    Limits,
    NewCard,
)
from dispatcher.kanban.store import ready_query
from dispatcher.kanban.tick import WALK_PAGE
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.outcome import Outcome, Result
from tests.support.wait import wait_for

pytestmark = pytest.mark.postgres

NOW = 1_800_000_000.0
ROOT = Path(__file__).resolve().parent.parent
ME = Claimant(pid=1, start=1, boot=None)
OTHER = Claimant(pid=2, start=2, boot=None)


@pytest.fixture
def db(cluster_db: ClusterDB) -> ClusterDB:
    return cluster_db


def _hosts(db: ClusterDB, *names: str) -> Hosts:
    hosts = Hosts(db, lease_ttl=300)
    for name in names:
        hosts.join(name, boot_id=f"boot-{name}", version="1")
    return hosts


def _cards(store: PgBoardStore, count: int) -> list[str]:
    return [
        store.add_card(NewCard(title=f"c{i}", assignee="a"), now=NOW)[0].id for i in range(count)
    ]


def test_a_card_another_host_is_claiming_is_skipped_not_waited_for(
    db: ClusterDB, pg_url: str
) -> None:
    _hosts(db, "a")
    store = PgBoardStore(db, HostStamp(host_id="a", epoch=1))
    first, second = _cards(store, 2)
    with ClusterDB(pg_url) as other, other.write(None) as conn:
        # Another claimer holds the first card's row (as its claim transaction would).
        conn.execute("SELECT id FROM kanban_cards WHERE id = ? FOR UPDATE", (first,))
        started = time.monotonic()
        skipped = store.claim(
            first,
            now=NOW,
            claimer=ME,
            limits=Limits(max_in_progress=9),
        )
        took = time.monotonic() - started
        taken = store.claim(
            second,
            now=NOW,
            claimer=ME,
            limits=Limits(max_in_progress=9),
        )
    assert skipped.verdict is ClaimVerdict.NOT_READY and took < 5
    assert taken.verdict is ClaimVerdict.CLAIMED
    again = store.claim(
        first,
        now=NOW,
        claimer=ME,
        limits=Limits(max_in_progress=9),
    )
    assert again.verdict is ClaimVerdict.CLAIMED


def test_caps_hold_while_three_hosts_claim_and_finish_at_once(db: ClusterDB, pg_url: str) -> None:
    names = ("a", "b", "c")
    _hosts(db, *names)
    card_ids = _cards(PgBoardStore(db), 150)
    cap, per_host = 7, 3
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(names))

    def host(name: str) -> None:
        try:
            with ClusterDB(pg_url, max_size=1) as own:
                store = PgBoardStore(own, HostStamp(host_id=name, epoch=1), host_max=per_host)
                barrier.wait(timeout=10)
                mine: list[str] = []
                for card_id in card_ids:
                    claim = store.claim(
                        card_id,
                        now=NOW,
                        claimer=ME,
                        limits=Limits(max_in_progress=cap),
                    )
                    if claim.run is not None:
                        mine.append(claim.run.run_id)
                        seen.append(store.open_counts())
                    elif claim.verdict in (ClaimVerdict.BUDGET, ClaimVerdict.HOST_BUDGET) and mine:
                        # At a cap: finish the oldest, so the budget moves all the time.
                        store.close_run(
                            mine.pop(0),
                            Result(outcome=Outcome.COMPLETED, exit_code=0),
                            lambda c, r: CardChange(fields={"status": CardStatus.DONE}),
                            now=NOW,
                        )
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=host, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert seen, "nothing was claimed"
    assert max(total for total, _ in seen) == cap  # reached, never passed
    assert max(mine for _, mine in seen) == per_host
    with db.read() as conn:
        rows = conn.execute(
            "SELECT card_id, count(*) FROM kanban_runs GROUP BY card_id HAVING count(*) > 1"
        ).fetchall()
        doubled_open = conn.execute(
            "SELECT card_id FROM kanban_runs WHERE outcome IS NULL GROUP BY card_id"
            " HAVING count(*) > 1"
        ).fetchall()
    assert rows == [] and doubled_open == []  # no card ever ran twice


def test_the_claim_statements_never_scan_the_board(db: ClusterDB) -> None:
    _hosts(db, "a")
    store = PgBoardStore(db, HostStamp(host_id="a", epoch=1))
    with db.write(None) as conn:
        conn.execute(
            "INSERT INTO kanban_cards (id, title, assignee, status, created_at, updated_at)"
            " SELECT 'c_' || lpad(to_hex(g), 10, '0'), 't', 'a', 'ready', g, g"
            " FROM generate_series(1, 20000) g"
        )
        conn.execute("ANALYZE kanban_cards")
        conn.execute("ANALYZE kanban_runs")
    card_id = "c_" + "0" * 6 + "1234"
    with db.read() as conn:
        plans = []
        for sql, params in (
            (_PICK, (card_id, BUDGET_LOCK)),
            (_FACTS, (0.0, "a", "a", card_id, "a", 1, 0.0)),
        ):
            rows = conn.execute("EXPLAIN " + sql, params).fetchall()
            plans.append("\n".join(r[0] for r in rows))
    for plan in plans:
        assert "Seq Scan on kanban_cards" not in plan, plan
    claim = store.claim(
        card_id,
        now=NOW,
        claimer=ME,
        limits=Limits(max_in_progress=9),
    )
    assert claim.verdict is ClaimVerdict.CLAIMED


_CRASH = """
import sys
from dispatcher.cluster.board import HostStamp, PgBoardStore
from dispatcher.cluster.database import ClusterDB
from dispatcher.cluster.faults import ClusterFault
from dispatcher.cluster.hosts import Hosts
from dispatcher.cluster.rescue import Rescuer
from dispatcher.kanban.model import Limits
from dispatcher.launch.claimant import Claimant
url, step, card = sys.argv[1:4]
db = ClusterDB(url, max_size=1)
fault = ClusterFault(step)
store = PgBoardStore(db, HostStamp(host_id="a", epoch=1), fault=fault)
if step == "claim_counted":
    me = Claimant(pid=1, start=1, boot=None)
    store.claim(card, now=1.0, claimer=me, limits=Limits(max_in_progress=9))
else:
    hosts = Hosts(db, lease_ttl=300, shift=lambda: 400.0)
    heir = HostStamp(host_id="b", epoch=1)
    Rescuer(store, hosts, heir, heir_claimant="x", fault=fault).sweep(now=1.0)
print("survived")
"""


def _crash(url: str, step: str, card: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), ENV_CLUSTER_FAULT: step}
    return subprocess.run(
        [sys.executable, "-c", _CRASH, url, step, card],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _until_abandoned_transactions_end(db: ClusterDB) -> None:
    """The server ends a killed client's backend (releasing its locks) only once it reads the
    closed socket; under load that can lag the client's death by a moment."""

    def open_transactions() -> int:
        with db.connect() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
            ).fetchone()
        return int(row[0]) if row else 0

    wait_for(lambda: open_transactions() == 0, timeout=20, what="the killed client's backend")


def test_a_claimer_killed_inside_its_claim_leaves_the_card_claimable(
    db: ClusterDB, pg_url: str
) -> None:
    _hosts(db, "a", "b")
    (card_id,) = _cards(PgBoardStore(db), 1)
    died = _crash(pg_url, "claim_counted", card_id)
    assert died.returncode == -9 and "survived" not in died.stdout, died.stderr
    _until_abandoned_transactions_end(db)
    other = PgBoardStore(db, HostStamp(host_id="b", epoch=1))
    assert other.get_card(card_id).status is CardStatus.READY
    claim = other.claim(
        card_id,
        now=NOW,
        claimer=OTHER,
        limits=Limits(max_in_progress=9),
    )
    assert claim.verdict is ClaimVerdict.CLAIMED and other.runs_of(card_id)[0].attempt == 1


def test_a_rescuer_killed_mid_rescue_changes_nothing(db: ClusterDB, pg_url: str) -> None:
    hosts = _hosts(db, "a", "b")
    on_a = PgBoardStore(db, HostStamp(host_id="a", epoch=1))
    (card_id,) = _cards(on_a, 1)
    run = on_a.claim(
        card_id,
        now=NOW,
        claimer=ME,
        limits=Limits(max_in_progress=9),
    ).run
    assert run is not None
    died = _crash(pg_url, "rescue_taken", card_id)
    assert died.returncode == -9, died.stderr
    _until_abandoned_transactions_end(db)
    assert hosts.row("a").epoch == 1  # type: ignore[union-attr]
    assert on_a.get_run(run.run_id).open
    # The next rescue does it whole, once.
    later = Hosts(db, lease_ttl=300, shift=lambda: 400.0)
    rescued = Rescuer(on_a, later, HostStamp(host_id="b", epoch=1), heir_claimant="x").sweep(
        now=NOW
    )
    assert [r.runs for r in rescued] == [(run.run_id,)]
    assert on_a.get_card(card_id).status is CardStatus.READY


def test_the_walk_skips_cards_backing_off_through_an_index(db: ClusterDB) -> None:
    with db.write(None) as conn:
        conn.execute(
            "INSERT INTO kanban_cards (id, title, assignee, status, priority, created_at,"
            " updated_at, retry_at) SELECT 'c_' || lpad(to_hex(g), 10, '0'), 't', 'a', 'ready',"
            " mod(g, 2) * 5, g, g, CASE WHEN mod(g, 2) = 1 THEN 4e9 END"
            " FROM generate_series(1, 20000) g"
        )
        conn.execute("ANALYZE kanban_cards")
    sql, params = ready_query(limit=WALK_PAGE, now=NOW)
    with db.read() as conn:
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql, params).fetchall())
    assert "Seq Scan" not in plan and "kanban_cards_ready" in plan, plan
    assert "kanban_cards_retry" in plan, plan
    page = PgBoardStore(db).ready_cards(limit=WALK_PAGE, now=NOW)
    assert len(page) == WALK_PAGE and all(c.retry_at is None for c in page)
