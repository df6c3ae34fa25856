"""What the pages show, as plain records built from the board's: tiles, columns, run rows.

Pure functions of cards, runs and the time; the templates only lay them out. The board's
columns are the CLI's (``dispatch kanban board``): todo, ready, running, blocked, review, done;
done cards come newest first, one page at a time, and a very long column shows its first
:data:`COLUMN_LIMIT` cards with the count of the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from dispatcher.kanban.model import Card, CardStatus, Event, Run
from dispatcher.kanban.views import BOARD_ORDER, event_pairs, unconfigured

DONE_PAGE = 50
"""Done cards per page of the board."""
COLUMN_LIMIT = 200
"""Cards shown in any other column before "N more" (the first by the board's order)."""
_PRIORITY_SPAN = 10**12
ACTIVE = tuple(status for status in BOARD_ORDER if status is not CardStatus.DONE)
"""The columns shown whole (done comes a page at a time)."""


@dataclass(frozen=True, kw_only=True)
class Tile:
    """One card on the board."""

    id: str
    title: str
    assignee: str
    status: str
    priority: int
    created_at: float
    started_at: float | None
    completed_at: float | None
    failures: int
    failure_limit: int
    block_kind: str | None
    run_id: str | None
    placement: str | None
    host: str | None
    waits_for: tuple[str, ...] = ()
    """A ``todo`` card's parents (what it waits for; the tile links them)."""
    retry_at: float | None = None
    """A ``ready`` card backing off or deferred: when its next try may start."""
    deferred: bool = False
    """Its worker chose that time (``kanban defer``), rather than a back-off after a failure."""
    unconfigured: bool = False
    """The card needs an assignee the loaded config does not name (it will not be claimed)."""
    group: str | None = None
    """The card's group (claims take turns between groups)."""
    waiting: str | None = None
    """The full named limit a ready card waits for: ``limit openai (6 of 6 running)``."""
    rank: str
    """Sorts the column's tiles as the board orders them (text order)."""


@dataclass(frozen=True, kw_only=True)
class Column:
    """One status column: the tiles shown and how many there are in all."""

    status: str
    tiles: tuple[Tile, ...]
    total: int
    offset: int = 0
    """Done column: how many newer done cards precede this page."""
    limit: int = COLUMN_LIMIT

    @property
    def hidden(self) -> int:
        """Cards of this status not shown on this page."""
        return self.total - len(self.tiles)


def rank(card: Card) -> str:
    """Text that sorts like the board: done cards newest first, others by priority (highest
    first), then age (oldest first), then id."""
    if card.status is CardStatus.DONE:
        return f"{1e12 - (card.completed_at or 0):020.6f}{card.id}"
    priority = max(-_PRIORITY_SPAN + 1, min(_PRIORITY_SPAN - 1, card.priority))
    return f"{_PRIORITY_SPAN - priority:013d}{card.created_at:020.6f}{card.id}"


def run_host(run: Run, hosts: Mapping[str, str | None], local: str) -> str:
    """The host a run was claimed on: in cluster mode as ``hosts`` (run id -> host) records
    it, otherwise this one."""
    return hosts.get(run.run_id) or local


def tile(
    card: Card,
    run: Run | None,
    *,
    host: str | None,
    limit_for: Callable[[str], int],
    assignees: Collection[str] | None = None,
    waiting: str | None = None,
    deferred: bool = False,
) -> Tile:
    """A card as the board shows it (``run``: its open run, if any, claimed on ``host``;
    ``limit_for``: the tries an assignee's cards get, ``kanban.limit_for``; ``assignees``: the
    configured ones, None when unknown; ``waiting``: the full named limit it waits for;
    ``deferred``: its worker deferred it)."""
    return Tile(
        id=card.id,
        title=card.title,
        assignee=card.assignee,
        status=card.status.value,
        priority=card.priority,
        created_at=card.created_at,
        started_at=card.started_at if card.status is CardStatus.RUNNING else None,
        completed_at=card.completed_at,
        failures=card.consecutive_failures,
        failure_limit=card.failure_limit or limit_for(card.assignee),
        block_kind=card.block_kind.value if card.block_kind else None,
        run_id=run.run_id if run else None,
        placement=run.placement if run else None,
        host=host if run else None,
        waits_for=card.parents if card.status is CardStatus.TODO else (),
        retry_at=card.retry_at if card.status is CardStatus.READY else None,
        deferred=deferred,
        unconfigured=unconfigured(card, assignees),
        group=card.group,
        waiting=waiting,
        rank=rank(card),
    )


def tiles(
    cards: Iterable[Card],
    runs: Iterable[Run],
    *,
    local_host: str,
    limit_for: Callable[[str], int],
    hosts: Mapping[str, str | None] | None = None,
    assignees: Collection[str] | None = None,
    waits: Mapping[str, str] | None = None,
    deferred: Collection[str] = (),
) -> list[Tile]:
    """Tiles for ``cards``, each with its open run among ``runs`` (and that run's host);
    a card whose assignee is not among ``assignees`` is marked, one a full limit holds back
    says which (``waits``), and one in ``deferred`` is marked so
    (:func:`dispatcher.kanban.views.deferred_cards`)."""
    open_runs = {run.run_id: run for run in runs if run.open}
    found = []
    for card in cards:
        run = open_runs.get(card.current_run_id or "")
        host = run_host(run, hosts or {}, local_host) if run else None
        waiting = (waits or {}).get(card.id)
        found.append(
            tile(
                card,
                run,
                host=host,
                limit_for=limit_for,
                assignees=assignees,
                waiting=waiting,
                deferred=card.id in deferred,
            )
        )
    return found


def columns(
    shown: Sequence[Tile], counts: Mapping[CardStatus, int], *, done_offset: int = 0
) -> list[Column]:
    """The board's columns from ``shown`` tiles (already limited) and the status counts."""
    found = []
    for status in BOARD_ORDER:
        mine = sorted((t for t in shown if t.status == status.value), key=lambda t: t.rank)
        if status is CardStatus.DONE:
            column = Column(
                status=status.value,
                tiles=tuple(mine[:DONE_PAGE]),
                total=counts.get(status, 0),
                offset=done_offset,
                limit=DONE_PAGE,
            )
        else:
            column = Column(
                status=status.value,
                tiles=tuple(mine[:COLUMN_LIMIT]),
                total=counts.get(status, len(mine)),
            )
        found.append(column)
    return found


def affected_cards(events: Iterable[Event]) -> list[str]:
    """The cards ``events`` are about, each once, in order of first mention."""
    return list(dict.fromkeys(event.card_id for event in events))


def event_summary(event: Event) -> str:
    """An event's data as ``key=value`` pairs (None values left out, times in ISO-8601)."""
    return event_pairs(event)


def run_duration(run: Run, now: float) -> float | None:
    """Seconds the run's worker ran (so far, while it runs)."""
    if run.started_at is None:
        return None
    end = run.ended_at if run.ended_at is not None else (now if run.open else None)
    return None if end is None else max(0.0, end - run.started_at)
