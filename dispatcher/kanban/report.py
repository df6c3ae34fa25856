"""What a dispatcher tick did: the records ``tick`` returns and their JSON-friendly form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispatcher.launch.outcome import Outcome


@dataclass(frozen=True, kw_only=True)
class Closed:
    """A run that reconcile (or a spawn failure) closed."""

    card_id: str
    run_id: str
    outcome: Outcome
    status: str
    """The card's status afterwards."""
    error: str | None = None
    infrastructure: bool = False


@dataclass(frozen=True, kw_only=True)
class Dispatched:
    """A card whose worker was started this tick."""

    card_id: str
    run_id: str
    session_id: str
    placement: str
    unit: str | None


@dataclass(frozen=True, kw_only=True)
class TickReport:
    """What one tick did. ``refused`` holds runs closed at spawn time (refusals are recorded on
    the board; the CLI still exits 0)."""

    now: float
    paused: bool = False
    dry_run: bool = False
    reconciled: tuple[Closed, ...] = ()
    promoted: tuple[str, ...] = ()
    dispatched: tuple[Dispatched, ...] = ()
    refused: tuple[Closed, ...] = ()
    planned: tuple[str, ...] = ()
    """Cards a real tick would claim (``dry_run`` only)."""
    guarded: tuple[str, ...] = ()
    """Cards skipped because of the infrastructure cooldown (a respawn_guarded event each)."""
    backing_off: tuple[str, ...] = ()
    deferred: tuple[str, ...] = ()
    """Ready cards left for a later tick (no room: a budget full, or ``--max`` reached). Not
    the outcome ``deferred``: in JSON also (and better) under ``waiting_for_room``."""
    limited: tuple[tuple[str, str], ...] = ()
    """(card id, what it waits for): ready cards a full named limit held back."""
    unknown_assignee: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    board_version: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form (timestamps stay epoch seconds; the CLI formats them)."""
        return {
            "paused": self.paused,
            "dry_run": self.dry_run,
            "reconciled": [_closed_dict(c) for c in self.reconciled],
            "promoted": list(self.promoted),
            "dispatched": [
                {
                    "card_id": d.card_id,
                    "run_id": d.run_id,
                    "session_id": d.session_id,
                    "placement": d.placement,
                    "unit": d.unit,
                }
                for d in self.dispatched
            ],
            "refused": [_closed_dict(c) for c in self.refused],
            "planned": list(self.planned),
            "guarded": list(self.guarded),
            "backing_off": list(self.backing_off),
            # "deferred" predates the outcome of that name; kept for existing readers.
            "deferred": list(self.deferred),
            "waiting_for_room": list(self.deferred),
            "limited": [{"card_id": card_id, "wait": wait} for card_id, wait in self.limited],
            "unknown_assignee": list(self.unknown_assignee),
            "warnings": list(self.warnings),
            "board_version": self.board_version,
        }


def _closed_dict(closed: Closed) -> dict[str, Any]:
    return {
        "card_id": closed.card_id,
        "run_id": closed.run_id,
        "outcome": closed.outcome.value,
        "status": closed.status,
        "error": closed.error,
        "infrastructure": closed.infrastructure,
    }
