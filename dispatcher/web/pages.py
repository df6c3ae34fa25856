"""The pages (GET): board, card, cron, cron job, sessions, session, status, hosts.

Each page has a context builder (a plain function of the site, the request and the page's
parameters, run in a worker thread) that both the page and its live stream use: a stream
re-renders a block of the same template from the same builder, so a live update can never
show something the page itself would not. Unknown ids raise NotFoundError (404).
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from dispatcher.cron.report import attempt_text, history_lines, policy_text
from dispatcher.kanban.model import MOVE_TARGETS, CardStatus, Run
from dispatcher.kanban.views import deferred_cards
from dispatcher.launch.resources import sessions_of, used_text
from dispatcher.timefmt import TimeView
from dispatcher.web import views
from dispatcher.web.live import present
from dispatcher.web.site import Site
from dispatcher.web.text import TAIL_BYTES, tail_start
from registry.abc import Session
from scope.foundation.errors import NotFoundError
from scope.foundation.ids import IdTooShort

SESSIONS_SHOWN = 200
HISTORY_ROWS = 50


def site_of(request: Request) -> Site:
    """The site the app was built with."""
    site: Site = request.app.state.site
    return site


def _offset(request: Request, name: str) -> int:
    try:
        return max(0, int(request.query_params.get(name, "0")))
    except ValueError:
        return 0


# -- board ------------------------------------------------------------------------------------


def board_context(site: Site, request: Request) -> dict[str, Any]:
    """The board: a column per status (done cards paginated)."""
    source = site.source
    source.refresh()
    store = source.store
    seq = store.last_event_seq()  # before the cards: the stream resends what follows
    done_offset = _offset(request, "done")
    # Only what the columns show is read: the first cards of each, one page of done ones.
    shown = [
        card
        for status in views.ACTIVE
        for card in store.list_cards(statuses=[status], limit=views.COLUMN_LIMIT)
    ]
    shown += store.done_cards(offset=done_offset, limit=views.DONE_PAGE)
    runs = store.open_runs()
    counts = store.status_counts()
    kanban = source.settings.kanban
    running = [c.id for c in shown if c.current_run_id]
    tiles = views.tiles(
        shown,
        runs,
        local_host=source.host_id,
        limit_for=kanban.limit_for,
        hosts=source.run_hosts(running) if source.cluster_configured else None,
        assignees=frozenset(source.settings.kanban.assignees),
        waits=source.limit_waits(shown),
        deferred=deferred_cards(shown, store.runs_of, time.time()),
    )
    context = site.context(request, title="Board", nav="board", stream=f"/live/board?after={seq}")
    context.update(
        columns=views.columns(tiles, counts, done_offset=done_offset),
        paused=store.paused(),
        assignees=sorted(kanban.assignees),
        done_page=views.DONE_PAGE,
        running=counts.get(CardStatus.RUNNING, 0),
        max_in_progress=kanban.max_in_progress,
        strip=_strip(site),
    )
    return context


def _strip(site: Site) -> Any:
    from dispatcher.web.charts import strip  # the charts module builds on this one

    return strip(site)


async def board(request: Request) -> Response:
    """``GET /``."""
    site = site_of(request)
    return await site.render("board.html", lambda: board_context(site, request))


# -- card -------------------------------------------------------------------------------------


def resolve_card_id(site: Site, text: str) -> str:
    """The full id of the card ``text`` names (a too short id is as unknown as a missing one)."""
    try:
        return site.source.store.resolve_card(text).id
    except IdTooShort:
        raise NotFoundError("card", text) from None


def log_tail(site: Site, session: Session) -> tuple[str, int, bool]:
    """The end of a session's log as inert text, the offset where a live tail continues and
    whether earlier output was left out."""
    registry = site.source.registry()
    size = registry.log_size(session.id) or 0
    start = max(0, size - TAIL_BYTES)
    data = registry.read_log(session.id, byte_range=(start, size))
    begin = tail_start(data, start)
    body = data[begin - start :]
    if not session.finished:
        # A running worker's unfinished line is left to the live tail, which shows it whole.
        body = body[: body.rfind(b"\n") + 1]
    return present(site.source, session, body), begin + len(body), begin > 0


def _log_session(site: Site, runs: list[Run]) -> Session | None:
    for run in reversed(runs):
        if run.session_id:
            try:
                return site.source.registry().get(run.session_id)
            except NotFoundError:
                return None
    return None


def card_context(
    site: Site, request: Request, card_id: str, *, with_log: bool = True
) -> dict[str, Any]:
    """One card with its runs, events and (``with_log``) the tail of its latest worker."""
    source = site.source
    store = source.store
    source.refresh()
    seq = store.last_event_seq()
    card = store.get_card(card_id)
    runs = store.runs_of(card_id)
    events = store.events_of(card_id)
    now = time.time()
    session = _log_session(site, runs) if with_log else None
    log_text, log_offset, log_cut = ("", 0, False)
    if session is not None:
        log_text, log_offset, log_cut = log_tail(site, session)
    stream = f"/live/cards/{card.id}?after={seq}"
    if session is not None:
        stream += f"&session={session.id}&offset={log_offset}"
    current = next((r for r in runs if r.run_id == card.current_run_id), None)
    hosts = source.run_hosts([card.id])
    ran = sessions_of(source.registry(), (run.session_id for run in runs))
    context = site.context(request, title=card.title, nav="board", stream=stream)
    context.update(
        card=card,
        runs=[
            {
                "run": run,
                "duration": views.run_duration(run, now),
                "host": views.run_host(run, hosts, source.host_id),
                "session": ran.get(run.session_id or ""),
            }
            for run in reversed(runs)
        ],
        events=[{"event": e, "summary": views.event_summary(e)} for e in reversed(events)],
        current=current,
        waiting=source.limit_waits([card]).get(card.id),
        session=session,
        log_text=log_text,
        log_cut=log_cut,
        failure_limit=card.failure_limit or source.settings.kanban.limit_for(card.assignee),
        assignees=sorted(source.settings.kanban.assignees),
        move_targets=[s.value for s in MOVE_TARGETS if s is not card.status],
        retryable=_retryable(card),
    )
    return context


def _retryable(card: Any) -> bool:
    """Whether an operator's retry would take (:func:`~dispatcher.kanban.rules.retry_change`
    decides; the card page offers the button only then)."""
    from dispatcher.kanban.rules import RETRYABLE, waits

    if card.current_run_id is not None:
        return False
    return card.status in RETRYABLE or (card.status is CardStatus.READY and waits(card))


async def card(request: Request) -> Response:
    """``GET /cards/{card_id}`` (a unique prefix redirects to the full id)."""
    site = site_of(request)
    given = request.path_params["card_id"]
    card_id = await site.run(lambda: resolve_card_id(site, given))
    if card_id != given:
        return RedirectResponse(f"/cards/{card_id}", status_code=303)
    return await site.render("card.html", lambda: card_context(site, request, card_id))


async def run_page(request: Request) -> Response:
    """``GET /runs/{run_id}``: the run's card, at the run."""
    site = site_of(request)
    given = request.path_params["run_id"]

    def find() -> Run:
        try:
            return site.source.store.resolve_run(given)
        except IdTooShort:
            raise NotFoundError("run", given) from None

    run = await site.run(find)
    return RedirectResponse(f"/cards/{run.card_id}#{run.run_id}", status_code=303)


