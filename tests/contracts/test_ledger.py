"""The cron-ledger contract (:class:`dispatcher.cron.abc.LedgerStore`), run against every backend.

``BACKENDS``: in memory (:class:`dispatcher.cron.memory.MemoryLedger`), SQLite (the state
database's :class:`dispatcher.cron.ledger.Ledger`) and PostgreSQL (cluster mode's
:class:`dispatcher.cluster.ledger.PgLedger`; the ``postgres`` tier). Each test states one
promise the scheduler relies on: unique fire keys, compare-and-set status changes, watermarks
that never go back, pause/resume (with dispatch's own reason), all-or-nothing transactions,
history and pruning, a fire's tries and pending retry, and a worker's deferral.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.app.database import open_state
from dispatcher.cluster.board import PgBoardStore
from dispatcher.cluster.database import ClusterDB
from dispatcher.cluster.ledger import PgLedger
from dispatcher.cron.abc import LedgerStore, Take
from dispatcher.cron.changes import FireChange
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.memory import MemoryLedger
from dispatcher.cron.records import Kind, RetryKind, Status, Try
from dispatcher.kanban.memory import MemoryBoardStore
from dispatcher.kanban.model import CardChange, CardStatus, Limits, NewCard
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.holds import MemoryHolds
from dispatcher.launch.limits import LimitSpec
from dispatcher.launch.outcome import Outcome, Result

NOW = 1_800_000_000.0
BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], LedgerStore]]:
    """Opens the backend; each call is a new handle on the same ledger (another "process"; in
    memory there is one ledger, so one handle, which is safe to share between threads)."""
    states: list[Any] = []
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""
    memory = MemoryLedger()

    def open_one() -> LedgerStore:
        if request.param == "memory":
            return memory
        if url:
            cluster = ClusterDB(url, max_size=1)
            states.append(cluster)
            cluster.migrate()
            return PgLedger(cluster)
        state = open_state(tmp_path / "state")
        states.append(state)
        return Ledger(state)

    yield open_one
    for state in states:
        state.close()


@pytest.fixture
def ledger(opener: Callable[[], LedgerStore]) -> LedgerStore:
    return opener()


def row(job: str = "j", minute: int = 0, **extra: Any) -> dict[str, Any]:
    """A scheduled fire's row as the scheduler inserts it."""
    wall = f"2027-01-15T09:{minute:02d}:00"
    return {
        "fire_key": f"{job}@{wall}",
        "job_id": job,
        "kind": Kind.SCHEDULE,
        "nominal_wall": wall,
        "zone": "UTC",
        "nominal": NOW + 60 * minute,
        "decided_at": NOW + 60 * minute,
        "status": Status.CLAIMED,
        **extra,
    }


def test_a_fire_key_is_owned_by_exactly_one_insert(ledger: LedgerStore) -> None:
    with ledger.transaction() as tx:
        first = tx.insert(**row())
    with ledger.transaction() as tx:
        second = tx.insert(**row(), claimant="other")
    assert first is not None and second is None
    found = ledger.by_key("j@2027-01-15T09:00:00")
    assert found is not None and found.id == first and found.claimant is None


