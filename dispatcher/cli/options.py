"""Options several commands share: counts, ``--since``, and ``--watch`` with its redraw loop.

``--watch`` re-runs a view every ``--interval`` seconds. On a terminal the view is redrawn in
place (cursor home, each line cleared to its end, the rest of the screen cleared), under a
header like watch(1)'s; otherwise a new snapshot is printed only when the view changed, with
absolute times (relative ones such as ``3s ago`` would make every snapshot differ). Ctrl-C
ends it with exit status 130 and nothing else on stderr.
"""

from __future__ import annotations

import argparse
import io
import shlex
import sys
import time
from collections.abc import Callable

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, int_arg
from scope.foundation.errors import UsageError
from scope.foundation.schema import Invalid, parse_duration
from scope.foundation.text import quote
from scope.foundation.values import ISO_HINT, parse_iso_time

MAX_COUNT = 10**9

WATCH_DEFAULT = 2.0
WATCH_MIN = 0.2
WATCH_MAX = 3600.0
EXIT_INTERRUPTED = 130
HOME = "\x1b[H"
CLEAR_LINE = "\x1b[K"
CLEAR_BELOW = "\x1b[J"


positive_int = int_arg(1, MAX_COUNT)
"""argparse ``type``: a whole number 1 to 10^9 in ASCII digits."""

count_int = int_arg(0, MAX_COUNT)
"""argparse ``type``: a whole number 0 to 10^9 in ASCII digits."""


def since_arg(text: str, now: float) -> float:
    """``--since``: a duration back from now (``90``, ``30m``, ``2h``, ``1d``) or an ISO-8601
    time (``2026-11-30T09:00``, local when it has no offset); epoch seconds."""
    try:
        return now - parse_duration(text)
    except Invalid:
        pass
    try:
        moment = parse_iso_time(text, None)
        return (moment if moment.tzinfo else moment.astimezone()).timestamp()
    except (Invalid, OverflowError, ValueError, OSError):
        raise UsageError(
            f"--since {quote(text)}: give a duration (30m, 2h, 1d) or an ISO-8601 time "
            f"between the years 1 and 9999 ({ISO_HINT})"
        ) from None


def watch_options(parser: Parser) -> None:
    """Add ``--watch`` and ``--interval``."""
    parser.add_argument(
        "--watch",
        "-w",
        action="store_true",
        help="keep showing the view: redrawn in place on a terminal, a new snapshot per change "
        "otherwise; Ctrl-C ends it (exit 130)",
    )
    parser.add_argument(
        "--interval",
        metavar="S",
        default=None,
        help=f"with --watch: seconds between looks ({WATCH_MIN:g} to {WATCH_MAX:g}, default "
        f"{WATCH_DEFAULT:g})",
    )


def interval_of(args: argparse.Namespace) -> float:
    """The validated ``--interval`` (a usage error without ``--watch`` or out of bounds)."""
    if args.interval is None:
        return WATCH_DEFAULT
    if not args.watch:
        raise UsageError("--interval needs --watch")
    try:
        seconds = parse_duration(args.interval)
    except Invalid as err:
        raise UsageError(f"--interval: {err.problem}") from None
    if not WATCH_MIN <= seconds <= WATCH_MAX:
        raise UsageError(
            f"--interval {quote(args.interval)}: give {WATCH_MIN:g} to {WATCH_MAX:g} seconds"
        )
    return seconds


def watched(args: argparse.Namespace, ctx: Context, render: Callable[[], int]) -> int:
    """Run ``render`` once, or (``--watch``) again and again; see the module docstring."""
    interval = interval_of(args)
    if not getattr(args, "watch", False):
        return render()
    tty = _isatty(ctx)
    ctx.stable_times = not tty
    out = ctx.stdout
    title = "dispatch " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "dispatch"
    last: str | None = None
    try:
        while True:
            text = _capture(ctx, render)
            if tty:
                header = f"every {interval:g}s: {title}    {ctx.times().at(ctx.clock.time())}"
                lines = [header, "", *text.splitlines()]
                out.write(HOME + "".join(line + CLEAR_LINE + "\n" for line in lines) + CLEAR_BELOW)
                out.flush()
            elif text != last:
                out.write(text if last is None else "\n" + text)
                out.flush()
            last = text
            time.sleep(interval)
    except KeyboardInterrupt:
        if tty:
            out.write("\n")
            out.flush()
        return EXIT_INTERRUPTED


def _capture(ctx: Context, render: Callable[[], int]) -> str:
    """What one ``render`` prints; what it opened is closed right after."""
    real, buffer = ctx.stdout, io.StringIO()
    ctx.stdout = buffer
    try:
        render()
    finally:
        ctx.stdout = real
        ctx.close()
    return buffer.getvalue()


def _isatty(ctx: Context) -> bool:
    try:
        return ctx.stdout.isatty()
    except (AttributeError, ValueError):
        return False
