"""A TCP proxy the test controls: 127.0.0.1:A -> 127.0.0.1:B, with a switch to cut it.

A host under test is pointed at the proxy instead of the database server. :meth:`TcpProxy.cut`
resets every connection through it and refuses new ones (each is accepted and reset at once,
so the client sees the server vanish rather than a hang); :meth:`TcpProxy.restore` lets
connections through again. Traffic stays on loopback. One selector thread forwards every
connection; :meth:`TcpProxy.close` stops it and closes everything.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

__all__ = ["TcpProxy"]

_LINGER_RESET = struct.pack("ii", 1, 0)


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): the peer learns at once that the connection is gone."""
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    sock.close()


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target`` until cut (see the module doc)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._lock = threading.Lock()
        self._open = True
        self._stopping = False
        self.connections = 0
        """Connections forwarded so far."""
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    @property
    def is_cut(self) -> bool:
        """Whether connections are being refused."""
        return not self._open

    def cut(self) -> None:
        """Reset every connection through the proxy and refuse new ones until restored."""
        with self._lock:
            self._open = False
        self._wake()

    def restore(self) -> None:
        """Let connections through again."""
        with self._lock:
            self._open = True
        self._wake()

    @contextmanager
    def partitioned(self) -> Iterator[None]:
        """Cut for the duration of the block (restored on exit, also on errors)."""
        self.cut()
        try:
            yield
        finally:
            self.restore()

    def close(self) -> None:
        """Stop forwarding and close every socket (bounded)."""
        self._stopping = True
        self._wake()
        self._thread.join(5)
        for sock in list(self._peers):
            _reset(sock)
        self._peers.clear()
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        while not self._stopping:
            for key, _ in self._selector.select(timeout=0.5):
                if key.data == "wake":
                    with suppress(OSError):
                        self._wake_r.recv(4096)
                elif key.fileobj is self._listener:
                    self._accept()
                else:
                    self._pump(key.fileobj)  # type: ignore[arg-type]
            if not self._open and self._peers:
                for sock in list(self._peers):
                    self._drop(sock)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        if not self._open:
            _reset(client)
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            _reset(client)
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._peers[client] = upstream
        self._peers[upstream] = client
        self._selector.register(client, selectors.EVENT_READ, "peer")
        self._selector.register(upstream, selectors.EVENT_READ, "peer")
        self.connections += 1

    def _pump(self, sock: socket.socket) -> None:
        other = self._peers.get(sock)
        if other is None:
            return
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        try:
            other.settimeout(5)
            other.sendall(data)
            other.setblocking(False)
        except OSError:
            self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        other = self._peers.pop(sock, None)
        for one in (sock, other):
            if one is None:
                continue
            self._peers.pop(one, None)
            with suppress(KeyError, ValueError):
                self._selector.unregister(one)
            _reset(one)
