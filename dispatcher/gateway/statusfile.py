"""The gateway's status file: what ``dispatch status`` can only learn from the running serve.

Written atomically (temp + rename, mode 0600) every few seconds and at shutdown; read by any
process. It is trusted only while the serve lock is held by the pid it names.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUS_NAME = "serve.json"


@dataclass(frozen=True, kw_only=True)
class ServeStatus:
    """A snapshot of a running gateway."""

    pid: int
    started_at: float
    updated_at: float
    stopping: bool = False
    placement: dict[str, str] = field(default_factory=dict)
    """What cron and kanban workers get now: a placement value or ``refused``."""
    workers: dict[str, int] = field(default_factory=dict)
    """Running workers by owner kind."""
    kanban_ticks: int = 0
    recent_errors: list[dict[str, Any]] = field(default_factory=list)
    host_zone: str | None = None
    """The zone cron jobs without ``timezone`` follow in this gateway (its ``TZ`` or the
    system's), so ``cron list`` shows the zone the scheduler uses, not the CLI's."""
    keepers: dict[str, Any] | None = None
    """The keeper fork server: pid, running, keepers forked, fallbacks by reason, restarts
    (None when serve runs without one)."""
    relay: dict[str, Any] | None = None
    """The short-write relay (:mod:`dispatcher.cli.relay_server`): commands answered, and
    declined by reason (None when serve has no relay socket)."""


def write_status(state_dir: Path, status: ServeStatus) -> None:
    """Replace the status file atomically."""
    write_json(Path(state_dir) / STATUS_NAME, asdict(status))


def read_status(state_dir: Path) -> ServeStatus | None:
    """The last status written, or None when there is none or it is unreadable."""
    raw = read_json(Path(state_dir) / STATUS_NAME)
    try:
        return ServeStatus(**raw) if isinstance(raw, dict) else None
    except TypeError:
        return None


def write_json(path: Path, document: Any) -> None:
    """Replace ``path`` with ``document`` as JSON, atomically, mode 0600."""
    data = json.dumps(document, indent=1).encode()
    fd, temp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".json", dir=path.parent)
    try:
        # mkstemp made the file 0600; the rename makes the update atomic for readers.
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    """The JSON document in ``path``, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def scheduler_zone(state_dir: Path) -> str | None:
    """The zone the running gateway fires jobs without ``timezone`` in (from its status file,
    when the status is that gateway's), else None."""
    from dispatcher.gateway.lock import read_holder

    holder = read_holder(state_dir)
    status = read_status(state_dir) if holder else None
    if status is not None and holder is not None and status.pid == holder.pid:
        return status.host_zone or None
    return None
