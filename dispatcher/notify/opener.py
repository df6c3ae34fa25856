"""The HTTP opener webhooks are posted with: no redirects, and a deadline on the whole exchange.

urllib's ``timeout`` bounds each socket operation on its own, so a receiver that answers a
byte every few seconds would hold the sender thread (and every message behind it) for as long
as it likes. :func:`open_within` bounds connecting, sending and reading the answer together:
a timer armed as the connection is made shuts its socket down at the deadline, which ends
whatever read or write is blocked on it. A 3xx is an answer, not an instruction: it is
returned as an error, never followed.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

__all__ = ["open_within"]

_armed = threading.local()
"""The running exchange's deadline (monotonic) and its timers, per sending thread."""


def _cut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed: the exchange ended in time
        sock.shutdown(socket.SHUT_RDWR)


class _Deadlined:
    """Arms the deadline timer on the socket as soon as it is connected."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        create = self._create_connection  # type: ignore[has-type]

        def connected(*args: Any, **kwargs: Any) -> socket.socket:
            sock: socket.socket = create(*args, **kwargs)
            deadline = getattr(_armed, "deadline", None)
            if deadline is not None:
                timer = threading.Timer(max(0.0, deadline - time.monotonic()), _cut, (sock,))
                timer.daemon = True
                timer.start()
                _armed.timers.append(timer)
            return sock

        self._create_connection = connected


class _HTTPConnection(_Deadlined, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Deadlined, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is an answer, not an instruction: it counts as a failure


_OPENER = urllib.request.build_opener(_NoRedirect, _HTTPHandler, _HTTPSHandler)


@contextlib.contextmanager
def open_within(request: urllib.request.Request, timeout: float) -> Iterator[Any]:
    """The answer to ``request``; connecting, sending and everything read from the answer
    inside the block end within ``timeout`` seconds (a read past it fails: an ``OSError`` or
    an ``http.client.HTTPException``). Raises what ``urllib``'s ``open`` raises."""
    _armed.deadline, _armed.timers = time.monotonic() + timeout, []
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            yield response
    finally:
        for timer in _armed.timers:
            timer.cancel()
        _armed.deadline, _armed.timers = None, []
