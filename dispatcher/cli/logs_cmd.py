"""`dispatch logs`: print a session's output log, raw bytes exactly as the worker wrote them.

``--redact`` applies the registry's output hooks (transform, then redaction of secrets as
``registry.redact`` and ``registry.redact_patterns`` say) to what is shown; the text is decoded
as UTF-8 (invalid bytes become U+FFFD) and masked line by line, so ``-f`` never shows half a
secret split across two reads.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import BinaryIO

from dispatcher.app.runtime import Runtime, runtime_from_context
from dispatcher.cli.context import Context
from dispatcher.cli.options import since_arg
from dispatcher.cli.parser import Parser, Subparsers, add_group, int_arg
from dispatcher.cli.ps_cmd import session_json
from dispatcher.cli.wait_cmd import exit_status
from dispatcher.errors import DispatcherError
from dispatcher.timefmt import viewer_zone
from registry.abc import Registry, Session, SessionState
from registry.keeper.times import LogTimes, Stamper
from registry.output.hooks import OutputHooks
from registry.output.tail import LogReader
from scope.foundation.errors import UsageError

DESCRIPTION = (
    "Print a session's output log: the raw bytes exactly as the worker wrote them. -f keeps "
    "printing until the session ends. --redact applies the output hooks: secrets (API keys, "
    "bearer tokens, password=/token= values, passwords in URLs, registry.redact_patterns) are "
    "masked."
)


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `logs` command."""
    parser = add_group(subparsers, "logs", common, description=DESCRIPTION)
    parser.add_argument(
        "id",
        help="session id or a unique prefix (at least 4 characters), or a kanban card id "
        "(its latest run) or run id",
    )
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing until the session ends, then exit with its result (its exit code, "
        "128+N for signal N); with --json one JSON object per line",
    )
    parser.add_argument("--tail", metavar="N", type=int_arg(0, 10**9), help="only the last N lines")
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only lines whose output arrived since WHEN: a duration back from now (30m, 2h, "
        "1d) or an ISO-8601 time (2026-11-30T09:00, local when it has no offset)",
    )
    parser.add_argument(
        "--timestamps",
        action="store_true",
        help="start every line with the time its first byte arrived (ISO-8601, milliseconds, "
        "the viewer's zone; the keeper notes times every 50 ms)",
    )
    parser.add_argument(
        "--redact", action="store_true", help="apply the output hooks (mask secrets)"
    )
    parser.set_defaults(handler=handle)


def binary_out(ctx: Context) -> BinaryIO:
    """The byte stream behind ctx.stdout (flushed text first)."""
    ctx.stdout.flush()
    buffer = getattr(ctx.stdout, "buffer", None)
    return buffer if buffer is not None else sys.stdout.buffer


class LineRedactor:
    """Applies the output hooks to whole lines of a byte stream (a secret split across two
    reads is masked whole); :meth:`finish` handles the last line without a newline."""

    def __init__(self, hooks: OutputHooks, session: Session) -> None:
        self.hooks = hooks
        self.session = session
        self._partial = b""

    def _apply(self, data: bytes) -> bytes:
        text = data.decode("utf-8", "replace")
        return self.hooks.apply(
            text,
            session_id=self.session.id,
            owner=self.session.owner,
            exit_code=self.session.exit_code,
            purpose="logs",
        ).encode("utf-8")

    def __call__(self, data: bytes) -> bytes:
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        return self._apply(data[:cut]) if cut else b""

    def finish(self) -> bytes:
        """The rest (a last line without newline)."""
        rest, self._partial = self._partial, b""
        return self._apply(rest) if rest else b""


def redact(data: bytes, hooks: OutputHooks, session: Session) -> bytes:
    """``data`` with the output hooks applied (``--redact``)."""
    redactor = LineRedactor(hooks, session)
    return redactor(data) + redactor.finish()


def stream(
    ctx: Context,
    registry: Registry,
    session: Session,
    offset: int,
    *,
    hooks: LineRedactor | None = None,
    timeout: float | None = None,
    sink: Callable[[bytes], object] | None = None,
    stamp: Stamper | None = None,
) -> Session | None:
    """Print what the log gains from ``offset`` on until the session is final; returns it
    (None when ``timeout`` elapsed first; the worker keeps running). ``stamp`` prefixes lines
    with their times; with ``hooks`` the output is redacted line by line; ``sink`` receives
    the bytes instead of stdout."""
    out = _Sink(sink) if sink is not None else binary_out(ctx)
    reader = LogReader(session.log_path, offset)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        data = reader.read_new(4 * 1024 * 1024)
        if data:
            data = stamp(data) if stamp else data
            out.write(hooks(data) if hooks else data)
            out.flush()
            continue
        current = registry.get(session.id)
        if current.finished:
            rest = reader.read_new()
            rest = stamp(rest) if stamp else rest
            if hooks is not None:
                rest = hooks(rest) + hooks.finish()
            if rest:
                out.write(rest)
                out.flush()
            return current
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return None
        # Sleeps in the registry's bounded wait (woken early when this process follows it).
        registry.wait(session.id, timeout=0.1 if remaining is None else min(0.1, remaining))


class _Sink:
    """A write()/flush() front for a callable (``-f --json``)."""

    def __init__(self, target: Callable[[bytes], object]) -> None:
        self.target = target

    def write(self, data: bytes) -> None:
        self.target(data)

    def flush(self) -> None:
        """Nothing is buffered."""


