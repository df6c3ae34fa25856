"""The security rules every request passes, as one ASGI middleware, plus the POST check.

In order, for every request:

1. **Host** must be one of this dashboard's addresses (:attr:`Access.hosts`): a page another
   site reaches through DNS rebinding carries that site's name and is refused.
2. **Who is asking**: a genuine session cookie (see :mod:`~dispatcher.web.keys`), or the
   secret as ``Authorization: Bearer`` (scripts, a Prometheus scrape). ``?token=SECRET`` on
   any page signs in: the answer sets the session cookie and redirects to the same page
   without the token, so the secret leaves the address bar and the history at once.
3. With ``pages_need_secret`` (a non-loopback listen) nothing but ``/static/`` answers
   without one of the two. ``/api/`` is left to the API, which asks for a bearer token of
   its own (:mod:`dispatcher.web.api.auth`) and never signs a browser in.
4. Every answer carries a strict Content-Security-Policy (no inline script or style, nothing
   from elsewhere, no framing), ``nosniff``, ``Referrer-Policy: no-referrer``,
   ``Cache-Control: no-store`` (pages hold worker output) and ``Server-Timing`` (how long the
   answer took here).

Actions additionally pass :func:`check_sender` (same-origin, signed in; before the body is
read) and :func:`check_csrf` (the session's token for that form; a bearer request needs none:
no browser attaches that header on its own).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatcher.web.keys import Keys

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=()",
}
PUBLIC_PREFIX = "/static/"
API_PREFIX = "/api/"
"""The HTTP API decides who may ask itself (bearer tokens, :mod:`dispatcher.web.api.auth`)."""


@dataclass(frozen=True, kw_only=True)
class Auth:
    """Who a request comes from: a signed-in session (its nonce), a bearer of the secret, or
    nobody in particular."""

    nonce: str | None = None
    bearer: bool = False

    @property
    def signed_in(self) -> bool:
        """Whether the request proved it knows the secret."""
        return self.nonce is not None or self.bearer


@dataclass(frozen=True, kw_only=True)
class Access:
    """The rules of one ``dispatch web`` (see the module docstring)."""

    keys: Keys
    hosts: frozenset[str] | None
    """Allowed ``Host`` values (lower case, ``host:port``); None: any (a wildcard listen)."""
    pages_need_secret: bool
    cookie: str
    """The session cookie's name (it carries the port: cookies do not tell ports apart)."""
    origin: str
    """``http://host:port`` of the listen address, for messages."""

    def host_allowed(self, host: str) -> bool:
        """Whether a request's ``Host`` header names this dashboard."""
        if self.hosts is None:
            return True
        host = host.strip().lower()
        return host in self.hosts or (host + ":80") in self.hosts


