"""A client for the HTTP API of a real ``dispatch web`` process (tests and the benchmark).

:class:`Api` keeps one HTTP/1.1 connection alive (as a program talking to the API would),
sends JSON, and returns :class:`Answer` with the status, the headers (lower case) and the
parsed JSON. ``source`` binds the client's end to another loopback address (127.0.0.2 ...), so
a test of the failed-authentication limit does not lock out the other tests' address.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

from dispatcher.app.clusterstate import open_cluster_state
from dispatcher.config import load_config
from tests.support.browser import WebHome


@dataclass(frozen=True)
class Answer:
    """One response."""

    status: int
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        """The body, parsed."""
        return json.loads(self.raw)

    @property
    def media(self) -> str:
        """The content type without parameters."""
        return self.headers.get("content-type", "").split(";")[0]


class Api:
    """Requests to ``url`` with a bearer token (or none)."""

    def __init__(self, url: str, token: str | None = None, *, source: str | None = None):
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.token = token
        self.source = source
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            address = (self.source, 0) if self.source else None
            self._conn = http.client.HTTPConnection(
                self.host, self.port, timeout=60, source_address=address
            )
        return self._conn

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
    ) -> Answer:
        """Send one request (``body`` as JSON, or ``raw`` bytes) and read the answer."""
        sent = dict(headers or {})
        bearer = token if token is not None else self.token
        if bearer and "Authorization" not in sent:
            sent["Authorization"] = f"Bearer {bearer}"
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, "/api/v1" + path, body=data, headers=sent)
                response = conn.getresponse()
                payload = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # The server closed a kept-alive connection (after an error answer): once more.
                self.close()
                if attempt == 2:
                    raise
        found = {name.lower(): value for name, value in response.getheaders()}
        if found.get("connection", "").lower() == "close":
            self.close()
        return Answer(status=response.status, headers=found, raw=payload)

    def get(self, path: str, **kwargs: Any) -> Answer:
        """GET."""
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Answer:
        """POST."""
        return self.request("POST", path, body, **kwargs)

    def close(self) -> None:
        """Drop the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def make_token(home: WebHome, name: str, scope: str, *, expires_at: float | None = None) -> str:
    """A token made in the home's state (as ``dispatch web token create`` does), its text."""
    import time

    settings = load_config(home.config).settings
    with open_cluster_state(settings, home.state, home.env) as state:
        _token, text = state.token_store().create(
            name, scope, now=time.time(), expires_at=expires_at
        )
    return text
