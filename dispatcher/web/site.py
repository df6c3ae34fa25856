"""What every handler works with: the state source, the hub, the templates, the keys.

:meth:`Site.context` is the part of every page's template context that the layout needs (who
is signed in, the CSRF helper, navigation); :meth:`Site.error` renders an error page with a
status, the one-line message and a hint, the same for every kind of failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from dispatcher.web.guard import Access, Auth
from dispatcher.web.history import HistoryCache
from dispatcher.web.keys import Keys
from dispatcher.web.live import Hub
from dispatcher.web.render import Html, Renderer
from dispatcher.web.source import Source

T = TypeVar("T")

NAV = (
    ("board", "/", "Board"),
    ("charts", "/charts", "Charts"),
    ("timeline", "/timeline", "Timeline"),
    ("search", "/search", "Search"),
    ("cron", "/cron", "Cron"),
    ("sessions", "/sessions", "Sessions"),
    ("status", "/status", "Status"),
    ("hosts", "/hosts", "Hosts"),
)


@dataclass(kw_only=True)
class Site:
    """The parts of one ``dispatch web`` (built by :func:`dispatcher.web.app.create_app`)."""

    source: Source
    hub: Hub
    renderer: Renderer
    keys: Keys
    access: Access
    history: HistoryCache = field(default_factory=HistoryCache)
    """The history pages' per-bucket answers, shared by every open dashboard."""

    @property
    def state_dir(self) -> Path:
        """The state dir shown in the footer."""
        return self.source.state_dir

    @staticmethod
    def auth(request: Request) -> Auth:
        """Who the request comes from (set by the guard)."""
        return getattr(request.state, "auth", None) or Auth()

    def csrf(self, request: Request) -> Callable[[str], str]:
        """``csrf(action)`` for the templates: the token a form of this session carries."""
        nonce = self.auth(request).nonce

        def token(action: str) -> str:
            return self.keys.csrf_token(nonce, action) if nonce else ""

        return token

    def context(
        self, request: Request, *, title: str, nav: str, stream: str | None = None
    ) -> dict[str, Any]:
        """The layout's part of a page's context."""
        auth = self.auth(request)
        return {
            "title": title,
            "nav": nav,
            "nav_items": NAV,
            "stream": stream,
            "signed_in": auth.signed_in,
            "csrf": self.csrf(request),
            "path": request.url.path,
            "now": time.time(),
            # Where the state lives is nobody's business before they sign in to a remote one.
            "state_dir": str(self.state_dir)
            if auth.signed_in or not self.access.pages_need_secret
            else "",
            "cluster": self.source.cluster_configured,
            "problem": self.hub.problem,
        }

    def page(
        self, request: Request, template: str, context: Mapping[str, Any], *, status: int = 200
    ) -> Response:
        """A page response."""
        return self.renderer.page(template, context, status=status)

    def error(
        self,
        request: Request,
        status: int,
        message: str,
        hint: str = "",
        *,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """An error page: the status, one line saying what went wrong, a hint for the fix."""
        context = self.context(request, title=f"{status}", nav="")
        context.update(status=status, message=message, hint=hint)
        return self.renderer.page("error.html", context, status=status, headers=headers)

    async def render(self, template: str, build: Callable[[], Mapping[str, Any]]) -> Response:
        """A page whose context ``build`` reads, built and rendered in a worker thread (a big
        board must not hold up the live streams on the event loop)."""
        renderer = self.renderer
        html = await self.run(lambda: renderer.text(template, build()))
        return Html(html)

    @staticmethod
    async def run(func: Callable[[], T]) -> T:
        """Run a blocking read or action in a worker thread."""
        return await anyio.to_thread.run_sync(func)