# -- cron -------------------------------------------------------------------------------------


def cron_context(site: Site, request: Request, job_id: str | None = None) -> dict[str, Any]:
    """Every job (schedule, zone, next five fires, last outcome, pause state) and the
    history; with ``job_id`` one job's history only (NotFoundError when unknown)."""
    jobs = site.source.cron()
    if job_id is not None:
        jobs.check_known(job_id)
    jobs.settle_open(site.source.runtime)
    now = time.time()
    listed = [v for v in jobs.views(now, upcoming=5) if job_id in (None, v.plan.job.id)]
    rows = jobs.ledger.history(job_id, HISTORY_ROWS * (2 if job_id else 1))
    stream = "/live/cron" + (f"/{job_id}" if job_id else "")
    title = f"Cron job {job_id}" if job_id else "Cron"
    context = site.context(request, title=title, nav="cron", stream=stream)
    context.update(jobs=listed, history=rows, job_id=job_id, configured=bool(jobs.plans))
    # A fire's tries and its pending next try, worded as `cron history` words them.
    view = TimeView(now=now)
    context["tries"] = {row.id: (attempt_text(row), history_lines(row, view)) for row in rows}
    # Each fire's class, peak memory and CPU time come with its session (this host's).
    ran = [row.session_id for row in rows if row.session_id]
    context["sessions"] = sessions_of(site.source.registry(), ran) if ran else {}
    # One job's page says what it runs and how, as ``cron list`` does.
    context["job"] = _job_facts(listed[0].entry) if job_id and listed else None
    return context


def _job_facts(entry: dict[str, Any]) -> dict[str, str]:
    command = entry["command"]
    return {
        "command": command if isinstance(command, str) else shlex.join(command),
        "shell": "yes" if isinstance(command, str) else "no",
        "policies": policy_text(entry),
    }


