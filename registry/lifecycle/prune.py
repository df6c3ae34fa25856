"""Pruning finished sessions: TTL from ``finished_at``, a cap on their number, kept logs.

Rows of finished sessions older than ``registry.finished_ttl``, and the oldest beyond
``registry.max_sessions``, go with their directories. A session owned by ``kanban`` or
``cron`` is referenced by their history, so its log and exit record stay until
``registry.log_retention`` even when the row goes; a later sweep removes such orphaned
directories once they are old enough. Running sessions are never touched.
"""

from __future__ import annotations

import os
from pathlib import Path

from registry.keeper.files import SessionDir, sessions_root
from registry.settings import RegistrySettings
from registry.store.retention import HISTORY_OWNERS
from registry.store.sessions import SessionStore

__all__ = ["prune_sessions"]


def prune_sessions(
    store: SessionStore, state_dir: Path, settings: RegistrySettings, now: float
) -> list[str]:
    """Delete what is due at wall time ``now``; returns the ids of the deleted rows."""
    rows = store.prunable(finished_before=now - settings.finished_ttl, keep=settings.max_sessions)
    for stored in rows:
        session = stored.session
        referenced = session.owner.kind in HISTORY_OWNERS
        recent = (session.finished_at or 0.0) > now - settings.log_retention
        SessionDir(Path(stored.dir)).remove(keep_log=referenced and recent)
    ids = [s.session.id for s in rows]
    store.delete(ids)
    _prune_orphans(store, state_dir, now - settings.log_retention)
    return ids


def _prune_orphans(store: SessionStore, state_dir: Path, cutoff: float) -> None:
    """Directories without a row (kept logs) that ended before ``cutoff``."""
    root = sessions_root(state_dir)
    try:
        names = [e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return
    known = store.known_ids()
    for name in names:
        if name in known or not name.startswith("s_"):
            continue
        sdir = SessionDir(root / name)
        record = sdir.read_exit()
        if record is not None and record.finished_at is not None:
            ended = record.finished_at
        else:
            # No record: a spawn that is just being set up has a fresh directory; only an old
            # one is an orphan.
            try:
                ended = sdir.path.stat().st_mtime
            except FileNotFoundError:
                continue
        if ended < cutoff:
            sdir.remove()
