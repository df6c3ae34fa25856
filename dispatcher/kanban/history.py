"""The board's history as the history pages read it: what each event did to its card's
status, how long a run waited, the runs behind a chart's bar or on a timeline.

**Status changes.** Events are the board's record of every status change, but an event's kind
alone does not always say which: :func:`transition` reads ``(from, to)`` from an event's kind
and the few data fields that decide it (:data:`DATA_KEYS`). One change has no event of its own:
a run that ends ``deferred`` while its card runs puts the card back to ``ready`` (the worker's
``defer`` event came earlier, during the run); its run row is the record, counted as
:data:`DEFERRED_CLOSE`. ``tests/test_kanban_history.py`` replays random boards to check that
these rules reproduce every card's status.

**Wait.** A run waited from the moment its card last became ready until its worker started:
its claim stores the time of the card's latest event of :data:`READY_KINDS` as ``ready_at``.

Every board store answers the same questions (:meth:`~dispatcher.kanban.abc.BoardStore.
run_buckets`, ``status_flows``, ``runs_in``); the in-memory store with the functions at the end
of this module, the SQL stores in SQL (:mod:`dispatcher.kanban.sqlhistory`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# The buckets and the outcome vocabulary are imported where they are used: the board store
# reads READY_KINDS for every claim, and every short write command loads it (issue 26).
if TYPE_CHECKING:
    from dispatcher.buckets import Bucket, Flows, Sample, Window
    from dispatcher.kanban.model import Card, Event, Run

RUNNING, READY, BLOCKED = "running", "ready", "blocked"

_FIXED: dict[str, tuple[str, str]] = {
    "promoted": ("todo", READY),
    "claimed": (READY, RUNNING),
    "completed": (RUNNING, "done"),
    "failed": (RUNNING, READY),
    "tempfail": (RUNNING, READY),
    "spawn_refused": (RUNNING, READY),
    "interrupted": (RUNNING, READY),
    "reclaimed": (RUNNING, READY),
    "review": (RUNNING, "review"),
}
"""Kinds whose change never depends on the data. A failure that trips the breaker (or too many
temporary failures) is followed by a ``blocked`` event: ``running → ready → blocked`` at one
instant."""

STATUS_KINDS = frozenset({*_FIXED, "created", "blocked", "unblocked", "moved", "archived"})
"""Event kinds that change a card's status."""

READY_KINDS = STATUS_KINDS | {"deferred"}
"""Events after which a card waits to be claimed: any status change (the last one before a
claim made the card ready), and a worker's ``defer`` (the run's deferred close that readies the
card has no event of its own). A claim stores the latest one's time as the run's ``ready_at``."""

DATA_KEYS = ("from", "to", "status", "by", "outcome")
"""The event data fields :func:`transition` reads."""

DEFERRED_CLOSE = "deferred_close"
"""The pseudo kind of a run that ended ``deferred`` (see the module docstring)."""


def transition(kind: str, data: Mapping[str, Any]) -> tuple[str, str] | None:
    """The ``(from, to)`` statuses an event of ``kind`` with ``data`` records (``""`` for a
    card that did not exist yet), or None when it changes no status."""
    if kind in _FIXED:
        return _FIXED[kind]
    if kind == "created":
        return "", str(data.get("status") or READY)
    if kind == "blocked":
        # A worker blocks its running card; the breaker blocks one its failure just readied.
        return (RUNNING if data.get("by") == "worker" else READY), BLOCKED
    if kind == "unblocked":
        return BLOCKED, str(data.get("status") or READY)
    if kind == "moved" and data.get("from") and data.get("to"):
        return str(data["from"]), str(data["to"])
    if kind == "archived" and data.get("from"):
        return str(data["from"]), "archived"
    if kind == DEFERRED_CLOSE:
        return RUNNING, READY
    if kind == "exit_ignored":
        from dispatcher.launch.outcome import Outcome

        if data.get("outcome") == Outcome.DEFERRED.value:
            # The card had already left ``running``: the deferred close changed nothing, so
            # its run row's change is taken back.
            return READY, RUNNING
    return None