class Refused(Exception):
    """A request the rules refuse: answered with ``status`` and a page naming the fix."""

    def __init__(self, status: int, message: str, hint: str, **headers: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.hint = hint
        self.headers = headers


Deny = Callable[[Scope, Refused], Awaitable[Response]]
"""Builds the error page for a refusal."""


class Guard:
    """The middleware (see the module docstring)."""

    def __init__(self, app: ASGIApp, access: Access, deny: Deny) -> None:
        self.app = app
        self.access = access
        self.deny = deny

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        send = _with_headers(send, scope.get("path", ""))
        try:
            response = self._check(scope)
        except Refused as refusal:
            response = await self.deny(scope, refusal)
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> Response | None:
        """None to go on; a response (sign-in redirect) to answer instead; raises Refused."""
        access = self.access
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not access.host_allowed(host):
            raise Refused(
                403,
                f"the Host header {host!r} does not name this dashboard",
                f"open {access.origin}/ instead, or start dispatch web with --allow-host NAME",
            )
        auth = self._auth(headers, Request(scope).cookies)
        scope.setdefault("state", {})["auth"] = auth
        query = urllib.parse.parse_qsl(scope.get("query_string", b"").decode("latin-1"))
        tokens = [value for key, value in query if key == "token"]
        path = scope.get("path", "/")
        if path.startswith(API_PREFIX):
            return None  # never a sign-in link; the API checks its own credentials
        if tokens:
            return self._sign_in(scope, tokens[-1], [(k, v) for k, v in query if k != "token"])
        if access.pages_need_secret and not auth.signed_in and not path.startswith(PUBLIC_PREFIX):
            raise Refused(
                401,
                "this dashboard needs its secret",
                "open the sign-in link 'dispatch web --url' prints, or send "
                "'Authorization: Bearer SECRET'",
                **{"www-authenticate": 'Bearer realm="dispatch"'},
            )
        return None

    def _auth(self, headers: Headers, cookies: Mapping[str, str]) -> Auth:
        keys = self.access.keys
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        bearer = scheme.lower() == "bearer" and keys.is_secret(credentials.strip())
        return Auth(nonce=keys.session_nonce(cookies.get(self.access.cookie)), bearer=bearer)

    def _sign_in(self, scope: Scope, token: str, rest: list[tuple[str, str]]) -> Response:
        if not self.access.keys.is_secret(token):
            raise Refused(
                403,
                "that sign-in link does not carry this dashboard's secret",
                "get the current link with 'dispatch web --url'",
            )
        target = scope.get("path", "/") or "/"
        if rest:
            target += "?" + urllib.parse.urlencode(rest)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            self.access.cookie,
            self.access.keys.new_session(),
            httponly=True,
            samesite="strict",
            secure=scope.get("scheme") == "https",
            path="/",
        )
        return response


def _with_headers(send: Send, path: str) -> Send:
    started = time.perf_counter()
    # Our own script and styles may be kept, but checked again (their ETag) on every page.
    caching = "no-cache" if path.startswith(PUBLIC_PREFIX) else "no-store"

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            for name, value in HEADERS.items():
                headers[name] = value
            if "cache-control" not in headers:
                headers["cache-control"] = caching
            # The time this request took here until its answer began (benchmarks read it).
            elapsed = (time.perf_counter() - started) * 1000
            headers["server-timing"] = f"app;dur={elapsed:.1f}"
        await send(message)

    return sending


def check_sender(request: Request) -> None:
    """Refuse an action another site sent, or one without the secret (before its body is
    even read)."""
    site = request.headers.get("sec-fetch-site")
    if site not in (None, "same-origin", "none"):
        raise Refused(403, f"a {site} request may not act on this dashboard", "use its own pages")
    origin = request.headers.get("origin")
    # Under Referrer-Policy: no-referrer browsers send "Origin: null" even for our own forms;
    # then Sec-Fetch-Site, the CSRF token and the SameSite cookie decide.
    if origin not in (None, "null"):
        parsed = urllib.parse.urlsplit(origin)
        if parsed.netloc.lower() != request.headers.get("host", "").lower():
            raise Refused(403, f"a request from {origin!r} may not act here", "use its own pages")
    auth: Auth = request.state.auth
    if not auth.signed_in:
        raise Refused(
            403,
            "this action needs the dashboard's secret",
            "sign in with the link 'dispatch web' printed (or 'dispatch web --url' prints)",
        )


def check_csrf(request: Request, keys: Keys, action: str, form: Mapping[str, Any]) -> None:
    """Refuse a form without this session's CSRF token for ``action`` (a bearer of the secret
    needs none: no browser attaches that header on its own)."""
    auth: Auth = request.state.auth
    if auth.bearer or auth.nonce is None:
        return
    problem = keys.csrf_problem(auth.nonce, action, form.get("csrf"))
    if problem is not None:
        raise Refused(403, problem, "reload the page and try again")


def cookie_name(port: int) -> str:
    """The session cookie's name for a dashboard on ``port``."""
    return f"dispatch_session_{port}"
