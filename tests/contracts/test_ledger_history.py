"""The cron ledger's history reads over every backend (in memory, SQLite, PostgreSQL): fires
counted when they settled, by outcome, with their lag and run time, and the fires behind a bar.

The ledger below, by hand (three one-minute buckets from T0):

=====  ====  =========  ========================================  ======  =======  ==========
fire   job   kind       due / started / ended (or decided)        lag     run      bucket
=====  ====  =========  ========================================  ======  =======  ==========
f1     j     schedule   +1 / +3 / +13 completed                   2       10       0
f2     j     schedule   +60 / +61 / +90 failed (actual +60)        0       29       1
f3     k     schedule   decided +100 skipped_overlap (never ran)  -       -        1
f4     k     manual     - / +125 / +130 completed                 -       5        2
f5     j     schedule   +140 / +141 / running                     -       -        (open)
f6     j     schedule   decided +150 missed                       -       -        2
=====  ====  =========  ========================================  ======  =======  ==========
"""

from __future__ import annotations

from typing import Any

from dispatcher import rollup
from dispatcher.buckets import Bucket, Spread, Window
from dispatcher.cron.abc import LedgerStore
from dispatcher.cron.changes import FireChange
from dispatcher.cron.memory import MemoryLedger
from dispatcher.cron.records import Kind, Status
from dispatcher.launch.outcome import Outcome
from tests.contracts.test_ledger import ledger, opener
from tests.support.history import T0, WINDOW

__all__ = ["ledger", "opener"]


def one(value: float) -> Spread:
    return Spread(1, (value, value, value))


def fire(name: str, job: str, kind: Kind = Kind.SCHEDULE, **values: Any) -> dict[str, Any]:
    wall = f"2027-01-15T09:00:{len(name):02d}"
    return {
        "fire_key": f"{job}@{name}",
        "job_id": job,
        "kind": kind,
        "nominal_wall": wall,
        "zone": "UTC",
        "nominal": values.get("due_at") or values.get("decided_at") or T0,
        "decided_at": values.pop("decided_at", values.get("due_at") or T0),
        "status": Status.DONE,
        **values,
    }


def seed(ledger: LedgerStore, k: float = 1.0) -> dict[str, int]:
    """The ledger of the module docstring; ``k`` stretches its times (5: five-minute buckets)."""
    rows = {
        "f1": fire(
            "f1", "j", due_at=T0 + 1, actual=T0 + 3, started_at=T0 + 3, ended_at=T0 + 13,
            outcome=Outcome.COMPLETED,
        ),
        "f2": fire(
            "f2", "j", due_at=T0 + 60, actual=T0 + 60, started_at=T0 + 61, ended_at=T0 + 90,
            outcome=Outcome.FAILED,
        ),
        "f3": fire("f3", "k", decided_at=T0 + 100, outcome=Outcome.SKIPPED_OVERLAP),
        "f4": fire(
            "f4", "k", Kind.MANUAL, decided_at=T0 + 125, actual=T0 + 125, started_at=T0 + 125,
            ended_at=T0 + 130, outcome=Outcome.COMPLETED,
        ),
        "f5": fire(
            "f5", "j", due_at=T0 + 140, actual=T0 + 141, started_at=T0 + 141,
            status=Status.RUNNING,
        ),
        "f6": fire("f6", "j", decided_at=T0 + 150, outcome=Outcome.MISSED),
    }  # fmt: skip
    ids = {}
    with ledger.transaction() as tx:
        for name, values in rows.items():
            for key in ("nominal", "decided_at", "due_at", "actual", "started_at", "ended_at"):
                if key in values:
                    values[key] = T0 + (values[key] - T0) * k
            row_id = tx.insert(**values)
            assert row_id is not None
            ids[name] = row_id
    return ids


