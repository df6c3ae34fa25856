"""A running card and its run, for the pure-function tests of what a run's end does to a card."""

from __future__ import annotations

from dataclasses import replace

from dispatcher.kanban.model import Card, CardStatus, Run

NOW = 1_800_000_000.0
"""The tests' "now": the card was created 100 s and its run claimed 10 s before it."""

RUN = Run(run_id="r_0000000001", card_id="c_0000000001", attempt=1, claimed_at=NOW - 10)
"""The card's current run."""


def card(**changes: object) -> Card:
    """A running card on attempt 1 of :data:`RUN`, with ``changes`` applied."""
    base = Card(
        id="c_0000000001",
        title="t",
        body="",
        assignee="a",
        status=CardStatus.RUNNING,
        priority=0,
        created_at=NOW - 100,
        updated_at=NOW - 100,
        current_run_id=RUN.run_id,
    )
    return replace(base, **changes)  # type: ignore[arg-type]
