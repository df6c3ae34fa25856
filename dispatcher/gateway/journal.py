"""Logging set-up for the gateway: one line per event, journal priorities when on the journal.

When stderr is connected to the journal (``$JOURNAL_STREAM`` names stderr's device and inode),
each line starts with a ``<N>`` syslog priority so ``journalctl -p warning`` works and the
journal adds its own timestamps; elsewhere lines carry a timestamp and level name.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

PRIORITIES = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def stderr_is_journal(environ: Mapping[str, str], stream: TextIO | None = None) -> bool:
    """True when ``stream`` (default stderr) is the journal stream systemd connected."""
    stream = stream or sys.stderr
    raw = environ.get("JOURNAL_STREAM", "")
    if ":" not in raw:
        return False
    try:
        dev, ino = (int(part) for part in raw.split(":", 1))
        info = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (info.st_dev, info.st_ino) == (dev, ino)


class JournalFormatter(logging.Formatter):
    """``<N>name: message`` with newlines flattened (one event, one line)."""

    def format(self, record: logging.LogRecord) -> str:
        priority = PRIORITIES.get(record.levelno, 6)
        text = super().format(record).replace("\n", " | ")
        return f"<{priority}>{text}"


class LineFormatter(logging.Formatter):
    """Timestamped single lines for terminals and files."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", " | ")


def configure_logging(
    environ: Mapping[str, str], *, level: int = logging.INFO, stream: TextIO | None = None
) -> logging.Handler:
    """Attach one handler to the ``dispatch`` logger; returns it (remove it to undo)."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    if stderr_is_journal(environ, stream):
        handler.setFormatter(JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(
            LineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S%z")
        )
    logger = logging.getLogger("dispatch")
    for old in list(logger.handlers):
        if getattr(old, "dispatch_cli", False):
            logger.removeHandler(old)  # the CLI's plain diagnostics handler: replaced
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler
