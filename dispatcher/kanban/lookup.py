"""Card and run ids where a session id is expected (``dispatch logs c_1a2b`` or ``r_9f8e``)."""

from __future__ import annotations

from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.rows import CARD_PREFIX, RUN_PREFIX
from scope.foundation.errors import NotFoundError
from scope.foundation.text import strip_blanks


def resolve_session_id(store: BoardStore, text: str) -> str | None:
    """The session behind a card id (its latest run that has one) or a run id.

    Returns None when ``text`` is not written as a card (``c_``) or run (``r_``) id, so the
    caller can treat it as a session id. Raises NotFoundError / AmbiguousId (exit 2) for an
    unknown or ambiguous card or run, or one that never started a worker."""
    given = strip_blanks(text)
    if given.startswith(CARD_PREFIX):
        card = store.resolve_card(given)
        for run in reversed(store.runs_of(card.id)):
            if run.session_id:
                return run.session_id
        raise NotFoundError(
            "session for card",
            card.id,
            remedy="the card has not started a worker yet; see 'dispatch kanban show'",
        )
    if given.startswith(RUN_PREFIX):
        run = store.resolve_run(given)
        if run.session_id:
            return run.session_id
        raise NotFoundError(
            "session for run",
            run.run_id,
            remedy=f"the run ended as {run.outcome or 'open'} without starting a worker",
        )
    return None