@dataclass(frozen=True, kw_only=True)
class RunLine:
    """A run with what the history pages show beside it."""

    run: Run
    assignee: str
    title: str
    host: str | None = None
    """Cluster mode: the host that claimed it (None on a single host)."""


# -- the in-memory answers ---------------------------------------------------------------------


RunRow = tuple[float, str, float, float | None, float | None]
"""A closed run as the charts read it: (ended_at, outcome, claimed_at, started_at, ready_at)."""


MEASURES = ("wait", "run")
"""The spreads of a bucket of runs."""


def run_samples(rows: Iterable[RunRow]) -> Iterator[Sample]:
    """Closed runs as samples counted when they ended, by outcome: of those whose worker
    started, ``wait`` (ready → running: from ``ready_at``, or the claim on rows older than that
    column) and ``run`` (running → end). Every store reads its runs through this one rule."""
    for ended, outcome, claimed, started, ready in rows:
        if started is None:
            yield ended, outcome, (None, None)
        else:
            yield ended, outcome, (started - (claimed if ready is None else ready), ended - started)


def run_tally(win: Window, rows: Iterable[RunRow]) -> list[Bucket]:
    """Per bucket, the closed runs that ended in it (:func:`run_samples`)."""
    from dispatcher.buckets import tally

    return tally(win, MEASURES, run_samples(rows))


def run_buckets(
    win: Window, runs: Iterable[Run], cards: Mapping[str, Card], assignee: str | None
) -> list[Bucket]:
    """:meth:`~dispatcher.kanban.abc.BoardStore.run_buckets` over records."""
    return run_tally(
        win,
        (
            (r.ended_at, r.outcome.value, r.claimed_at, r.started_at, r.ready_at)
            for r in runs
            if r.ended_at is not None
            and r.outcome is not None
            and (assignee is None or cards[r.card_id].assignee == assignee)
        ),
    )


def status_flows(win: Window, events: Sequence[Event], runs: Iterable[Run]) -> list[Flows]:
    """Per bucket, the status changes of its events (and deferred closes) by (from, to)."""
    from dispatcher.launch.outcome import Outcome

    flows: list[dict[tuple[str, str], int]] = [{} for _ in range(win.count)]
    changes = [(e.at, transition(e.kind, e.data)) for e in events]
    changes += [
        (r.ended_at, transition(DEFERRED_CLOSE, {}))
        for r in runs
        if r.outcome is Outcome.DEFERRED and r.ended_at is not None
    ]
    for at, change in changes:
        i = win.index(at)
        if change is not None and i is not None:
            flows[i][change] = flows[i].get(change, 0) + 1
    return flows


def lines_in(
    runs: Iterable[Run],
    cards: Mapping[str, Card],
    start: float,
    end: float,
    *,
    ended: bool,
    outcome: str | None,
    assignee: str | None,
    limit: int,
) -> list[RunLine]:
    """:meth:`~dispatcher.kanban.abc.BoardStore.runs_in` over records."""

    def wanted(r: Run) -> bool:
        if ended:
            inside = r.ended_at is not None and start <= r.ended_at < end
        else:
            inside = r.claimed_at < end and (r.ended_at is None or r.ended_at >= start)
        return (
            inside
            and (outcome is None or r.outcome == outcome)
            and (assignee is None or cards[r.card_id].assignee == assignee)
        )

    found = [r for r in runs if wanted(r)]
    if ended:
        found.sort(key=lambda r: (r.ended_at or 0.0, r.run_id))
    else:
        found.sort(key=lambda r: (r.claimed_at, r.run_id))
    return [
        RunLine(run=r, assignee=cards[r.card_id].assignee, title=cards[r.card_id].title)
        for r in found[: max(0, limit)]
    ]
