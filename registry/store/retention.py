"""The retention rule: which finished sessions are due for pruning, and whose logs outlive them.

Pure, so the real store's SQL selection and the in-memory fake apply the same rule; deleting
rows and directories is :mod:`registry.lifecycle.prune`.
"""

from __future__ import annotations

from collections.abc import Iterable

from registry.abc import OwnerKind

__all__ = ["HISTORY_OWNERS", "due_for_pruning"]

HISTORY_OWNERS = frozenset({OwnerKind.KANBAN, OwnerKind.CRON})
"""Owner kinds whose history references session logs."""


def due_for_pruning(
    finished: Iterable[tuple[str, float | None]], *, finished_before: float, keep: int
) -> list[str]:
    """Which finished sessions go, given their ``(id, finished_at)``: those that finished
    before ``finished_before``, and the oldest beyond the newest ``keep``. The one rule for
    every registry (the real one's store and the in-memory fake)."""
    newest_first = sorted(finished, key=lambda item: (item[1] or 0.0, item[0]), reverse=True)
    return [
        session_id
        for index, (session_id, finished_at) in enumerate(newest_first)
        if index >= keep or (finished_at or 0.0) < finished_before
    ]