def test_concurrent_schedulers_run_each_fire_once(opener: Callable[[], LedgerStore]) -> None:
    handles = [opener() for _ in range(4)]
    barrier = threading.Barrier(len(handles))
    won: list[int] = []

    def scheduler(handle: LedgerStore) -> None:
        barrier.wait(timeout=5)
        for minute in range(20):
            with handle.transaction() as tx:
                row_id = tx.insert(**row(minute=minute))
            if row_id is not None:
                won.append(minute)

    threads = [threading.Thread(target=scheduler, args=(h,)) for h in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert sorted(won) == list(range(20))


def test_status_changes_are_compare_and_set(ledger: LedgerStore) -> None:
    with ledger.transaction() as tx:
        row_id = tx.insert(**row())
    assert row_id is not None
    assert ledger.update(row_id, [Status.CLAIMED], FireChange(status=Status.SPAWNING))
    assert not ledger.update(row_id, [Status.CLAIMED], FireChange(status=Status.RUNNING))
    assert ledger.update(
        row_id, [Status.SPAWNING], FireChange(status=Status.RUNNING, session_id="s_1")
    )
    got = ledger.get(row_id)
    assert got.status is Status.RUNNING and got.session_id == "s_1"
    with pytest.raises(KeyError):
        ledger.get(row_id + 1000)


def test_a_failed_transaction_leaves_nothing(ledger: LedgerStore) -> None:
    with pytest.raises(RuntimeError), ledger.transaction() as tx:
        tx.insert(**row(minute=1))
        tx.set_watermark("j", NOW + 600, NOW)
        raise RuntimeError("the tick crashed")
    assert ledger.by_key("j@2027-01-15T09:01:00") is None
    assert "j" not in ledger.job_states()


def test_watermarks_only_move_forward(ledger: LedgerStore) -> None:
    with ledger.transaction() as tx:
        tx.set_watermark("j", NOW + 100, NOW)
        tx.set_watermark("j", NOW + 50, NOW)
        tx.set_watermarks(["j", "k"], NOW + 70)
    states = ledger.job_states()
    assert states["j"].watermark == NOW + 100
    assert states["k"].watermark == NOW + 70
    with ledger.transaction() as tx:
        assert set(tx.job_states(["k", "missing"])) == {"k"}


def test_pause_and_resume(ledger: LedgerStore) -> None:
    assert ledger.set_paused("j", True, NOW)
    assert not ledger.set_paused("j", True, NOW + 1)
    paused = ledger.job_states()["j"]
    assert paused.paused is True and paused.paused_at == NOW
    assert ledger.set_paused("j", False, NOW + 300)
    resumed = ledger.job_states()["j"]
    assert resumed.paused is False and resumed.paused_at is None
    assert resumed.watermark == NOW + 300
    assert ledger.known_job("j") and not ledger.known_job("never")


def test_open_rows_workers_and_history(ledger: LedgerStore) -> None:
    with ledger.transaction() as tx:
        existing = tx.existing_keys(["j@2027-01-15T09:00:00"])
        ids = tx.insert_many([row(minute=m) for m in range(3)] + [row("k", 0)])
    assert existing == set() and len(ids) == 4
    ledger.update(ids[0], [Status.CLAIMED], FireChange(status=Status.RUNNING))
    ledger.update(
        ids[1], [Status.CLAIMED], FireChange(status=Status.DONE, outcome=Outcome.COMPLETED)
    )
    assert ledger.count_workers() == 1
    assert [r.id for r in ledger.open_rows()] == [ids[0], ids[2], ids[3]]
    assert [r.id for r in ledger.open_rows([Status.RUNNING])] == [ids[0]]
    with ledger.transaction() as tx:
        assert [r.id for r in tx.open_rows("j")] == [ids[0], ids[2]]
        assert len(tx.all_open_rows()) == 3
        assert tx.existing_keys([row(minute=2)["fire_key"], "nope"]) == {row(minute=2)["fire_key"]}
    assert [r.id for r in ledger.history("j", limit=2)] == [ids[2], ids[1]]
    assert [r.id for r in ledger.get_many([ids[3], 99_999, ids[0]])] == [ids[3], ids[0]]
    assert {job: r.id for job, r in ledger.last_rows().items()} == {"j": ids[2], "k": ids[3]}
    assert ledger.get(ids[1]).shown_outcome == "completed"


def test_prune_keeps_every_jobs_newest_row(ledger: LedgerStore) -> None:
    with ledger.transaction() as tx:
        ids = tx.insert_many([row(minute=m, status=Status.DONE) for m in range(5)])
        only = tx.insert(**row("k", 0, status=Status.DONE))
        waiting = tx.insert(**row("q", 0))
    removed = ledger.prune(NOW + 3600, chunk=2)
    assert removed == 4
    assert [r.id for r in ledger.history()] == [waiting, only, ids[-1]]


def test_a_fire_keeps_its_tries_and_its_pending_retry(ledger: LedgerStore) -> None:
    with ledger.transaction() as tx:
        row_id = tx.insert(**row(attempts=3))
    assert row_id is not None
    fresh = ledger.get(row_id)
    assert (fresh.attempt, fresh.attempts, fresh.tries, fresh.retry_at) == (1, 3, (), None)
    first = Try(attempt=1, outcome=Outcome.FAILED, exit_code=3, session_id="s_1", ended_at=NOW)
    lost = Try(attempt=2, outcome=Outcome.LOST, counted=False, error="keeper vanished")
    waiting = FireChange(
        status=Status.RETRY,
        attempt=2,
        tries=(first, lost),
        retry_at=NOW + 40,
        retry_kind=RetryKind.BACKOFF,
        retry_reason="backoff, attempt 2 of 3",
    )
    assert ledger.update(row_id, [Status.CLAIMED], waiting)
    got = ledger.get(row_id)
    assert got.status is Status.RETRY and got.shown_outcome == "queued"
    assert (got.attempt, got.try_number, got.tries) == (2, 3, (first, lost))
    assert (got.retry_at, got.retry_kind, got.retry_reason) == (
        NOW + 40,
        RetryKind.BACKOFF,
        "backoff, attempt 2 of 3",
    )
    # A pending retry is open (the scheduler finds it) but no worker runs for it.
    assert [r.id for r in ledger.open_rows([Status.RETRY])] == [row_id]
    assert ledger.count_workers() == 0
    with ledger.transaction() as tx:
        assert [r.id for r in tx.open_rows("j")] == [row_id]
    again = FireChange(status=Status.CLAIMED, retry_at=None, retry_kind=None, retry_reason=None)
    assert ledger.update(row_id, [Status.RETRY], again)
    assert not ledger.update(row_id, [Status.RETRY], again)
    assert ledger.get(row_id).tries == (first, lost)


def test_a_deferral_lands_only_on_its_own_try_in_progress(ledger: LedgerStore) -> None:
    with ledger.transaction() as tx:
        plain = tx.insert(**row(minute=1))
        policy = tx.insert(**row(minute=2, attempts=2))
    assert plain is not None and policy is not None
    key = row(minute=2)["fire_key"]

    def defer(session: str | None, until: float = NOW + 300) -> bool:
        return ledger.defer(key, session_id=session, until=until, reason="rate limited")

    assert not defer("s_1")  # claimed: no try in progress yet
    assert not ledger.defer(row(minute=1)["fire_key"], session_id=None, until=NOW, reason=None)
    assert ledger.update(policy, [Status.CLAIMED], FireChange(status=Status.SPAWNING))
    assert ledger.update(plain, [Status.CLAIMED], FireChange(status=Status.SPAWNING))
    assert not ledger.defer(row(minute=1)["fire_key"], session_id=None, until=NOW, reason=None)
    assert defer("s_1", NOW + 60)  # spawning: its session is not recorded yet
    ledger.update(policy, [Status.SPAWNING], FireChange(status=Status.RUNNING, session_id="s_1"))
    assert not defer("s_2")  # another try's worker
    assert defer("s_1")
    got = ledger.get(policy)
    assert (got.retry_at, got.retry_kind, got.retry_reason) == (
        NOW + 300,
        RetryKind.DEFERRED,
        "rate limited",
    )
    assert ledger.get(plain).retry_at is None
    ledger.update(policy, [Status.RUNNING], FireChange(status=Status.DONE))
    assert not defer("s_1")
    assert not ledger.defer("j@1999-01-01T00:00:00", session_id="s_1", until=NOW, reason=None)


def test_a_pause_by_dispatch_commits_with_its_fire_and_resume_clears_it(
    ledger: LedgerStore,
) -> None:
    with ledger.transaction() as tx:
        row_id = tx.insert(**row(status=Status.RUNNING))
    assert row_id is not None
    done = FireChange(status=Status.DONE, outcome=Outcome.FAILED)
    with pytest.raises(RuntimeError), ledger.transaction() as tx:
        assert tx.update(row_id, [Status.RUNNING], done)
        assert tx.set_paused("j", True, NOW, "every attempt failed")
        raise RuntimeError("crashed before the commit")
    assert ledger.get(row_id).status is Status.RUNNING and "j" not in ledger.job_states()
    with ledger.transaction() as tx:
        assert tx.update(row_id, [Status.RUNNING], done)
        assert tx.set_paused("j", True, NOW, "every attempt failed")
        assert not tx.set_paused("j", True, NOW + 1, "again")
    paused = ledger.job_states()["j"]
    assert (paused.paused, paused.paused_at, paused.paused_reason) == (
        True,
        NOW,
        "every attempt failed",
    )
    assert ledger.set_paused("j", False, NOW + 60)
    resumed = ledger.job_states()["j"]
    assert (resumed.paused, resumed.paused_reason, resumed.watermark) == (False, None, NOW + 60)
    assert ledger.set_paused("j", True, NOW + 61)
    assert ledger.job_states()["j"].paused_reason is None  # the operator's pause has no reason


# -- named limits -----------------------------------------------------------------------------

ONE = (("api", LimitSpec(concurrency=1)),)


def _taking() -> FireChange:
    return FireChange(status=Status.SPAWNING, actual=NOW, claimant="me")


def _ids(ledger: LedgerStore, *minutes: int) -> list[int]:
    with ledger.transaction() as tx:
        found = [tx.insert(**row(minute=m)) for m in minutes]
    assert all(i is not None for i in found)
    return [i for i in found if i is not None]


def test_a_fire_takes_its_limits_as_it_starts_and_frees_them_as_it_settles(
    ledger: LedgerStore,
) -> None:
    first, second = _ids(ledger, 0, 1)
    assert ledger.take(first, _taking(), ONE, now=NOW).taken
    held = ledger.take(second, _taking(), ONE, now=NOW)
    assert not held.taken and held.wait is not None
    assert held.wait.describe(NOW) == "limit api (1 of 1 running)"
    assert ledger.get(second).status is Status.CLAIMED  # nothing changed
    _, tallies = ledger.limit_tallies(ONE, now=NOW)
    assert tallies["api"].in_use == 1
    done = FireChange(status=Status.DONE, outcome=Outcome.COMPLETED, ended_at=NOW + 1)
    assert ledger.update(first, (Status.SPAWNING,), done)
    assert ledger.take(second, _taking(), ONE, now=NOW + 1).taken
    assert ledger.get(second).status is Status.SPAWNING


def test_a_fire_no_longer_claimed_takes_no_limit(ledger: LedgerStore) -> None:
    (gone,) = _ids(ledger, 0)
    replaced = FireChange(status=Status.DONE, outcome=Outcome.REPLACED, ended_at=NOW)
    assert ledger.update(gone, (Status.CLAIMED,), replaced)
    assert ledger.take(gone, _taking(), ONE, now=NOW) == Take(taken=False)
    _, tallies = ledger.limit_tallies(ONE, now=NOW)
    assert tallies["api"].in_use == 0


@pytest.fixture(params=BACKENDS)
def books(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[LedgerStore, Any]]:
    """A ledger and a board on one store of record (in memory: one shared set of holds)."""
    if request.param == "memory":
        holds = MemoryHolds()
        yield MemoryLedger(holds), MemoryBoardStore(holds)
    elif request.param == "sqlite":
        with open_state(tmp_path / "state") as state:
            yield Ledger(state), SqliteBoardStore(state)
    else:
        with ClusterDB(request.getfixturevalue("pg_url")) as cluster:
            cluster.migrate()
            yield PgLedger(cluster), PgBoardStore(cluster)


def test_a_cron_fire_and_a_kanban_run_share_one_limit(books: tuple[LedgerStore, Any]) -> None:
    ledger, board = books
    card, _ = board.add_card(NewCard(title="t", assignee="a"), now=NOW)
    me = Claimant(pid=1, start=1, boot=None)
    claim = board.claim(card.id, now=NOW, claimer=me, limits=Limits(max_in_progress=9, wants=ONE))
    assert claim.run is not None
    (fire,) = _ids(ledger, 0)
    held = ledger.take(fire, _taking(), ONE, now=NOW)
    assert held.wait is not None and held.wait.in_use == 1
    finished = CardChange(fields={"status": CardStatus.DONE})
    board.close_run(
        claim.run.run_id, Result(outcome=Outcome.COMPLETED), lambda c, r: finished, now=NOW
    )
    assert ledger.take(fire, _taking(), ONE, now=NOW).taken
    other, _ = board.add_card(NewCard(title="u", assignee="a"), now=NOW)
    refused = board.claim(
        other.id, now=NOW, claimer=me, limits=Limits(max_in_progress=9, wants=ONE)
    )
    assert refused.wait is not None


def test_a_try_that_ends_in_a_retry_frees_its_limits_and_the_next_try_takes_them_again(
    ledger: LedgerStore,
) -> None:
    first, other = _ids(ledger, 0, 1)
    assert ledger.take(first, _taking(), ONE, now=NOW).taken
    retry = FireChange(status=Status.RETRY, attempt=2, retry_at=NOW + 40)
    assert ledger.update(first, (Status.SPAWNING,), retry)
    _, tallies = ledger.limit_tallies(ONE, now=NOW)
    assert tallies["api"].in_use == 0  # backing off holds nothing
    assert ledger.take(other, _taking(), ONE, now=NOW).taken
    back = FireChange(status=Status.CLAIMED, retry_at=None)
    assert ledger.update(first, (Status.RETRY,), back)
    held = ledger.take(first, _taking(), ONE, now=NOW + 40)
    assert held.wait is not None and held.wait.limit == "api"  # the next try waits its turn
