"""The kanban board's errors (a branch of :class:`dispatcher.errors.DispatcherError`).

::

    DispatcherError
    └── KanbanError                 the board could not do what was asked
        ├── StaleRun                a worker command names a run that is not the card's open
        │                           run (exit 2, nothing changed)
        ├── WrongStatus             the card's status does not allow the action (exit 2)
        ├── BadCard                 an invalid card field or id (exit 2)
        └── BadQuery                a search term the board cannot read (exit 2)

Ids are looked up by the one id rule (:func:`scope.foundation.ids.lookup`): unknown or
malformed ids raise :class:`scope.foundation.errors.NotFoundError`, too short prefixes
:class:`scope.foundation.ids.IdTooShort`, ambiguous ones :class:`scope.foundation.ids.AmbiguousId`
(all exit 2).
"""

from __future__ import annotations

from typing import Any

from dispatcher.errors import DispatcherError
from scope.foundation.text import quote


class KanbanError(DispatcherError):
    """The board could not do what was asked."""


class StaleRun(KanbanError):
    """A fenced worker command carries a run id that is not the card's open run."""

    exit_code = 2

    def __init__(self, card_id: str, run_id: str, *, current: str | None, **fields: Any) -> None:
        super().__init__(
            remedy="nothing was changed; only the card's current worker may report on it",
            card_id=card_id,
            run_id=run_id,
            current=current,
            **fields,
        )

    def describe(self) -> str:
        current = self.fields["current"]
        now = f"its open run is {current}" if current else "it has no open run"
        return f"stale run {self.fields['run_id']} for card {self.fields['card_id']}: {now}"


class WrongStatus(KanbanError):
    """The card's status does not allow the requested action."""

    exit_code = 2

    def __init__(
        self, card_id: str, status: str, action: str, *, remedy: str | None = None, **fields: Any
    ) -> None:
        super().__init__(remedy=remedy, card_id=card_id, status=status, action=action, **fields)

    def describe(self) -> str:
        return (
            f"cannot {self.fields['action']} card {self.fields['card_id']}: "
            f"it is {self.fields['status']}"
        )


class BadCard(KanbanError):
    """A card field or id given by the user is invalid."""

    exit_code = 2

    def __init__(self, field: str, value: str, problem: str, *, remedy: str | None = None):
        super().__init__(remedy=remedy, field=field, value=value, problem=problem)

    def describe(self) -> str:
        value = quote(self.fields["value"])
        return f"invalid {self.fields['field']} {value}: {self.fields['problem']}"


class BadQuery(KanbanError):
    """A card search names something the board cannot search by (see
    :mod:`dispatcher.kanban.search`)."""

    exit_code = 2

    def __init__(self, term: str, problem: str, *, remedy: str | None = None):
        super().__init__(remedy=remedy, term=term, problem=problem)

    def describe(self) -> str:
        return f"search term {quote(self.fields['term'])}: {self.fields['problem']}"
