"""A run's resources as every view shows them: the class its scope got and, once it ended, its
peak memory and CPU time. Kanban runs and cron fires reach them through their session (the
registry stores both: :class:`registry.usage.ResourceClass` at the start, the keeper's
:class:`registry.usage.Usage` at the end), so ``kanban show``, ``cron history`` and the web
read the same fields from here."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from registry.abc import Registry, Session
from scope.foundation.errors import NotFoundError

__all__ = ["human_size", "resources_json", "resources_text", "sessions_of", "used_text"]


def sessions_of(registry: Registry, session_ids: Iterable[str | None]) -> dict[str, Session]:
    """The sessions behind these ids that this host's registry knows (a run of another host
    in a cluster, or one pruned since, is simply absent)."""
    found: dict[str, Session] = {}
    for session_id in session_ids:
        if not session_id or session_id in found:
            continue
        try:
            found[session_id] = registry.get(session_id)
        except NotFoundError:
            continue
    return found


def resources_json(session: Session | None) -> dict[str, Any]:
    """The ``--json`` fields: ``resources`` (the class: ``class`` spelled out, ``limits`` in
    bytes/seconds/percent, ``not_enforced`` keys; null without a scope of its own),
    ``memory_peak`` (bytes) and ``cpu_time`` (seconds), null until known."""
    granted = session.resources if session is not None else None
    usage = session.usage if session is not None else None
    return {
        "resources": None
        if granted is None
        else {
            "class": granted.describe(),
            "limits": dict(granted.limits),
            "not_enforced": list(granted.ineffective),
        },
        "memory_peak": usage.peak if usage is not None else None,
        "cpu_time": usage.cpu_time if usage is not None else None,
    }


def resources_text(session: Session | None) -> str:
    """``class memory_max 512MiB; peak 301.2MiB, cpu 12.4s`` (empty when nothing is known)."""
    if session is None:
        return ""
    parts = []
    if session.resources is not None:
        parts.append(f"class {session.resources.describe()}")
    used = used_text(session)
    if used:
        parts.append(used)
    return "; ".join(parts)


def used_text(session: Session | None) -> str:
    """``peak 301.2MiB, cpu 12.4s`` for an ended worker (empty while it runs or unknown)."""
    usage = session.usage if session is not None else None
    if usage is None:
        return ""
    parts = []
    if usage.peak is not None:
        parts.append(f"peak {human_size(usage.peak)}")
    if usage.cpu_time is not None:
        seconds = usage.cpu_time
        parts.append(f"cpu {seconds:.1f}s" if seconds < 100 else f"cpu {seconds:.0f}s")
    return ", ".join(parts)


def human_size(size: int) -> str:
    """``301.2MiB``: one decimal below 100 of a unit, none above (display only; config sizes
    are spelled exactly by :func:`scope.foundation.values.format_size`)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    if unit == "B":
        return f"{size}B"
    return f"{value:.1f}{unit}" if value < 100 else f"{value:.0f}{unit}"