def test_fire_buckets_count_settled_fires_with_lag_and_run_time(ledger: LedgerStore) -> None:
    seed(ledger)
    assert ledger.fire_buckets(WINDOW) == [
        Bucket({"completed": 1}, {"lag": one(2.0), "run": one(10.0)}),
        Bucket({"failed": 1, "skipped_overlap": 1}, {"lag": one(0.0), "run": one(29.0)}),
        Bucket({"completed": 1, "missed": 1}, {"lag": Spread(), "run": one(5.0)}),
    ]
    k = ledger.fire_buckets(WINDOW, job_id="k")
    assert [b.counts for b in k] == [{}, {"skipped_overlap": 1}, {"completed": 1}]
    assert [b.spreads["run"] for b in k] == [Spread(), Spread(), one(5.0)]


def test_fires_in_a_window_by_settle_time(ledger: LedgerStore) -> None:
    ids = seed(ledger)

    def names(fires: list[Any]) -> list[str]:
        back = {v: k for k, v in ids.items()}
        return [back[f.id] for f in fires]

    assert names(ledger.fires_in(T0 + 60, T0 + 180)) == ["f2", "f3", "f4", "f6"]
    assert names(ledger.fires_in(T0 + 60, T0 + 180, outcome="missed")) == ["f6"]
    assert names(ledger.fires_in(T0, T0 + 180, job_id="k")) == ["f3", "f4"]
    assert names(ledger.fires_in(T0 + 60, T0 + 180, limit=2)) == ["f2", "f3"]
    assert ledger.fires_in(T0 + 600, T0 + 700) == []


# -- the rollup (dispatcher/rollup.py): stored answers change nothing a read answers --------

LATER = T0 + 7200 + rollup.SETTLE
"""When the first two hours from T0 have settled."""


def answers(ledger: LedgerStore) -> list[object]:
    """Every rolled-up read of the first two hours, whole and per job."""
    found: list[object] = []
    for step in rollup.STEPS:
        win = Window(start=T0, step=step, count=int(7200 // step))
        found += [ledger.fire_buckets(win, job_id=job) for job in (None, "j", "k")]
    return found


def test_a_rolled_up_ledger_answers_as_its_rows_do(ledger: LedgerStore) -> None:
    seed(ledger, k=5.0)
    before = answers(ledger)
    stored = ledger.roll_up(LATER)
    # The first two hours at each step (24 + 4 + 2 + 1 buckets) and the two before them.
    assert stored == (0 if isinstance(ledger, MemoryLedger) else 2 * 31)
    assert ledger.roll_up(LATER) == 0
    assert answers(ledger) == before
    assert ledger.fire_buckets(Window(start=T0, step=300.0, count=1))[0] == Bucket(
        {"completed": 1}, {"lag": one(10.0), "run": one(50.0)}
    )


def late_writes(ledger: LedgerStore, ids: dict[str, int]) -> None:
    """Into settled buckets, each into others: a fire that ran from +1281 to +1300 s, the
    running f5 ending at +1000 s, and a prune of every finished fire decided before +600 s
    but each job's newest."""
    with ledger.transaction() as tx:
        tx.insert(**fire("late", "k", due_at=T0 + 1280, actual=T0 + 1281, started_at=T0 + 1281,
                         ended_at=T0 + 1300, outcome=Outcome.COMPLETED))  # fmt: skip
    change = FireChange(status=Status.DONE, outcome=Outcome.FAILED, ended_at=T0 + 1000)
    assert ledger.update(ids["f5"], [Status.RUNNING], change)
    ledger.prune(T0 + 600)


def test_fires_written_into_rolled_up_buckets_are_counted(ledger: LedgerStore) -> None:
    memory = MemoryLedger()
    ids = {book: seed(book, k=5.0) for book in (ledger, memory)}
    ledger.roll_up(LATER)
    for book in (ledger, memory):
        late_writes(book, ids[book])
    assert answers(ledger) == answers(memory)
    five = ledger.fire_buckets(Window(start=T0, step=300.0, count=5))
    # f1, f2 and f3 were pruned (each job keeps its newest row); f4 ended at +650, f6 was
    # missed at +750, f5 failed at +1000, the late fire ended at +1300.
    assert [b.counts for b in five] == [
        {},
        {},
        {"completed": 1, "missed": 1},
        {"failed": 1},
        {"completed": 1},
    ]
    ledger.roll_up(LATER)
    assert answers(ledger) == answers(memory)
