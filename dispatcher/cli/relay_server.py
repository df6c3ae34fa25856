"""The short-write relay, the gateway's end: ``dispatch serve`` (which hands
:func:`start_relay` to its gateway, :mod:`dispatcher.gateway.relaying`) answers ``dispatch kanban
add`` and a worker's reports for commands of its own state dir (the protocol and the
command's end: :mod:`dispatcher.app.relay`).

The gateway runs the command's own handler (:mod:`dispatcher.cli.kanban_writes`) with the
command's environment, on a :class:`~dispatcher.cli.context.Context` whose stdout and stderr
are sent back, so the answer is the one the command would have printed itself. It takes only
what it can answer exactly as the command would, and declines (``D``) everything else, which
the command then runs itself:

- a command line the fast path does not parse (:func:`dispatcher.cli.fastpath.recognise`),
  ``--body-file`` (stdin is the command's), a cron worker's ``defer``;
- a path given as ``~user/...``; other paths are made absolute with the command's working
  directory and ``HOME`` first;
- another state dir, cluster mode, or a config without a current snapshot (its warnings and
  errors are the command's to print; the command then leaves a snapshot for the next one);
- a ``TZ`` other than the gateway's (the handler reads and prints local times in its
  process's zone).

One thread accepts; each request runs on a thread of its own, at most :data:`MAX_ACTIVE` at
once (beyond that the gateway declines at once: the command is never kept waiting for it).
Peers that are not our user are refused before a byte is read. On shutdown the gateway stops
accepting and waits for the commands it has started, so it answers every ``S`` it has said.
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import os
import socket
import struct
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dispatcher.app.relay import MAGIC, decode_request, expand, relay_address
from dispatcher.cli import kanban_writes
from dispatcher.cli.context import Context
from dispatcher.cli.fastpath import recognise
from dispatcher.cluster.url import ENV_URL
from dispatcher.paths import resolve_state_dir
from scope.foundation.errors import DispatchError

log = logging.getLogger("dispatch.relay")

MAX_ACTIVE = 8
MAX_REQUEST = 4 * 1024 * 1024
READ_TIMEOUT = 5.0
"""Seconds a command has to send its request (it sends it whole at once)."""
CLOSE_WAIT = 30.0
"""Seconds the gateway waits at shutdown for the commands it has started."""
PATH_ENV = ("DISPATCH_STATE_DIR", "DISPATCH_CONFIG")


class Declined(Exception):
    """The gateway does not take this command; its message is the reason (a metric label)."""


class RelayServer:
    """The gateway's relay socket and its threads; :meth:`close` ends them."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = os.path.realpath(state_dir)
        self.answered = 0
        self.declined: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._active = threading.BoundedSemaphore(MAX_ACTIVE)
        self._threads: set[threading.Thread] = set()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.bind(relay_address(self.state_dir))
            self._sock.listen(64)
        except OSError:
            self._sock.close()
            raise
        self._acceptor = threading.Thread(target=self._accept, name="dispatch-relay", daemon=True)
        self._acceptor.start()

    def stats(self) -> dict[str, Any]:
        """Commands answered and declined (by reason), as the status file keeps them."""
        with self._lock:
            return {"answered": self.answered, "declined": dict(self.declined)}

    def close(self) -> None:
        """Stop accepting, then wait (bounded) for the commands already started."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._acceptor.join(CLOSE_WAIT)
        self._sock.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(CLOSE_WAIT)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            if not self._active.acquire(blocking=False):
                self._decline(conn, "busy")
                conn.close()
                continue
            thread = threading.Thread(
                target=self._serve, args=(conn,), name="dispatch-relay-write", daemon=True
            )
            with self._lock:
                self._threads.add(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._converse(conn)
        except Exception:
            log.exception("relay: answering a short write command failed")
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
            self._active.release()

    def _converse(self, conn: socket.socket) -> None:
        if not _ours(conn):
            return  # another user: not a word, not a byte read
        try:
            args, environ = self._prepare(_read_request(conn))
        except Declined as why:
            self._decline(conn, str(why))
            return
        try:
            conn.sendall(b"S")
        except OSError:
            return  # the command gave up waiting: it runs itself, so this must not
        status, out, err = run_command(args, environ)
        with self._lock:
            self.answered += 1
        with contextlib.suppress(OSError):
            body = os.fsencode(out)
            conn.sendall(b"%d\0%d\0" % (status, len(body)) + body + os.fsencode(err))

    def _decline(self, conn: socket.socket, reason: str) -> None:
        with self._lock:
            self.declined[reason] += 1
        with contextlib.suppress(OSError):
            conn.sendall(b"D" + reason.encode())

    def _prepare(self, request: bytes) -> tuple[SimpleNamespace, dict[str, str]]:
        """The parsed command line and environment to run, or :class:`Declined`."""
        decoded = decode_request(request)
        if decoded is None:
            raise Declined("malformed")
        cwd, argv, environ = decoded
        args = recognise(argv, environ)
        if args is None:
            raise Declined("command line")
        if getattr(args, "body_file", None) is not None:
            raise Declined("body file")
        if ENV_URL in environ:
            raise Declined("cluster")
        if environ.get("TZ") != os.environ.get("TZ"):
            # Times are read (--until) and printed (--json, "deferred until") in the local
            # zone of the process that runs the handler: here, the gateway's.
            raise Declined("time zone")
        _absolute_paths(args, environ, cwd)
        if _fire_defer(args, environ):
            raise Declined("cron defer")
        try:
            chosen = resolve_state_dir(getattr(args, "state_dir", None), environ)
        except DispatchError:
            raise Declined("state dir") from None
        if os.path.realpath(chosen) != self.state_dir:
            raise Declined("state dir")
        if not _snapshot_current(args, environ):
            raise Declined("config")
        return args, environ


def run_command(args: SimpleNamespace, environ: dict[str, str]) -> tuple[int, str, str]:
    """Run a short write command's handler as the command would: its exit status, stdout
    and stderr (our errors as their one line, like :func:`dispatcher.cli.main.main`)."""
    import sqlite3

    from dispatcher.cli.main import EXIT_FAILED, error_text

    out, err = io.StringIO(), io.StringIO()
    ctx = _RelayContext(args, environ, stdout=out, stderr=err)  # type: ignore[arg-type]
    try:
        status = int(args.handler(args, ctx) or 0)
    except DispatchError as error:
        err.write(error_text(error) + "\n")
        status = error.exit_code
    except sqlite3.DatabaseError as error:
        err.write(f"dispatch: error: state database: {error}; check --state-dir\n")
        status = EXIT_FAILED
    except Exception:
        log.exception("relay: a short write command failed in the gateway")
        err.write("dispatch: error: the gateway failed on this command; see its log\n")
        status = EXIT_FAILED
    finally:
        ctx.close()
    return status, out.getvalue(), err.getvalue()


class _RelayContext(Context):
    """A command's context in the gateway: library warnings go to the gateway's log (where
    its handlers put them), never to the gateway's own stderr."""

    def show_warnings(self) -> None:
        """Nothing to add: the gateway's logging already shows them."""


