"""`dispatch logs`: print a session's output log, raw bytes exactly as the worker wrote them.

The log is read only through the registry (:meth:`~registry.abc.Registry.read_log`,
``follow_log``, ``log_size``, ``output_times``): ``--since``, ``--tail`` and ``--timestamps``
are its selectors and stamp, ``--redact`` its ``hooks`` (transform, then redaction of secrets
as ``registry.redact`` and ``registry.redact_patterns`` say; the text is decoded as UTF-8,
invalid bytes become U+FFFD, and masked line by line, so ``-f`` never shows half a secret split
across two reads).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable, Mapping
from typing import BinaryIO

from dispatcher.app.documents import session_json
from dispatcher.app.runtime import Runtime, runtime_from_context
from dispatcher.cli.context import Context
from dispatcher.cli.options import since_arg
from dispatcher.cli.parser import Parser, Subparsers, add_group, int_arg
from dispatcher.cli.wait_cmd import exit_status
from dispatcher.errors import DispatcherError
from dispatcher.timefmt import viewer_zone
from registry.abc import LogFollow, Registry, Session, SessionState, Stamp
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


def stream(
    ctx: Context, follow: LogFollow, *, sink: Callable[[bytes], object] | None = None
) -> Session | None:
    """Print what ``follow`` hands out until it ends; returns the final session (None when its
    timeout elapsed first; the worker keeps running). ``sink`` receives the bytes instead of
    stdout."""
    out = _Sink(sink) if sink is not None else binary_out(ctx)
    for data in follow:
        out.write(data)
        out.flush()
    return follow.session


class _Sink:
    """A write()/flush() front for a callable (``-f --json``)."""

    def __init__(self, target: Callable[[bytes], object]) -> None:
        self.target = target

    def write(self, data: bytes) -> None:
        self.target(data)

    def flush(self) -> None:
        """Nothing is buffered."""


def session_id_for(runtime: Runtime, given: str, environ: Mapping[str, str]) -> str:
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
    """Print the log (or what the selectors keep), then follow it with -f."""
    if args.tail is not None and args.tail < 0:
        raise UsageError(f"--tail {args.tail}: give a number of lines >= 0")
    runtime = runtime_from_context(ctx)
    registry = runtime.registry
    session = registry.resolve(session_id_for(runtime, args.id, ctx.environ))
    # Everything up to this size is printed now; -f continues from exactly there.
    end = registry.log_size(session.id)
    if end is None:
        ctx.warn(
            f"error: session {session.id} ({session.state.value}): output log "
            f"{session.log_path} is missing"
            + (f" ({session.completion_reason})" if session.state is SessionState.LOST else "")
        )
        return 1
    since = _since(args, ctx, registry, session)
    stamp = _stamp(ctx) if args.timestamps else None
    if not args.follow:
        data = registry.read_log(
            session.id,
            byte_range=(0, end),
            since=since,
            tail_lines=args.tail,
            stamp=stamp,
            hooks=args.redact,
        )
        if ctx.json:
            ctx.emit_json(
                {
                    "id": session.id,
                    "log_path": session.log_path,
                    "bytes": len(data),
                    "output": data.decode("utf-8", "replace"),
                }
            )
            return 0
        out = binary_out(ctx)
        out.write(data)
        out.flush()
        return 0
    start = 0
    if since is not None or args.tail is not None:
        kept = registry.read_log(session.id, byte_range=(0, end), since=since, tail_lines=args.tail)
        start = end - len(kept)
    follow = registry.follow_log(session.id, start, stamp=stamp, hooks=args.redact)
    if ctx.json:
        return _follow_json(ctx, session, follow)
    final = stream(ctx, follow)
    # Like `run --follow` and `wait`: the worker's result is the exit status.
    return exit_status(final) if final is not None else 0


def _since(
    args: argparse.Namespace, ctx: Context, registry: Registry, session: Session
) -> float | None:
    """The wall time ``--since`` names (None without it)."""
    if not args.since:
        return None
    if not registry.output_times(session.id).known:
        raise DispatcherError(
            f"session {session.id} has no output times (its keeper predates them): "
            "--since cannot select its lines",
            remedy="use --tail N, or look at the whole log",
        )
    return since_arg(args.since, ctx.times().now)


def _stamp(ctx: Context) -> Stamp:
    """``--timestamps``: ISO-8601 with milliseconds, in the viewer's zone."""
    zone = viewer_zone(ctx.environ)
    return lambda t: dt.datetime.fromtimestamp(t, zone).isoformat(timespec="milliseconds")


def _follow_json(ctx: Context, session: Session, follow: LogFollow) -> int:
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

    final = stream(ctx, follow, sink=chunk)
    assert final is not None
    ctx.stdout.write(json.dumps(session_json(final)) + "\n")
    ctx.stdout.flush()
    return exit_status(final)