def tail_lines(registry: Registry, session_id: str, count: int, end: int) -> bytes:
    """The last ``count`` lines of the log's first ``end`` bytes."""
    if count == 0:
        return b""
    block = 64 * 1024
    start = end
    data = b""
    while start > 0:
        start = max(0, start - block)
        data = registry.read_log(session_id, byte_range=(start, end))
        body = data[:-1] if data.endswith(b"\n") else data
        if body.count(b"\n") >= count:
            break
        block *= 2
    return b"".join(data.splitlines(keepends=True)[-count:])


def _session_id(runtime: Runtime, given: str, environ: Mapping[str, str]) -> str:
    """A kanban card id (its latest run's session) or run id also names a session."""
    from dispatcher.app.clusterstate import open_cluster_state
    from dispatcher.kanban.lookup import resolve_session_id
    from dispatcher.kanban.rows import CARD_PREFIX, RUN_PREFIX

    if not given.strip().startswith((CARD_PREFIX, RUN_PREFIX)):
        return given  # a session id: the board is not asked
    with open_cluster_state(
        runtime.settings, runtime.state_dir, environ, local=runtime.db
    ) as state:
        return resolve_session_id(state.board, given) or given


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Print the log (or its tail), then follow it with -f."""
    if args.tail is not None and args.tail < 0:
        raise UsageError(f"--tail {args.tail}: give a number of lines >= 0")
    runtime = runtime_from_context(ctx)
    registry = runtime.registry
    session = registry.resolve(_session_id(runtime, args.id, ctx.environ))
    if not os.path.exists(session.log_path):
        ctx.warn(
            f"error: session {session.id} ({session.state.value}): output log "
            f"{session.log_path} is missing"
            + (f" ({session.completion_reason})" if session.state is SessionState.LOST else "")
        )
        return 1
    # Everything up to this size is printed now; -f continues from exactly there.
    offset = LogReader(session.log_path).size()
    times = LogTimes(session.log_path) if args.since or args.timestamps else None
    data = _selected(args, ctx, registry, session, offset, times)
    stamp = None
    if args.timestamps and times is not None:
        zone = viewer_zone(ctx.environ)
        stamp = Stamper(
            times,
            offset - len(data),
            fmt=lambda t: dt.datetime.fromtimestamp(t, zone).isoformat(timespec="milliseconds"),
        )
        data = stamp(data)
    redactor = None
    if args.redact:
        redactor = LineRedactor(runtime.registry.hooks, session)
        data = redactor(data)
        if not args.follow:
            data += redactor.finish()
    if ctx.json and not args.follow:
        ctx.emit_json(
            {
                "id": session.id,
                "log_path": session.log_path,
                "bytes": len(data),
                "output": data.decode("utf-8", "replace"),
            }
        )
        return 0
    if ctx.json:
        return _follow_json(ctx, registry, session, data, offset, redactor, stamp)
    out = binary_out(ctx)
    out.write(data)
    out.flush()
    if not args.follow:
        return 0
    final = stream(ctx, registry, session, offset, hooks=redactor, stamp=stamp)
    # Like `run --follow` and `wait`: the worker's result is the exit status.
    return exit_status(final) if final is not None else 0


def _selected(
    args: argparse.Namespace,
    ctx: Context,
    registry: Registry,
    session: Session,
    end: int,
    times: LogTimes | None,
) -> bytes:
    """The log's first ``end`` bytes as ``--since`` and ``--tail`` select them."""
    if not args.since:
        if args.tail is not None:
            return tail_lines(registry, session.id, args.tail, end)
        return registry.read_log(session.id, byte_range=(0, end))
    assert times is not None
    if not times.known:
        raise DispatcherError(
            f"session {session.id} has no output times (its keeper predates them): "
            "--since cannot select its lines",
            remedy="use --tail N, or look at the whole log",
        )
    start = times.offset_since(since_arg(args.since, ctx.times().now))
    start = end if start is None else min(start, end)
    data = registry.read_log(session.id, byte_range=(max(start - 1, 0), end))
    if start > 0:
        # Begin with the first line that starts at or after that offset.
        newline = data.find(b"\n")
        data = data[newline + 1 :] if newline >= 0 else b""
    if args.tail is not None:
        data = b"".join(data.splitlines(keepends=True)[-args.tail :]) if args.tail else b""
    return data


def _follow_json(
    ctx: Context,
    registry: Registry,
    session: Session,
    data: bytes,
    offset: int,
    redactor: LineRedactor | None,
    stamp: Stamper | None,
) -> int:
    """``-f --json``: JSON Lines, one ``{"id", "offset", "output"}`` object per chunk as it
    arrives, then the finished session (its ``ps --json`` shape) as the last line."""
    position = 0

    def chunk(raw: bytes) -> None:
        nonlocal position
        if raw:
            line = {"id": session.id, "offset": position, "output": raw.decode("utf-8", "replace")}
            ctx.stdout.write(json.dumps(line) + "\n")
            ctx.stdout.flush()
            position += len(raw)

    chunk(data)
    final = stream(ctx, registry, session, offset, hooks=redactor, sink=chunk, stamp=stamp)
    assert final is not None
    ctx.stdout.write(json.dumps(session_json(final)) + "\n")
    ctx.stdout.flush()
    return exit_status(final)
