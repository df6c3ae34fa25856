"""Where state lives: the state dir (database, logs, keeper files), resolved per call."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from registry.store.database import ensure_private_dir
from scope.foundation.errors import UsageError
from scope.foundation.text import quote


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_STATE_HOME/dispatch``, else ``~/.local/state/dispatch``."""
    base = environ.get("XDG_STATE_HOME", "")
    if not base or not os.path.isabs(base):
        base = str(Path(environ.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "dispatch"


def resolve_state_dir(explicit: str | None, environ: Mapping[str, str]) -> Path:
    """``--state-dir``, else ``DISPATCH_STATE_DIR``, else the default; not created here."""
    chosen = explicit or environ.get("DISPATCH_STATE_DIR") or None
    path = Path(chosen).expanduser().absolute() if chosen else default_state_dir(environ)
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        # Paths under the state dir are stored as text (the board, the cron ledger, which
        # may live in PostgreSQL); a name with bytes that are not UTF-8 cannot be. A usage
        # error (exit 2), unlike the state-dir errors (exit 1): the argument itself is
        # unusable, on any machine, whatever is at that path.
        raise UsageError(
            f"state dir {quote(str(path))} is not a UTF-8 path",
            remedy="pass --state-dir (or DISPATCH_STATE_DIR) naming a directory in UTF-8",
        ) from None
    return path


def prepare_state_dir(path: Path) -> Path:
    """Create the state dir with mode 0700 (parents too). One line and exit 1 when it cannot
    be, like every other state-dir error
    (:class:`~registry.store.database.StateDirUnusable`, ``UnsafeStatePath``)."""
    return ensure_private_dir(path)
