"""Rows of the board tables as records, and the id scheme (``c_``/``r_`` + 10 hex digits)."""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dispatcher.kanban.model import (
    BlockKind,
    Card,
    CardStatus,
    Run,
)
from scope.foundation.ids import IdKind

if TYPE_CHECKING:
    from dispatcher.launch.claimant import Claimant

CARD_PREFIX = "c_"
RUN_PREFIX = "r_"
CARD_IDS = IdKind(name="card", prefix=CARD_PREFIX, digits=10, listing="dispatch kanban list")
"""Card ids: ``c_`` + 10 hex digits (made and looked up by :mod:`scope.foundation.ids`)."""
RUN_IDS = IdKind(name="run", prefix=RUN_PREFIX, digits=10, listing="dispatch kanban show CARD")
"""Run ids: ``r_`` + 10 hex digits."""

CARD_COLUMNS = (
    "id, title, body, assignee, status, priority, created_at, updated_at, started_at, "
    "completed_at, consecutive_failures, failure_limit, last_failure_error, block_kind, "
    "blocked_until, current_run_id, idempotency_key, tempfail_count, retry_at, cooldown_until, "
    "result, assignee_noted, group_name, turn"
)
COLUMN_OF = {"group": "group_name"}
"""Card fields stored under another column name (``group`` is an SQL keyword)."""
CARD_FIELDS = frozenset(
    {c.strip() for c in CARD_COLUMNS.split(",")} - set(COLUMN_OF.values()) | set(COLUMN_OF)
) - {"id"}
"""The card fields a store may change (as :class:`~dispatcher.kanban.model.Card` names them)."""


def card_of(row: sqlite3.Row, parents: Sequence[str]) -> Card:
    """A card row (with its parent ids) as a record."""
    return Card(
        id=row["id"],
        title=row["title"],
        body=row["body"],
        assignee=row["assignee"],
        status=CardStatus(row["status"]),
        priority=row["priority"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        started_at=row["started_at"],
        completed_at=row["completed_at"],
        consecutive_failures=row["consecutive_failures"],
        failure_limit=row["failure_limit"],
        last_failure_error=row["last_failure_error"],
        block_kind=BlockKind(row["block_kind"]) if row["block_kind"] else None,
        blocked_until=row["blocked_until"],
        current_run_id=row["current_run_id"],
        idempotency_key=row["idempotency_key"],
        parents=tuple(parents),
        tempfail_count=row["tempfail_count"],
        retry_at=row["retry_at"],
        cooldown_until=row["cooldown_until"],
        result=row["result"],
        assignee_noted=bool(row["assignee_noted"]),
        group=row["group_name"],
        turn=row["turn"],
    )


def run_of(row: sqlite3.Row) -> Run:
    """A run row as a record."""
    # Imported here, like Claimant below: adding a card or a worker's report never reads a
    # run, and every such command loads this module.
    from dispatcher.launch.outcome import Outcome

    return Run(
        run_id=row["run_id"],
        card_id=row["card_id"],
        attempt=row["attempt"],
        claimed_at=row["claimed_at"],
        outcome=Outcome(row["outcome"]) if row["outcome"] else None,
        exit_code=row["exit_code"],
        signal=row["signal"],
        session_id=row["session_id"],
        placement=row["placement"],
        unit=row["unit"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        error=row["error"],
        infrastructure=bool(row["infrastructure"]),
        claimant=claimant_of(row),
        ready_at=row["ready_at"],
    )


def claimant_of(row: Any) -> Claimant | None:
    """The claimant stored in a run row's ``claimer_*`` columns."""
    from dispatcher.launch.claimant import Claimant

    if row["claimer_pid"] is None:
        return None
    return Claimant(pid=row["claimer_pid"], start=row["claimer_start"], boot=row["claimer_boot"])


def db_value(value: Any) -> Any:
    """A record value as SQLite stores it (enums by value, booleans as 0/1)."""
    if isinstance(value, enum.Enum):  # CardStatus, BlockKind, Outcome
        return value.value
    if isinstance(value, bool):
        return int(value)
    return value
