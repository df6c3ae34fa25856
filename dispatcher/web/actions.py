"""The actions (POST): add, edit, retry, unblock, move, archive a card; kill a run or session; pause
and resume the board; pause, resume and run a cron job now.

Each goes through the call the CLI makes (``Board.add`` ... through a workspace opened and
closed like a ``dispatch kanban`` command's, which pokes the gateway; ``CronJobs`` like
``dispatch cron``; the registry's ``kill`` like ``dispatch kill``), after the guard's
:func:`~dispatcher.web.guard.check_sender` and :func:`~dispatcher.web.guard.check_csrf`. What
destroys (archive, kill, a move that stops a live worker) first asks: without ``confirm=yes``
the answer is a confirmation page carrying the same form, so it works without JavaScript and
never needs a browser dialog. A successful action redirects (303) to the form's ``next`` page,
which must be a local path.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from dispatcher.kanban.errors import BadCard
from dispatcher.kanban.model import CardEdit
from dispatcher.web.errors import Conflict, FormError, form_field
from dispatcher.web.forms import Form, read_form
from dispatcher.web.guard import check_csrf, check_sender
from dispatcher.web.pages import site_of
from dispatcher.web.site import Site
from registry.abc import SessionState
from scope.foundation.errors import NotFoundError

_FORM_NAMES = {"assignee": "assignee", "parent card": "parents"}
"""Things a form names (an unknown one is a bad field, not a missing page)."""

T = TypeVar("T")

Question = Callable[[Form], str | None]
"""What to ask before acting (None: nothing to confirm)."""


def safe_next(text: str | None, default: str) -> str:
    """``text`` when it is a path on this site (never ``//host`` or a scheme), else ``default``."""
    if not text or not text.startswith("/") or text.startswith(("//", "/\\")):
        return default
    if any(ch in text for ch in "\r\n\\") or not text.isprintable():
        return default
    return text


async def _act(
    request: Request,
    action: str,
    do: Callable[[Site, Form], str | None],
    *,
    default_next: str,
    ask: Question | None = None,
) -> Response:
    """Read and check the form, confirm when asked to, do it, redirect."""
    site = site_of(request)
    check_sender(request)
    form = await read_form(request)
    check_csrf(request, site.keys, action, form.fields)
    if ask is not None and not form.confirmed:
        question = await site.run(lambda: _translated(lambda: ask(form)))
        if question is not None:
            return _confirm(site, request, question, form, default_next)
    target = await site.run(lambda: _translated(lambda: do(site, form)))
    return RedirectResponse(safe_next(target or form.get("next"), default_next), status_code=303)


def _translated(step: Callable[[], T]) -> T:
    """``step()`` with the board's validation errors said in the form's terms."""
    try:
        return step()
    except BadCard as err:
        named = str(err.fields["field"])
        if named in ("card id", "run id"):
            # The id in the address cannot be one: as unknown as a missing card.
            raise NotFoundError(named.split()[0], str(err.fields["value"])) from None
        # A board validation error names a CLI option; the form knows it as a field.
        raise FormError(form_field(err), str(err.fields["problem"])) from None
    except NotFoundError as err:
        field = _FORM_NAMES.get(str(err.fields.get("kind")))
        if field is None:
            raise  # an id in the address: 404
        raise FormError(field, err.message) from None


def _confirm(site: Site, request: Request, question: str, form: Form, back: str) -> Response:
    context = site.context(request, title="Confirm", nav="")
    context.update(
        question=question,
        action=request.url.path,
        fields=[(k, v) for k, v in form.fields.items() if k != "confirm"],
        back=safe_next(form.get("next"), back),
    )
    return site.page(request, "confirm.html", context)


# -- cards ------------------------------------------------------------------------------------


def _parents(text: str | None) -> list[str]:
    return [p for p in (text or "").replace(",", " ").split() if p]


async def add_card(request: Request) -> Response:
    """``POST /cards``: ``dispatch kanban add``."""

    def do(site: Site, form: Form) -> str | None:
        title = form.text("title", required=True)
        assignee = form.text("assignee", required=True)
        assert title is not None and assignee is not None
        with site.source.action() as workspace:
            card, _ = workspace.board.add(
                title,
                assignee=assignee,
                now=workspace.now(),
                body=form.get("body") or "",
                priority=form.integer("priority", default=0) or 0,
                parents=_parents(form.get("parents")),
                failure_limit=form.integer("failure_limit"),
            )
        return None if form.get("next") else f"/cards/{card.id}"

    return await _act(request, "card.add", do, default_next="/")


def _card_path(request: Request) -> str:
    return f"/cards/{request.path_params['card_id']}"


async def edit_card(request: Request) -> Response:
    """``POST /cards/{card_id}/edit``: ``dispatch kanban edit``."""
    card_id = request.path_params["card_id"]

    def do(site: Site, form: Form) -> str | None:
        edit = CardEdit(
            title=form.get("title"),
            body=form.get("body"),
            priority=form.integer("priority"),
            assignee=form.text("assignee"),
            failure_limit=form.integer("failure_limit"),
        )
        if not edit.changed():
            raise FormError("title", "nothing to change: give a title, body, priority or assignee")
        with site.source.action() as workspace:
            workspace.board.edit(card_id, edit, now=workspace.now())
        return None

    return await _act(request, "card.edit", do, default_next=_card_path(request))


async def unblock_card(request: Request) -> Response:
    """``POST /cards/{card_id}/unblock``: ``dispatch kanban unblock``."""
    card_id = request.path_params["card_id"]

    def do(site: Site, form: Form) -> str | None:
        with site.source.action() as workspace:
            workspace.board.unblock(card_id, now=workspace.now())
        return None

    return await _act(request, "card.unblock", do, default_next=_card_path(request))


async def retry_card(request: Request) -> Response:
    """``POST /cards/{card_id}/retry``: ``dispatch kanban retry`` (a fresh attempt count; a
    back-off or a worker's defer cut short)."""
    card_id = request.path_params["card_id"]

    def do(site: Site, form: Form) -> str | None:
        with site.source.action() as workspace:
            now = workspace.now()
            workspace.board.retry(card_id, reason="retried in dispatch web", now=now)
        return None

    return await _act(request, "card.retry", do, default_next=_card_path(request))


async def move_card(request: Request) -> Response:
    """``POST /cards/{card_id}/move`` (``status``): ``dispatch kanban move``; asks first when
    the card's worker would be stopped."""
    card_id = request.path_params["card_id"]

    def ask(form: Form) -> str | None:
        card = site_of(request).source.store.resolve_card(card_id)
        status = form.text("status", required=True)
        if card.current_run_id is None:
            return None
        return f"Move card {card.id} ({card.title}) to {status}? Its running worker is stopped."

    def do(site: Site, form: Form) -> str | None:
        status = form.text("status", required=True)
        assert status is not None
        with site.source.action() as workspace:
            workspace.board.move(card_id, status, now=workspace.now())
        return None

    return await _act(request, "card.move", do, default_next=_card_path(request), ask=ask)


async def archive_card(request: Request) -> Response:
    """``POST /cards/{card_id}/archive``: ``dispatch kanban archive`` (asks first)."""
    card_id = request.path_params["card_id"]

    def ask(form: Form) -> str | None:
        card = site_of(request).source.store.resolve_card(card_id)
        stop = " Its running worker is stopped." if card.current_run_id else ""
        return f"Archive card {card.id} ({card.title})?{stop}"

    def do(site: Site, form: Form) -> str | None:
        with site.source.action() as workspace:
            workspace.board.archive(card_id, now=workspace.now())
        return None

    return await _act(request, "card.archive", do, default_next=_card_path(request), ask=ask)


async def kill_run(request: Request) -> Response:
    """``POST /runs/{run_id}/kill``: ``dispatch kill`` of the run's worker (asks first); the
    run then closes as it would at the gateway's next look."""
    run_id = request.path_params["run_id"]

    def ask(form: Form) -> str | None:
        run = site_of(request).source.store.resolve_run(run_id)
        return f"Kill run {run.run_id} (attempt {run.attempt} of card {run.card_id})?"

    def do(site: Site, form: Form) -> str | None:
        with site.source.action() as workspace:
            run = workspace.store.resolve_run(run_id)
            if not run.open:
                raise Conflict(f"run {run.run_id} already ended ({run.outcome})")
            if run.session_id is None:
                raise Conflict(
                    f"run {run.run_id} has not started its worker yet",
                    remedy="archive or move the card to stop it",
                )
            _kill(workspace.registry(), run.session_id, f"run {run.run_id} killed in dispatch web")
            workspace.refresh()
        return f"/cards/{run.card_id}"

    return await _act(request, "run.kill", do, default_next="/", ask=ask)


async def kill_session(request: Request) -> Response:
    """``POST /sessions/{session_id}/kill``: ``dispatch kill`` (asks first)."""
    session_id = request.path_params["session_id"]

    def ask(form: Form) -> str | None:
        session = site_of(request).source.registry().resolve(session_id)
        if session.finished:
            return None
        return f"Kill session {session.id} ({' '.join(session.argv)[:120]})?"

    def do(site: Site, form: Form) -> str | None:
        registry = site.source.registry()
        session = registry.resolve(session_id)
        _kill(registry, session.id, "killed in dispatch web")
        return f"/sessions/{session.id}"

    return await _act(request, "session.kill", do, default_next="/sessions", ask=ask)


def _kill(registry: Any, session_id: str, reason: str) -> None:
    final = registry.kill(session_id, state=SessionState.KILLED, reason=reason).session
    if not final.finished:
        raise Conflict(
            f"session {session_id} survived the kill",
            remedy=f"try again, or run 'dispatch kill {session_id}'",
        )


# -- the board and cron -----------------------------------------------------------------------


async def pause_board(request: Request) -> Response:
    """``POST /board/pause``: ``dispatch kanban pause``."""
    return await _board_paused(request, True)


async def resume_board(request: Request) -> Response:
    """``POST /board/resume``: ``dispatch kanban resume``."""
    return await _board_paused(request, False)


async def _board_paused(request: Request, paused: bool) -> Response:
    def do(site: Site, form: Form) -> str | None:
        with site.source.action() as workspace:
            workspace.store.set_paused(paused)
        return None

    action = "board.pause" if paused else "board.resume"
    return await _act(request, action, do, default_next="/")


async def cron_pause(request: Request) -> Response:
    """``POST /cron/{job_id}/pause``: ``dispatch cron pause``."""
    return await _cron_paused(request, True)


async def cron_resume(request: Request) -> Response:
    """``POST /cron/{job_id}/resume``: ``dispatch cron resume``."""
    return await _cron_paused(request, False)


async def _cron_paused(request: Request, paused: bool) -> Response:
    job_id = request.path_params["job_id"]

    def do(site: Site, form: Form) -> str | None:
        site.source.cron().set_paused(job_id, paused, time.time())
        return None

    action = "cron.pause" if paused else "cron.resume"
    return await _act(request, action, do, default_next="/cron")


async def cron_run(request: Request) -> Response:
    """``POST /cron/{job_id}/run``: ``dispatch cron run`` (its own manual fire key)."""
    job_id = request.path_params["job_id"]

    def do(site: Site, form: Form) -> str | None:
        jobs = site.source.cron()
        jobs.plan(job_id)
        with site.source.cron_runtime() as runtime:
            record = jobs.scheduler(runtime).run_now(job_id)
        if record.session_id and not form.get("next"):
            return f"/sessions/{record.session_id}"
        return None

    return await _act(request, "cron.run", do, default_next="/cron")
