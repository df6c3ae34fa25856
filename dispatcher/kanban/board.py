"""Operator and worker actions on the board, validated before anything is stored.

:class:`Board` is what the CLI (and library users) call: ``add`` checks the assignee, title and
parents first so bad input changes nothing; worker commands are fenced by the run id; ``move``
and ``archive`` stop a card's live worker through the registry before changing the card, in the
same transaction that closes its run, so a card never keeps a worker it no longer wants.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.errors import BadCard, StaleRun, WrongStatus
from dispatcher.kanban.model import (
    MOVE_TARGETS,
    BlockKind,
    Card,
    CardChange,
    CardEdit,
    CardStatus,
    EventKind,
    NewCard,
    Run,
    move_fields,
)
from scope.foundation.errors import NotFoundError
from scope.foundation.ids import IdTooShort
from scope.foundation.text import strip_blanks, unsafe_char

if TYPE_CHECKING:
    from dispatcher.launch.outcome import Result
    from registry.abc import Registry

# What a card's text may be (docs/kanban.md, "Card text"): titles and idempotency keys are
# printable text on one line; a body, a result and a block reason may also hold tabs and line
# breaks. NUL, other control characters and bytes that are not UTF-8 are refused everywhere:
# the title and body reach workers as environment variables and are printed to terminals.
MAX_TITLE = 500
MAX_BODY = 16 * 1024 * 1024
MAX_KEY = 200
MAX_GROUP = 100
MAX_NOTE = 64 * 1024
PRIORITY_RANGE = (-(10**9), 10**9)
"""The priorities a card may have (``--priority``, the API's ``priority``)."""
FAILURE_LIMIT_RANGE = (1, 10**6)
"""A card's own ``--failure-limit`` (overrides ``kanban.failure_limit``)."""
_RUN_ID = re.compile(r"r_[0-9a-f]{4,}")


class BoardSettings(Protocol):
    """What the board's checks read of the ``kanban:`` settings: the assignee names and how
    long a transient block lasts. :class:`~dispatcher.kanban.settings.KanbanSettings` is one;
    so is the CLI's config snapshot (:mod:`dispatcher.app.snapshot`), which spares a short
    write command the whole config schema."""

    @property
    def assignees(self) -> Collection[str]:
        """The configured assignee names (a mapping by name counts)."""

    @property
    def transient_block(self) -> float:
        """Seconds a ``transient`` block lasts (``kanban.transient_block``)."""


class Board:
    """Validated actions on a :class:`~dispatcher.kanban.abc.BoardStore`.

    ``registry`` is a callable returning the registry, opened only when an action must stop a
    live worker (``move``/``archive`` of a card with an open run). ``state_dir`` locates body
    files to clean up."""

    def __init__(
        self,
        store: BoardStore,
        settings: BoardSettings,
        *,
        registry: Callable[[], Registry] | None = None,
        state_dir: Any = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self._registry = registry
        self._state_dir = state_dir

    # -- validation --------------------------------------------------------------------------

    def check_assignee(self, name: str) -> str:
        """The name when ``kanban.assignees`` has it; else NotFoundError naming the known."""
        if name not in self.settings.assignees:
            known = ", ".join(sorted(self.settings.assignees)) or "none are configured"
            raise NotFoundError(
                "assignee",
                name,
                remedy=f"use one of the kanban.assignees in the config ({known})",
            )
        return name

    @staticmethod
    def check_title(title: str) -> str:
        """A non-empty single-line title (surrounding spaces and tabs removed)."""
        text = strip_blanks(title)
        if not text:
            raise BadCard("title", title, "must not be empty")
        if "\n" in text or "\r" in text:
            raise BadCard("title", title, "must be a single line (put details in --body)")
        return check_text("title", text, MAX_TITLE)

    @staticmethod
    def check_group(group: str, *, clearing: bool = False) -> str:
        """A card group: printable text on one line, at most 100 characters, blanks around it
        removed; the empty string only where it means "no group" (``clearing``)."""
        text = strip_blanks(group)
        if not text and not clearing:
            raise BadCard("--group", group, "must not be empty (leave --group out for none)")
        return check_text("--group", text, MAX_GROUP)

    def resolve_parents(self, texts: Sequence[str]) -> tuple[str, ...]:
        """Card ids for ``--parent`` values (too short → BadCard, unknown or malformed →
        NotFoundError)."""
        found: list[str] = []
        for text in texts:
            try:
                card = self.store.resolve_card(text)
            except IdTooShort as err:
                problem = f"too short: give at least {err.fields['minimum']} characters of the id"
                raise BadCard("--parent", text, problem) from None
            except NotFoundError:
                raise NotFoundError(
                    "parent card", text, remedy="check the --parent ids with 'dispatch kanban list'"
                ) from None
            if card.id not in found:
                found.append(card.id)
        return tuple(found)

    # -- operator ----------------------------------------------------------------------------

    def add(
        self,
        title: str,
        *,
        assignee: str,
        now: float,
        body: str = "",
        priority: int = 0,
        parents: Sequence[str] = (),
        idempotency_key: str | None = None,
        failure_limit: int | None = None,
        group: str | None = None,
    ) -> tuple[Card, bool]:
        """Validate, then store a card; a repeated idempotency key returns the existing card
        (and False) without checking anything else."""
        if idempotency_key is not None:
            if not strip_blanks(idempotency_key):
                raise BadCard("--idempotency-key", idempotency_key, "must not be empty")
            check_text("--idempotency-key", idempotency_key, MAX_KEY)
        clean_title = self.check_title(title)
        check_text("body", body, MAX_BODY, lines=True)
        self.check_assignee(assignee)
        if failure_limit is not None and failure_limit < 1:
            raise BadCard("--failure-limit", str(failure_limit), "must be at least 1")
        group = None if group is None else self.check_group(group)
        parent_ids = self.resolve_parents(parents)
        return self.store.add_card(
            NewCard(
                title=clean_title,
                assignee=assignee,
                body=body,
                priority=priority,
                parents=parent_ids,
                idempotency_key=idempotency_key,
                failure_limit=failure_limit,
                group=group,
            ),
            now=now,
        )

    def edit(self, card_text: str, edit: CardEdit, *, now: float) -> Card:
        """Change a card's fields (validated like ``add``)."""
        card = self.store.resolve_card(card_text)
        if edit.title is not None:
            edit = CardEdit(**{**edit.__dict__, "title": self.check_title(edit.title)})
        if edit.body is not None:
            check_text("body", edit.body, MAX_BODY, lines=True)
        if edit.assignee is not None:
            self.check_assignee(edit.assignee)
        if edit.failure_limit is not None and edit.failure_limit < 1:
            raise BadCard("--failure-limit", str(edit.failure_limit), "must be at least 1")
        if edit.group is not None:
            edit = CardEdit(
                **{**edit.__dict__, "group": self.check_group(edit.group, clearing=True)}
            )
        return self.store.edit_card(card.id, edit, now=now)

    def unblock(self, card_text: str, *, now: float) -> Card:
        """``blocked`` → ``ready`` with the counts reset."""
        return self.store.unblock(self.store.resolve_card(card_text).id, now=now)

    def retry(self, card_text: str, *, reason: str | None = None, now: float) -> Card:
        """Start a card over (``kanban retry``, the web's and the API's retry): a ``done``,
        ``blocked`` or ``review`` card, or a ``ready`` one backing off or deferred, becomes
        ``ready`` now with a fresh attempt count, the reason in its event (see
        :meth:`~dispatcher.kanban.abc.BoardStore.retry`, a compare-and-set)."""
        note = check_text("--reason", strip_blanks(reason or ""), MAX_NOTE, lines=True)
        card = self.store.resolve_card(card_text)
        return self.store.retry(card.id, reason=note or "operator retry", now=now)

    def move(self, card_text: str, status: str, *, now: float) -> Card:
        """Operator override; a live worker is stopped first."""
        try:
            target = CardStatus(status)
        except ValueError:
            target = None
        if target not in MOVE_TARGETS or target is None:
            raise BadCard(
                "status",
                status,
                "cards can be moved to " + ", ".join(s.value for s in MOVE_TARGETS),
                remedy="'running' is reached only by a claim; use 'archive' to archive",
            )
        card = self.store.resolve_card(card_text)
        if card.current_run_id is None:
            return self.store.move(card.id, target, now=now)
        return self._stop_then(
            card,
            now,
            lambda current: CardChange(
                fields=move_fields(current, target, now),
                events=(
                    (
                        EventKind.MOVED,
                        {"from": current.status.value, "to": target.value, "by": "operator"},
                    ),
                ),
            ),
            action="move",
        )

    def archive(self, card_text: str, *, now: float) -> Card:
        """Archive a card; a live worker is stopped first."""
        card = self.store.resolve_card(card_text)
        if card.current_run_id is None:
            return self.store.archive(card.id, now=now)
        return self._stop_then(
            card,
            now,
            lambda current: CardChange(
                fields={"status": CardStatus.ARCHIVED},
                events=((EventKind.ARCHIVED, {"from": current.status.value}),),
            ),
            action="archive",
        )

    def _stop_then(
        self, card: Card, now: float, change: Callable[[Card], CardChange], *, action: str
    ) -> Card:
        assert card.current_run_id is not None
        run = self.store.get_run(card.current_run_id)
        result = self._stop(run, f"card {card.id}: {action} by the operator")

        def decide(current: Card, _run: Run) -> CardChange:
            then = change(current)
            stopped = (EventKind.STOPPED, {"action": action, "outcome": result.outcome.value})
            return CardChange(fields=then.fields, events=(stopped, *then.events))

        done = self.store.close_run(run.run_id, result, decide, now=now)
        if done is None:
            # The run closed by itself meanwhile; apply the action to the card as it is now.
            current = self.store.get_card(card.id)
            if action == "archive":
                return self.store.archive(card.id, now=now)
            status = change(current).fields["status"]
            return self.store.move(card.id, CardStatus(status), now=now)
        if self._state_dir is not None:
            from dispatcher.kanban.worker import remove_body

            remove_body(self._state_dir, run.run_id)
        return done[1]

    def _stop(self, run: Run, reason: str) -> Result:
        """Kill the run's worker (if any) and say how the run ended."""
        # Imported here: only stopping a live worker needs the launch core and the registry's
        # vocabulary, and every `kanban add` pays for what this module imports.
        from dispatcher.launch.outcome import Outcome, Result, outcome_of
        from registry.abc import SessionState

        if run.session_id is None:
            # Not spawned yet: closing the run makes its spawner stop what it starts.
            return Result(outcome=Outcome.RECLAIMED, error=f"{reason} before its worker started")
        if self._registry is None:
            raise WrongStatus(
                run.card_id, "running", "stop the worker of", remedy="no registry available"
            )
        try:
            snapshot = self._registry().kill(
                run.session_id, state=SessionState.KILLED, reason=reason
            )
        except NotFoundError:
            return Result(
                outcome=Outcome.LOST,
                error=f"session {run.session_id} is no longer known to the registry",
                session_id=run.session_id,
            )
        session = snapshot.session
        if not session.finished:
            raise WrongStatus(
                run.card_id,
                "running",
                "stop the worker of",
                remedy=f"session {session.id} survived the kill; try 'dispatch kill {session.id}'",
            )
        return outcome_of(session)

    # -- worker (fenced) ---------------------------------------------------------------------

    def _fenced(self, card_text: str, run_text: str | None) -> tuple[Card, str]:
        card = self.store.resolve_card(card_text)
        if not run_text:
            raise BadCard(
                "run id",
                "",
                "worker commands need the run id",
                remedy="pass --run RUN_ID or run inside a worker (DISPATCH_RUN_ID is set there)",
            )
        run_id = strip_blanks(run_text)
        if not _RUN_ID.fullmatch(run_id):
            raise BadCard("run id", run_text, "run ids look like r_1a2b3c4d5e")
        if run_id != card.current_run_id:
            raise StaleRun(card.id, run_id, current=card.current_run_id)
        return card, run_id

    def complete(
        self, card_text: str, run_text: str | None, *, now: float, result: str | None = None
    ) -> Card:
        """The worker says its card is done (wins over a later non-zero exit)."""
        if result is not None:
            check_text("--result", result, MAX_NOTE, lines=True)
        card, run_id = self._fenced(card_text, run_text)
        return self.store.worker_move(card.id, run_id, CardStatus.DONE, now=now, result=result)

    def block(
        self, card_text: str, run_text: str | None, *, kind: str, reason: str, now: float
    ) -> Card:
        """The worker blocks its card: ``needs_input`` or ``transient``."""
        try:
            block_kind = BlockKind(kind)
        except ValueError:
            raise BadCard("--kind", kind, "use needs_input or transient") from None
        if not strip_blanks(reason):
            raise BadCard("--reason", reason, "must not be empty")
        check_text("--reason", reason, MAX_NOTE, lines=True)
        card, run_id = self._fenced(card_text, run_text)
        until = now + self.settings.transient_block if block_kind is BlockKind.TRANSIENT else None
        return self.store.worker_move(
            card.id,
            run_id,
            CardStatus.BLOCKED,
            now=now,
            block_kind=block_kind,
            blocked_until=until,
            reason=strip_blanks(reason),
        )

    def defer(
        self, card_text: str, run_text: str | None, *, until: float, reason: str, now: float
    ) -> Card:
        """The worker chooses its card's next try: when the run ends it is ``deferred`` (not
        counted) and the card is ready again at ``until``."""
        if reason:
            check_text("--reason", reason, MAX_NOTE, lines=True)
        if until <= now:
            raise BadCard("--until", str(until), "the time must be in the future")
        card, run_id = self._fenced(card_text, run_text)
        if card.status is not CardStatus.RUNNING:
            raise WrongStatus(
                card.id,
                card.status.value,
                "defer",
                remedy="the worker already reported on this card; nothing was changed",
            )
        data = {"by": "worker", "until": until, "reason": strip_blanks(reason) or None}
        self.store.append_event(
            card.id, EventKind.DEFERRED, data, now=now, run_id=run_id, fields={"retry_at": until}
        )
        return self.store.get_card(card.id)

    def review(self, card_text: str, run_text: str | None, *, now: float) -> Card:
        """The worker hands its card to review."""
        card, run_id = self._fenced(card_text, run_text)
        return self.store.worker_move(card.id, run_id, CardStatus.REVIEW, now=now)


def check_text(field: str, text: str, max_chars: int, *, lines: bool = False) -> str:
    """``text`` when it fits the card text rules (see MAX_TITLE above); else BadCard."""
    if len(text) > max_chars:
        raise BadCard(field, text, f"longer than {max_chars} characters ({len(text)})")
    bad = unsafe_char(text, newlines=lines)
    if bad is not None:
        allowed = "printable text, tabs and line breaks" if lines else "printable text on one line"
        raise BadCard(field, text, f"contains {bad}; only {allowed} is accepted")
    return text
