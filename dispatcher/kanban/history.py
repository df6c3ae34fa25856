"""The board's history as the history pages read it: what each event did to its card's
status, how long a run waited, the runs behind a chart's bar or on a timeline.

**Status changes.** Events are the board's record of every status change, but an event's kind
alone does not always say which: :func:`transition` reads ``(from, to)`` from an event's kind
and the few data fields that decide it (:data:`DATA_KEYS`). One change has no event of its own:
a run that ends ``deferred`` while its card runs puts the card back to ``ready`` (the worker's
``defer`` event came earlier, during the run); its run row is the record, counted as
:data:`DEFERRED_CLOSE`. ``tests/test_kanban_history.py`` replays random boards to check that
these rules reproduce every card's status.

**Wait.** A run waited from the moment its card last became ready (its latest status change
before the claim, or the end of its previous run, whichever is later) until its worker started.

Every board store answers the same questions (:meth:`~dispatcher.kanban.abc.BoardStore.
run_buckets`, ``status_flows``, ``runs_in``); the in-memory store with the functions at the end
of this module, the SQL stores in SQL (:mod:`dispatcher.kanban.sqlhistory`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.buckets import Bucket, Flows, Window, buckets_of
from dispatcher.kanban.model import Card, Event, Run
from dispatcher.launch.outcome import Outcome

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
    if kind == "exit_ignored" and data.get("outcome") == Outcome.DEFERRED.value:
        # The card had already left ``running``: the deferred close changed nothing, so its
        # run row's change is taken back.
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


def ready_since(run: Run, events: Iterable[Event], runs: Iterable[Run]) -> float:
    """When ``run``'s card last became ready before the claim (see the module docstring):
    ``events`` and ``runs`` are the card's."""
    changes = [
        e.at
        for e in events
        if e.kind in STATUS_KINDS and e.at <= run.claimed_at and e.run_id != run.run_id
    ]
    ends = [r.ended_at for r in runs if r.ended_at is not None and r.ended_at <= run.claimed_at]
    return max(max(changes, default=run.claimed_at), max(ends, default=0.0))


# -- the in-memory answers ---------------------------------------------------------------------


def run_buckets(
    win: Window,
    runs: Sequence[Run],
    cards: Mapping[str, Card],
    events: Sequence[Event],
    assignee: str | None,
) -> list[Bucket]:
    """Per bucket, the runs that ended in it: counts by outcome, spreads of ``wait`` (ready →
    running) and ``run`` (running → end) of those that started."""
    ended = [
        r
        for r in runs
        if r.ended_at is not None
        and r.outcome is not None
        and win.index(r.ended_at) is not None
        and (assignee is None or cards[r.card_id].assignee == assignee)
    ]
    by_card: dict[str, list[Event]] = {}
    for event in events:
        by_card.setdefault(event.card_id, []).append(event)
    runs_of: dict[str, list[Run]] = {}
    for r in runs:
        runs_of.setdefault(r.card_id, []).append(r)
    waits, times = [], []
    for r in ended:
        assert r.ended_at is not None
        if r.started_at is None:
            continue
        since = ready_since(r, by_card.get(r.card_id, ()), runs_of.get(r.card_id, ()))
        waits.append((r.ended_at, r.started_at - since))
        times.append((r.ended_at, r.ended_at - r.started_at))
    labelled = [(r.ended_at, str(r.outcome)) for r in ended if r.ended_at is not None]
    return buckets_of(win, labelled, {"wait": waits, "run": times})


def status_flows(win: Window, events: Sequence[Event], runs: Iterable[Run]) -> list[Flows]:
    """Per bucket, the status changes of its events (and deferred closes) by (from, to)."""
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
