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


def write_status(state_dir: Path, status: ServeStatus) -> None:
    """Replace the status file atomically."""
    write_document(state_dir, STATUS_NAME, asdict(status))


def write_document(state_dir: Path, name: str, document: dict[str, Any]) -> None:
    """Replace the JSON file ``name`` in the state dir atomically (mode 0600)."""
    data = json.dumps(document, indent=1).encode()
    fd, temp = tempfile.mkstemp(prefix=f".{Path(name).stem}-", suffix=".json", dir=state_dir)
    try:
        # mkstemp made the file 0600; the rename makes the update atomic for readers.
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, Path(state_dir) / name)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def read_status(state_dir: Path) -> ServeStatus | None:
    """The last status written, or None when there is none or it is unreadable."""
    try:
        raw = json.loads((Path(state_dir) / STATUS_NAME).read_text())
        return ServeStatus(**raw)
    except (OSError, ValueError, TypeError):
        return None
