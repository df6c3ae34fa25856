"""The ``dispatch web`` process: where it listens, who may reach it, and uvicorn serving it.

``--listen HOST:PORT`` (default ``127.0.0.1:8470``; port 0 picks a free one) must be a loopback
address unless ``--allow-remote`` is given; then every page needs the secret too. The socket
is bound here, before uvicorn starts, so a port in use is one line and exit 1, not a log
traceback. uvicorn runs without its access log (a URL may carry the sign-in token, and the
secret never goes to a log) and trusts no proxy headers.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dispatcher.web.errors import ListenRefused, PortInUse
from scope.foundation.text import is_digits

DEFAULT_LISTEN = "127.0.0.1:8470"
GRACE = 1
"""Seconds open live streams get to end when the server stops."""


@dataclass(frozen=True, kw_only=True)
class Listen:
    """A parsed ``--listen``."""

    text: str
    host: str
    """The address to bind (an IP literal)."""
    port: int
    family: int
    loopback: bool
    wildcard: bool

    def origin(self, port: int | None = None) -> str:
        """``http://host:port`` (IPv6 in brackets; ``port`` once the real one is known)."""
        host = f"[{self.host}]" if self.family == socket.AF_INET6 else self.host
        if self.wildcard:
            host = "127.0.0.1" if self.family == socket.AF_INET else "[::1]"
        return f"http://{host}:{self.port if port is None else port}"


def parse_listen(text: str) -> Listen:
    """``HOST:PORT``, ``[IPV6]:PORT`` or ``NAME:PORT`` (a name must resolve here)."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not is_digits(port_text, 12):
        raise ListenRefused(text, "write it as HOST:PORT, e.g. 127.0.0.1:8470 or [::1]:8470")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ListenRefused(
            text, f"port {port} is out of range 0-65535", remedy="pick a free port, e.g. 8470"
        )
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as err:
            raise ListenRefused(text, f"cannot resolve {host!r} ({err})") from None
        addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
    first = addresses[0]
    return Listen(
        text=text,
        host=str(first),
        port=port,
        family=socket.AF_INET6 if first.version == 6 else socket.AF_INET,
        loopback=all(a.is_loopback for a in addresses),
        wildcard=first.is_unspecified,
    )


def check_remote(listen: Listen, allow_remote: bool) -> None:
    """Refuse a non-loopback address unless the operator asked for it."""
    if not listen.loopback and not allow_remote:
        raise ListenRefused(
            listen.text,
            "not a loopback address: other machines could reach the dashboard",
            remedy="add --allow-remote (every page then needs the secret) or listen on 127.0.0.1",
        )


def allowed_hosts(listen: Listen, port: int, extra: Iterable[str] = ()) -> frozenset[str] | None:
    """The ``Host`` headers a request may carry (None: any, for a wildcard listen without
    ``--allow-host``; the secret guards every page there)."""
    found = {
        name if _has_port(name) else f"{name}:{port}"
        for name in (given.strip().lower() for given in extra)
        if name
    }
    if listen.wildcard and not found:
        return None
    host = f"[{listen.host}]" if listen.family == socket.AF_INET6 else listen.host
    if not listen.wildcard:
        found.add(f"{host}:{port}")
    if listen.loopback or listen.wildcard:
        found |= {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
    return frozenset(found)


def _has_port(name: str) -> bool:
    if name.startswith("["):
        return "]:" in name
    return name.count(":") == 1


def bind(listen: Listen) -> socket.socket:
    """A listening socket on the address (PortInUse, ListenRefused: one line each)."""
    sock = socket.socket(listen.family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if listen.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((listen.host, listen.port))
        sock.listen(128)
    except OSError as err:
        sock.close()
        address = listen.origin().removeprefix("http://")
        if err.errno == errno.EADDRINUSE:
            raise PortInUse(address, "the address is already in use") from None
        if err.errno == errno.EADDRNOTAVAIL:
            raise ListenRefused(listen.text, "not an address of this machine") from None
        raise PortInUse(address, err.strerror or str(err)) from None
    sock.set_inheritable(False)
    return sock


def serve(
    app: Any, sock: socket.socket, *, on_stop: Callable[[], Awaitable[None]] | None = None
) -> bool:
    """Serve ``app`` on ``sock`` until SIGINT/SIGTERM; False when it could not start.

    ``on_stop`` runs first when the server stops, before it waits for open connections: the
    live streams end there, so a stop is quick and nothing has to be cancelled."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if on_stop is not None:
                await on_stop()
            await super().shutdown(sockets=sockets)

    _quiet_uvicorn()
    config = uvicorn.Config(
        app,
        http="h11",
        loop="asyncio",
        ws="none",
        lifespan="on",
        access_log=False,
        log_config=None,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=GRACE,
    )
    server = Server(config)
    # uvicorn re-raises the stop signal once it has shut down, with the handlers it found in
    # place: these make that a plain return, so a stop is exit 0 rather than death by signal.
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return bool(server.started)


def _stopped(signum: int, frame: object) -> None:
    """The stop signal, re-raised by uvicorn after its shutdown: nothing more to do."""


def _quiet_uvicorn() -> None:
    """uvicorn's own messages as the CLI's diagnostics: warnings and errors, one line each."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("dispatch web: %(levelname)s: %(message)s"))
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(logging.WARNING)
        logger.propagate = False
