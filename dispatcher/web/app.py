"""The Starlette application of ``dispatch web``: routes, error pages, the guard around it all.

Every failure answers with the same error page, its status chosen by the error's class
(:func:`~dispatcher.web.errors.http_status`): 404 for an unknown card, run, session, job or
path, 400 naming a malformed form field, 403 with a reload hint for a stale form, 409 for an
action the state does not allow, 503 while the state database is unusable, 500 (and a log
line, never a traceback on the page) for a bug.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES, GZipMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from dispatcher.web import actions, cockpit, pages, streams
from dispatcher.web.api import router as api
from dispatcher.web.api.problems import problem
from dispatcher.web.errors import http_status
from dispatcher.web.guard import API_PREFIX, Access, Guard, Refused
from dispatcher.web.keys import Keys
from dispatcher.web.live import Hub
from dispatcher.web.metrics import metrics_registry
from dispatcher.web.render import STATIC, Renderer
from dispatcher.web.roller import Roller
from dispatcher.web.site import Site
from dispatcher.web.source import Source
from scope.foundation.errors import DispatchError

_log = logging.getLogger("dispatch.web")

COMPRESSED_FROM = 1024
"""Answers of at least this many bytes go gzip-compressed to a browser that takes it."""
UNCOMPRESSED = (*DEFAULT_EXCLUDED_CONTENT_TYPES, "text/event-stream")
"""Never compressed: the live streams (the board's, a log's follow, the API's), whose every
message must leave at once, and what is compressed already."""

_HINTS = {
    400: "correct the form and send it again",
    404: "check the id; the board, cron and sessions pages list what exists",
    409: "reload the page to see the current state",
    503: "see 'dispatch state check'; the page keeps working once the database is back",
}
_REGIONS: dict[str, tuple[str, streams.Builder, streams.Fingerprint, float]] = {
    "sessions": ("sessions.html", pages.sessions_context, pages.sessions_fingerprint, 1.0),
    "status": ("status.html", pages.status_context, lambda site: pages.clock_fingerprint(5), 1.0),
    "hosts": ("hosts.html", pages.hosts_context, lambda site: pages.clock_fingerprint(5), 1.0),
}


def _region_route(name: str) -> Route:
    template, build, fingerprint, interval = _REGIONS[name]

    async def endpoint(request: Request) -> Response:
        key = name + ("?all" if request.query_params.get("all") == "1" else "")
        return await streams.region(request, key, template, build, fingerprint, interval)

    return Route(f"/live/{name}", endpoint)


async def _cron_stream(request: Request) -> Response:
    job_id = request.path_params.get("job_id")

    def build(site: Site, req: Request) -> dict[str, Any]:
        return pages.cron_context(site, req, job_id)

    def known(site: Site) -> None:
        if job_id is not None:
            site.source.cron().check_known(job_id)

    return await streams.region(
        request, f"cron/{job_id}", "cron.html", build, pages.cron_fingerprint, 1.0, known
    )


def routes(site: Site) -> list[BaseRoute]:
    """Every route of the dashboard."""
    registry = metrics_registry(site.source)

    async def metrics(request: Request) -> Response:
        body = await site.run(lambda: generate_latest(registry))
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    post = ["POST"]
    return [
        Route("/", pages.board),
        Route("/cards", actions.add_card, methods=post),
        Route("/cards/{card_id}", pages.card),
        Route("/cards/{card_id}/edit", actions.edit_card, methods=post),
        Route("/cards/{card_id}/unblock", actions.unblock_card, methods=post),
        Route("/cards/{card_id}/retry", actions.retry_card, methods=post),
        Route("/cards/{card_id}/move", actions.move_card, methods=post),
        Route("/cards/{card_id}/archive", actions.archive_card, methods=post),
        Route("/runs/{run_id}", pages.run_page),
        Route("/runs/{run_id}/kill", actions.kill_run, methods=post),
        Route("/board/pause", actions.pause_board, methods=post),
        Route("/board/resume", actions.resume_board, methods=post),
        Route("/cron", pages.cron),
        Route("/cron/{job_id}", pages.cron_job),
        Route("/cron/{job_id}/pause", actions.cron_pause, methods=post),
        Route("/cron/{job_id}/resume", actions.cron_resume, methods=post),
        Route("/cron/{job_id}/run", actions.cron_run, methods=post),
        Route("/sessions", pages.sessions),
        Route("/sessions/{session_id}", pages.session),
        Route("/sessions/{session_id}/kill", actions.kill_session, methods=post),
        Route("/status", pages.status),
        Route("/hosts", pages.hosts),
        Route("/metrics", metrics),
        Route("/live/board", streams.board),
        Route("/live/cards/{card_id}", streams.card),
        Route("/live/sessions/{session_id}", streams.session),
        Route("/live/cron", _cron_stream),
        Route("/live/cron/{job_id}", _cron_stream),
        *(_region_route(name) for name in _REGIONS),
        *cockpit.routes(),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]


def create_site(source: Source, access: Access, *, hub: Hub | None = None) -> Site:
    """The parts of a dashboard on ``source`` under ``access``'s rules."""
    keys: Keys = access.keys
    return Site(
        source=source,
        hub=hub or Hub(source),
        renderer=Renderer(source.environ),
        keys=keys,
        access=access,
    )


def create_app(site: Site, *, api_only: bool = False) -> Guard:
    """The ASGI application: the guard around Starlette (see the module docstring);
    ``api_only``: the HTTP API and nothing else (``dispatch web --api-only``)."""
    access = site.access

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        return site.error(request, exc.status, exc.message, exc.hint, headers=exc.headers)

    async def dispatch_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, DispatchError)
        status = http_status(exc)
        if status >= 500:
            _log.error("dispatch web: %s %s: %s", request.method, request.url.path, exc.message)
        return site.error(request, status, exc.message, _HINTS.get(status, ""))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if request.url.path.startswith(API_PREFIX) or api_only:
            if exc.status_code == 405:
                allowed = (exc.headers or {}).get("Allow", "")
                return api.not_allowed(request, [m.strip() for m in allowed.split(",") if m])
            return api.not_found(request)
        if exc.status_code == 404:
            return site.error(request, 404, f"no page {request.url.path}", _HINTS[404])
        return site.error(request, exc.status_code, str(exc.detail))

    async def database_error(request: Request, exc: Exception) -> Response:
        _log.error("dispatch web: state database: %s", exc)
        return site.error(request, 503, f"state database: {exc}", _HINTS[503])

    async def bug(request: Request, exc: Exception) -> Response:
        _log.exception("dispatch web: %s %s failed", request.method, request.url.path)
        return site.error(request, 500, "internal error", "see the log of dispatch web")

    roller = None if api_only else Roller(site.source)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if roller is not None:
            roller.start()
        yield
        if roller is not None:
            await anyio.to_thread.run_sync(roller.stop)
        await site.hub.close()

    app = Starlette(
        routes=api.routes(site) if api_only else [*api.routes(site), *routes(site)],
        exception_handlers={
            Refused: refused,
            DispatchError: dispatch_error,
            HTTPException: http_error,
            sqlite3.DatabaseError: database_error,
            Exception: bug,
        },
        lifespan=lifespan,
        # A busy day's charts page is a few hundred kilobytes of markup and a tenth of that
        # compressed; level 6 costs a few milliseconds for it (level 9, the default, several
        # times that for a few per cent less).
        middleware=[
            Middleware(
                GZipMiddleware,
                minimum_size=COMPRESSED_FROM,
                compresslevel=6,
                exclude_content_types=UNCOMPRESSED,
            )
        ],
    )
    app.state.site = site

    async def deny(scope: Scope, refusal: Refused) -> Response:
        if scope.get("path", "").startswith(API_PREFIX):
            return problem(
                refusal.status, refusal.message, remedy=refusal.hint, headers=refusal.headers
            )
        return site.error(
            Request(scope), refusal.status, refusal.message, refusal.hint, headers=refusal.headers
        )

    return Guard(app, access, deny)
