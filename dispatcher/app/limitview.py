"""Named limits as people see them: ``dispatch limits``, a card's waiting note, the web.

:func:`limits_doc` is the one serializer of ``dispatch limits --json``; the web's status page
and ``/metrics`` read the same document, and so will an HTTP API. :func:`card_waits` says which
full limit each ready card of a listing waits for (``kanban list``, ``show``, ``board`` and the
web's tiles), computed now from the holds by the claim's own check
(:func:`dispatcher.launch.limits.refusal`), so a note can never disagree with a claim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatcher.cron.abc import LedgerStore
from dispatcher.cron.records import WAITING, FireRecord, Status
from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.model import Card, CardStatus
from dispatcher.launch.limits import (
    LimitSpec,
    LimitWait,
    Tally,
    refusal,
    usage,
    wants_of,
)
from dispatcher.settings import Settings
from dispatcher.timefmt import span

__all__ = ["BUSIEST", "Waits", "card_waits", "limits_doc", "limits_text"]

BUSIEST = 5
"""Groups a ``per_group`` limit lists (those with the most open holds)."""
SCANNED = 1000
"""Ready cards ``dispatch limits`` looks at for the ones a limit holds (in claim order)."""
LISTED = 20
"""Waiting cards listed per limit (the count covers every one scanned)."""


@dataclass(frozen=True, kw_only=True)
class Waits:
    """What full limit each card waits for, as read at ``clock`` (the store's clock)."""

    clock: float = 0.0
    waits: Mapping[str, LimitWait] = field(default_factory=dict)

    def text(self, card_id: str) -> str | None:
        """``limit openai (6 of 6 running)``, or None when the card waits for no limit."""
        wait = self.waits.get(card_id)
        return None if wait is None else wait.describe(self.clock)

    def texts(self) -> dict[str, str]:
        """Every waiting card's note by card id."""
        return {card_id: wait.describe(self.clock) for card_id, wait in self.waits.items()}

    def json(self, card_id: str) -> dict[str, Any] | None:
        """The card's wait as JSON (``LimitWait.to_dict``), or None."""
        wait = self.waits.get(card_id)
        return None if wait is None else wait.to_dict(self.clock)


def card_waits(
    settings: Settings,
    store: BoardStore,
    cards: Iterable[Card],
    *,
    now: float,
    host: str | None = None,
) -> Waits:
    """The full limit each claimable-looking card of ``cards`` waits for: ``ready``, without an
    open run, not backing off, its assignee configured with ``uses`` (one read of the holds)."""
    assignees = settings.kanban.assignees
    candidates = [
        card
        for card in cards
        if card.status is CardStatus.READY
        and card.current_run_id is None
        and (card.retry_at is None or card.retry_at <= now)
        and card.assignee in assignees
        and assignees[card.assignee].uses
    ]
    if not candidates or not settings.limits:
        return Waits(clock=now)
    names = {name for card in candidates for name in assignees[card.assignee].uses}
    wanted = wants_of(sorted(names), settings.limits)
    clock, tallies = store.limit_tallies(wanted, now=now, host=host)
    found = {}
    for card in candidates:
        wants = wants_of(assignees[card.assignee].uses, settings.limits)
        wait = refusal(wants, tallies, group=card.group)
        if wait is not None:
            found[card.id] = wait
    return Waits(clock=clock, waits=found)


def limits_doc(
    settings: Settings,
    store: BoardStore,
    ledger: LedgerStore | None,
    *,
    now: float,
    host: str | None = None,
) -> list[dict[str, Any]]:
    """``dispatch limits --json``: every limit with its use and capacity, the starts its rate
    window counts, the cards and cron fires waiting for it and (``per_group``) its busiest
    groups. One read of the holds, one of the first ready cards, one of the ledger's claimed
    fires."""
    if not settings.limits:
        return []
    every = tuple(settings.limits.items())
    clock, tallies = store.limit_tallies(every, now=now, host=host)
    ready = store.ready_cards(limit=SCANNED, now=now)
    waits = card_waits(settings, store, ready, now=now, host=host)
    titles = {card.id: card.title for card in ready}
    fires = _waiting_fires(settings, ledger)
    return [
        _limit_doc(name, spec, tallies.get(name, Tally()), waits, titles, fires, clock)
        for name, spec in settings.limits.items()
    ]


def _limit_doc(
    name: str,
    spec: LimitSpec,
    tally: Tally,
    waits: Waits,
    titles: Mapping[str, str],
    fires: Sequence[tuple[FireRecord, tuple[str, ...]]],
    clock: float,
) -> dict[str, Any]:
    seen = usage(name, spec, tally, group=None)
    cards = [
        {"id": card_id, "title": titles.get(card_id, ""), "wait": wait.describe(clock)}
        for card_id, wait in waits.waits.items()
        if wait.limit == name
    ]
    waiting_fires = [
        {"id": str(row.id), "fire_key": row.fire_key, "job": row.job_id, "wait": row.error}
        for row, uses in fires
        if name in uses
    ]
    cap = spec.per_group.concurrency if spec.per_group else None
    busiest = sorted(tally.groups.items(), key=lambda item: (-item[1], item[0] or ""))[:BUSIEST]
    return {
        "name": name,
        "scope": spec.scope.value,
        "concurrency": spec.concurrency,
        "rate": None if spec.rate is None else str(spec.rate),
        "per_group": cap,
        "in_use": seen.in_use,
        "capacity": spec.concurrency,
        "window_starts": None if spec.rate is None else seen.starts,
        "window_capacity": None if spec.rate is None else spec.rate.starts,
        "window_seconds": None if spec.rate is None else spec.rate.window,
        "next_start_in": None
        if seen.next_start is None
        else max(0, round(seen.next_start - clock)),
        "waiting_cards": len(cards),
        "waiting": cards[:LISTED],
        "waiting_fires": waiting_fires,
        "busiest_groups": []
        if cap is None
        else [{"group": g, "in_use": n, "capacity": cap} for g, n in busiest],
    }


def _waiting_fires(
    settings: Settings, ledger: LedgerStore | None
) -> list[tuple[FireRecord, tuple[str, ...]]]:
    """Claimed fires held by a limit, with the limits their job uses."""
    if ledger is None:
        return []
    uses = {job.id: job.uses for job in settings.cron.jobs}
    return [
        (row, uses.get(row.job_id, ()))
        for row in ledger.open_rows((Status.CLAIMED,))
        if (row.error or "").startswith(WAITING)
    ]


def limits_text(doc: Sequence[Mapping[str, Any]]) -> list[str]:
    """``dispatch limits`` as lines: one per limit, then what waits for it."""
    if not doc:
        return ["no limits are configured (limits: in config.yaml)"]
    lines = []
    for entry in doc:
        parts = [f"{entry['name']:<16} {entry['scope']:<8}"]
        cap = entry["capacity"]
        parts.append(f"in use {entry['in_use']}" + (f" of {cap}" if cap is not None else ""))
        if entry["rate"] is not None:
            rate = f"starts {entry['window_starts']} of {entry['rate']}"
            if entry["next_start_in"] is not None:
                rate += f" (next start in {span(entry['next_start_in'])})"
            parts.append(rate)
        if entry["per_group"] is not None:
            parts.append(f"per group {entry['per_group']}")
        lines.append("   ".join(parts))
        busy = ", ".join(
            f"{g['group'] or '(no group)'} {g['in_use']}/{g['capacity']}"
            for g in entry["busiest_groups"]
        )
        if busy:
            lines.append(f"  busiest groups: {busy}")
        if entry["waiting_cards"]:
            shown = " ".join(card["id"] for card in entry["waiting"])
            more = entry["waiting_cards"] - len(entry["waiting"])
            lines.append(
                f"  waiting cards: {entry['waiting_cards']} ({shown}"
                + (f" and {more} more)" if more else ")")
            )
        for fire in entry["waiting_fires"]:
            lines.append(f"  waiting cron fire: {fire['fire_key']}")
    return lines
