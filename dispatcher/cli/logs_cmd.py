"""`dispatch logs`: print a session's output log, raw bytes exactly as the worker wrote them.

``--redact`` applies the registry's output hooks (transform, then redaction) to what is shown.
No hooks exist in this build, so it prints the same bytes; the flag is the stable place where
they will apply.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import BinaryIO

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from dispatcher.runtime import runtime_from_context
from registry.abc import Registry, Session
from registry.output import LogReader
from scope.errors import UsageError

DESCRIPTION = (
    "Print a session's output log: the raw bytes exactly as the worker wrote them. -f keeps "
    "printing until the session ends. --redact applies the output hooks (none exist in this "
    "build, so the bytes are unchanged)."
)
HELP = "Print a session's output log (raw bytes)."


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `logs` command."""
    parser = add_group(subparsers, "logs", common, help=HELP, description=DESCRIPTION)
    parser.add_argument("id", help="session id or a unique prefix (at least 4 characters)")
    parser.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until the session ends"
    )
    parser.add_argument("--tail", metavar="N", type=int, help="only the last N lines")
    parser.add_argument(
        "--redact", action="store_true", help="apply the output hooks (none in this build)"
    )
    parser.set_defaults(handler=handle)


def binary_out(ctx: Context) -> BinaryIO:
    """The byte stream behind ctx.stdout (flushed text first)."""
    ctx.stdout.flush()
    buffer = getattr(ctx.stdout, "buffer", None)
    return buffer if buffer is not None else sys.stdout.buffer


def redact(data: bytes) -> bytes:
    """The hook point for ``--redact`` (no hooks in this build: unchanged)."""
    return data


def stream(
    ctx: Context,
    registry: Registry,
    session: Session,
    offset: int,
    *,
    hooks: bool = False,
    timeout: float | None = None,
) -> Session | None:
    """Print what the log gains from ``offset`` on until the session is final; returns it
    (None when ``timeout`` elapsed first; the worker keeps running)."""
    out = binary_out(ctx)
    reader = LogReader(session.log_path, offset)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        data = reader.read_new(4 * 1024 * 1024)
        if data:
            out.write(redact(data) if hooks else data)
            out.flush()
            continue
        current = registry.get(session.id)
        if current.finished:
            rest = reader.read_new()
            if rest:
                out.write(redact(rest) if hooks else rest)
                out.flush()
            return current
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return None
        # Sleeps in the registry's bounded wait (woken early when this process follows it).
        registry.wait(session.id, timeout=0.1 if remaining is None else min(0.1, remaining))


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


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Print the log (or its tail), then follow it with -f."""
    if args.tail is not None and args.tail < 0:
        raise UsageError(f"--tail {args.tail}: give a number of lines >= 0")
    runtime = runtime_from_context(ctx)
    registry = runtime.registry
    session = registry.resolve(args.id)
    # Everything up to this size is printed now; -f continues from exactly there.
    offset = LogReader(session.log_path).size()
    if args.tail is not None:
        data = tail_lines(registry, session.id, args.tail, offset)
    else:
        data = registry.read_log(session.id, byte_range=(0, offset))
    if args.redact:
        data = redact(data)
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
    if args.follow:
        stream(ctx, registry, session, offset, hooks=args.redact)
    return 0
