"""What a worker was given and what it used: the resource class its scope got at the start
(:class:`ResourceClass`), and its keeper's reading of its own scope when it ended (:class:`Usage`).

The keeper (``registry/keeper/program.py``) writes these fields under ``usage`` in
``exit.json``; the registry stores them with the session. ``oom_kills`` counts the kernel's OOM
kills in the worker's own scope (cgroup v2 ``memory.events``, v1 ``memory.oom_control``): a
worker that died of SIGKILL with a count above zero, and that nobody (the registry, an
operator through it) was killing, was killed by the OOM killer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scope.foundation.values import format_size
from scope.resources import LIMIT_KEYS, ScopeProperties, describe

__all__ = ["OOM_EXIT", "ResourceClass", "Usage", "oom_reason", "runtime_max_text"]

OOM_EXIT = 128 + 9
"""How a shell reports a child killed by SIGKILL (``sh -c`` around the real worker)."""


@dataclass(frozen=True, kw_only=True)
class Usage:
    """A finished worker's resource use (every figure None when it could not be read)."""

    oom_kills: int = 0
    """OOM kills the kernel counted in the worker's scope."""
    memory_peak: int | None = None
    """Peak memory of the scope (cgroup ``memory.peak`` / ``max_usage_in_bytes``) in bytes."""
    memory_max: int | None = None
    """The scope's memory limit in bytes as the kernel applied it (None: no limit)."""
    max_rss: int | None = None
    """The largest resident set of the worker and the descendants it waited for (bytes):
    the peak where the scope has no memory cgroup of its own."""
    cpu_time: float | None = None
    """User plus system CPU seconds of the worker and the descendants it waited for."""
    cgroup: str | None = None
    """Where the memory figures came from: ``v2``, ``v1`` or None (no cgroup of our own)."""

    @property
    def peak(self) -> int | None:
        """The best peak figure there is: the cgroup's, else the largest resident set."""
        return self.memory_peak if self.memory_peak is not None else self.max_rss

    @classmethod
    def from_json(cls, data: Any) -> Usage | None:
        """Parse the ``usage`` of an exit record or a stored row (None: nothing usable)."""
        if not isinstance(data, Mapping) or not data:
            return None
        cgroup = data.get("cgroup")
        return cls(
            oom_kills=_count(data.get("oom_kills")) or 0,
            memory_peak=_count(data.get("memory_peak")),
            memory_max=_count(data.get("memory_max")),
            max_rss=_count(data.get("max_rss")),
            cpu_time=_seconds(data.get("cpu_time")),
            cgroup=cgroup if cgroup in ("v1", "v2") else None,
        )

    def to_json(self) -> dict[str, Any]:
        """The stored form (keys with no figure left out)."""
        found = {
            "oom_kills": self.oom_kills,
            "memory_peak": self.memory_peak,
            "memory_max": self.memory_max,
            "max_rss": self.max_rss,
            "cpu_time": self.cpu_time,
            "cgroup": self.cgroup,
        }
        return {key: value for key, value in found.items() if value is not None}


@dataclass(frozen=True, kw_only=True)
class ResourceClass:
    """The resource class a worker's scope was given: its own over ``scope.resources``, in
    canonical values (bytes, seconds, percent), and the keys of it this host does not enforce
    (started anyway: ``best_effort``). Sessions without a scope of their own have none."""

    limits: Mapping[str, int | float]
    ineffective: tuple[str, ...] = ()

    @classmethod
    def of(cls, props: ScopeProperties, ineffective: tuple[str, ...] = ()) -> ResourceClass:
        """The record of a class as the scope layer applied it."""
        return cls(limits=dict(props.limits), ineffective=tuple(ineffective))

    def describe(self) -> str:
        """``memory_max 512MiB, cpu_quota 150%`` (``default`` when nothing is set), with the
        keys this host did not enforce named after it."""
        text = describe(ScopeProperties(**self.limits))  # type: ignore[arg-type]
        if self.ineffective:
            text += f" (not enforced here: {', '.join(self.ineffective)})"
        return text

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {"limits": dict(self.limits), "ineffective": list(self.ineffective)}

    @classmethod
    def from_json(cls, data: Any) -> ResourceClass | None:
        """Parse a stored class (None: nothing usable); unknown keys and junk are dropped."""
        if not isinstance(data, Mapping) or not isinstance(data.get("limits"), Mapping):
            return None
        limits: dict[str, int | float] = {}
        for key, value in data["limits"].items():
            number = _seconds(value)
            if key in LIMIT_KEYS and number is not None:
                limits[key] = value if isinstance(value, int) else number
        skipped = data.get("ineffective")
        names = skipped if isinstance(skipped, list) else []
        return cls(limits=limits, ineffective=tuple(k for k in names if k in LIMIT_KEYS))


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return float(value)


def oom_reason(
    *, exited: bool, signal: str | None, exit_code: int | None, usage: Usage | None
) -> str | None:
    """The error text of a worker the kernel's OOM killer ended, or None when it was not.

    ``exited``: the worker ended by itself as far as the registry knows (no kill intent, no
    timeout), so a kill by the registry or an operator through it never reads as an OOM kill.
    Otherwise it takes SIGKILL (or a shell's 137) together with an OOM kill counted in the
    worker's own scope."""
    if not exited or usage is None or usage.oom_kills <= 0:
        return None
    if signal != "SIGKILL" and not (signal is None and exit_code == OOM_EXIT):
        return None
    limit = format_size(usage.memory_max) if usage.memory_max is not None else "its limit"
    peak = f" (peak {format_size(usage.peak)})" if usage.peak is not None else ""
    return f"killed by the kernel's OOM killer at memory_max {limit}{peak}"


def runtime_max_text(resources: ResourceClass | None) -> str:
    """``stopped by systemd at runtime_max 30s``: why a scope ended at its ``RuntimeMaxSec=``
    (the class's value when it is known)."""
    limit = resources.limits.get("runtime_max") if resources is not None else None
    at = f" {limit:g}s" if limit is not None else ""
    return f"stopped by systemd at runtime_max{at}"