def cron_fingerprint(site: Site) -> Any:
    """Changes when a fire is decided, starts or ends, a job is paused, or half a minute
    passes (the next fires move on)."""
    ledger = site.source.ledger()
    newest = ledger.history(None, 1)
    return (
        newest[0].id if newest else 0,
        tuple((row.id, row.status.value) for row in ledger.open_rows()),
        tuple(sorted((k, v.paused) for k, v in ledger.job_states().items())),
        int(time.time() // 30),
    )


async def cron(request: Request) -> Response:
    """``GET /cron``."""
    site = site_of(request)
    return await site.render("cron.html", lambda: cron_context(site, request))


async def cron_job(request: Request) -> Response:
    """``GET /cron/{job_id}``."""
    site = site_of(request)
    job_id = request.path_params["job_id"]
    return await site.render("cron.html", lambda: cron_context(site, request, job_id))


# -- sessions ---------------------------------------------------------------------------------


def sessions_context(site: Site, request: Request) -> dict[str, Any]:
    """The registry's sessions (``dispatch ps``; ``?all=1`` adds finished ones)."""
    everything = request.query_params.get("all") == "1"
    sessions = site.source.registry().list_sessions(include_finished=everything)
    stream = "/live/sessions" + ("?all=1" if everything else "")
    context = site.context(request, title="Sessions", nav="sessions", stream=stream)
    context.update(
        sessions=sessions[:SESSIONS_SHOWN],
        more=max(0, len(sessions) - SESSIONS_SHOWN),
        everything=everything,
    )
    return context


def sessions_fingerprint(site: Site) -> Any:
    """Changes when a session starts or ends (an ending one leaves the running list, which is
    all that is read: finished sessions may be many)."""
    return tuple(s.id for s in site.source.registry().list_sessions())


async def sessions(request: Request) -> Response:
    """``GET /sessions``."""
    site = site_of(request)
    return await site.render("sessions.html", lambda: sessions_context(site, request))


def session_context(site: Site, request: Request, session_id: str) -> dict[str, Any]:
    """One session with the tail of its log (NotFoundError for an unknown id)."""
    session = site.source.registry().resolve(session_id)
    text, offset, cut = log_tail(site, session)
    stream = f"/live/sessions/{session.id}?offset={offset}"
    context = site.context(request, title=f"Session {session.id}", nav="sessions", stream=stream)
    # The log's size on disk now (the registry's output seam), not the byte count the session
    # record last stored: that one is written when the worker ends.
    size = site.source.registry().log_size(session.id) or 0
    context.update(
        session=session, log_text=text, log_cut=cut, log_bytes=size, used=used_text(session)
    )
    return context


async def session(request: Request) -> Response:
    """``GET /sessions/{session_id}`` (a unique prefix redirects to the full id)."""
    site = site_of(request)
    given = request.path_params["session_id"]
    found = await site.run(lambda: site.source.registry().resolve(given))
    if found.id != given:
        return RedirectResponse(f"/sessions/{found.id}", status_code=303)
    return await site.render("session.html", lambda: session_context(site, request, found.id))


# -- status and hosts -------------------------------------------------------------------------


DEAD_SHOWN = 20
"""The newest dead notifications the status page lists."""


def status_context(site: Site, request: Request) -> dict[str, Any]:
    """``dispatch status`` plus the doctor's placement verdicts and remedies."""
    from dispatcher.gateway.report import status_document

    source = site.source
    doc = status_document(source.runtime(), source.environ)
    context = site.context(request, title="Status", nav="status", stream="/live/status")
    # Dead notifications wait for an operator ('dispatch notify retry ID'), as notify list
    # --dead shows them.
    dead = source.reader.cluster.notify_store().list(state="dead", limit=DEAD_SHOWN)
    context.update(doc=doc, doctor=source.doctor(), dead=dead, limits=source.limits())
    return context


def clock_fingerprint(seconds: float) -> Any:
    """A fingerprint that changes every ``seconds`` (pages that show ages and leases)."""
    return int(time.time() // seconds)


async def status(request: Request) -> Response:
    """``GET /status``."""
    site = site_of(request)
    return await site.render("status.html", lambda: status_context(site, request))


def hosts_context(site: Site, request: Request) -> dict[str, Any]:
    """The cluster's hosts and leases; without a cluster database, says so."""
    source = site.source
    hosts = source.hosts() if source.cluster_configured else []
    context = site.context(request, title="Hosts", nav="hosts", stream="/live/hosts")
    context.update(hosts=hosts, lease_ttl=source.settings.cluster.lease_ttl, me=source.host_id)
    return context


async def hosts(request: Request) -> Response:
    """``GET /hosts``."""
    site = site_of(request)
    return await site.render("hosts.html", lambda: hosts_context(site, request))