def _read_request(conn: socket.socket) -> bytes:
    conn.settimeout(READ_TIMEOUT)
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_REQUEST:
                raise Declined("too large")
            chunks.append(chunk)
    except OSError:
        raise Declined("unread") from None
    data = b"".join(chunks)
    if not data.startswith(MAGIC):
        raise Declined("malformed")
    return data


def _absolute_paths(args: SimpleNamespace, environ: dict[str, str], cwd: str) -> None:
    """Make the command's paths absolute as the command would read them (its working
    directory and ``HOME``), in place; :class:`Declined` for a ``~user`` path."""
    for dest in ("state_dir", "config"):
        value = getattr(args, dest, None)
        if value:
            setattr(args, dest, _expanded(value, environ, cwd))
    for name in PATH_ENV:
        if environ.get(name):
            environ[name] = _expanded(environ[name], environ, cwd)


def _expanded(text: str, environ: dict[str, str], cwd: str) -> str:
    path = expand(text, environ, cwd)
    if path is None:
        raise Declined("path")
    return path


def _fire_defer(args: SimpleNamespace, environ: dict[str, str]) -> bool:
    """A cron worker's ``defer`` (no card, a fire key): it reads the config afresh."""
    if args.kanban_command != "defer" or args.id or args.run:
        return False
    return bool(environ.get("DISPATCH_FIRE_KEY")) and not environ.get("DISPATCH_CARD_ID")


def _snapshot_current(args: SimpleNamespace, environ: dict[str, str]) -> bool:
    """Whether the command would read a current config snapshot of a single host (then it
    prints no warning and no config error, and neither does the gateway)."""
    ctx = Context(args, environ)  # type: ignore[arg-type]
    try:
        facts = kanban_writes.current_snapshot(ctx)
    except DispatchError:
        return False
    return facts is not None and not facts.clustered


def _ours(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    _pid, uid, _gid = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


def start_relay(state_dir: Path) -> RelayServer | None:
    """The gateway's relay, or None (with a warning) when its socket cannot be bound: the
    commands then run themselves, as without a gateway."""
    try:
        return RelayServer(state_dir)
    except OSError as err:
        log.warning("no relay socket (%s); short write commands run on their own", err)
        return None
