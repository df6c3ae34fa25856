"""Resource classes: the cgroup limits of one worker's scope.

A class is written as a ``resources:`` mapping (``scope.resources`` is the default for every
worker; ``kanban.assignees.<name>.resources`` and ``cron.jobs[].resources`` override it key by
key). Both scope backends turn a class into the same unit properties: D-Bus through
:func:`bus_properties`, ``systemd-run`` through :func:`run_properties`, so a test can compare
what the manager reports for each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from scope.foundation.schema import Bool, Duration, Int, Invalid, Optional, Percent, Size, setting
from scope.foundation.values import format_percentage, format_size

__all__ = ["LIMIT_KEYS", "ScopeProperties", "bus_properties", "describe", "run_properties"]

_WEIGHT = Int(min=1, max=10000)


@dataclass(frozen=True, kw_only=True)
class ScopeProperties:
    """One resource class (every key optional; unset keys leave the manager's default)."""

    memory_high: int | None = setting(
        None,
        kind=Optional(Size(min=1)),
        doc="MemoryHigh=: above this the kernel throttles the worker and reclaims its memory "
        "hard (no kill); at most memory_max.",
    )
    memory_max: int | None = setting(
        None,
        kind=Optional(Size(min=1)),
        doc="MemoryMax=: the hard cap; a worker that cannot be kept below it is OOM-killed "
        "(outcome oom_killed).",
    )
    memory_swap_max: int | None = setting(
        None,
        kind=Optional(Size(min=0)),
        doc="MemorySwapMax=: swap the worker may use (0: none; cgroup v2 only).",
    )
    cpu_weight: int | None = setting(
        None,
        kind=Optional(_WEIGHT),
        doc="CPUWeight= (1-10000, the manager's default is 100): the worker's share of CPU "
        "time when the CPU is contended.",
    )
    cpu_quota: float | None = setting(
        None,
        kind=Optional(Percent(min=0.01, max=1_000_000)),
        doc='CPUQuota=, written with its sign ("150%" is one and a half CPUs): a hard cap on '
        "CPU time.",
    )
    tasks_max: int | None = setting(
        None,
        kind=Optional(Int(min=1)),
        doc="TasksMax=: processes and threads in the scope (none: the manager's default).",
    )
    io_weight: int | None = setting(
        None,
        kind=Optional(_WEIGHT),
        doc="IOWeight= (1-10000, default 100): the worker's share of block I/O when contended.",
    )
    runtime_max: float | None = setting(
        None,
        kind=Optional(Duration(min=1)),
        doc="RuntimeMaxSec=: the manager stops the scope after this long (outcome timed_out).",
    )
    best_effort: bool | None = setting(
        None,
        kind=Optional(Bool()),
        doc="true: start the worker even when this host cannot apply the class (a missing "
        "cgroup controller); default false: refuse it as spawn_refused.",
    )

    def check(self) -> None:
        """Cross-key rule: ``memory_high`` at most ``memory_max``."""
        high, cap = self.memory_high, self.memory_max
        if high is not None and cap is not None and high > cap:
            raise Invalid(
                f"memory_high {format_size(high)} is above memory_max {format_size(cap)}; "
                "lower memory_high or raise memory_max",
                ("memory_high",),
            )

    def over(self, base: ScopeProperties) -> ScopeProperties:
        """This class with every unset key taken from ``base`` (an override over a default)."""
        merged = {
            name: getattr(self, name) if getattr(self, name) is not None else getattr(base, name)
            for name in _NAMES
        }
        result = ScopeProperties(**merged)
        result.check()
        return result

    @property
    def limits(self) -> dict[str, Any]:
        """The set limit keys and their values (``best_effort`` is not a limit)."""
        return {name: getattr(self, name) for name in LIMIT_KEYS if getattr(self, name) is not None}


_NAMES = tuple(field.name for field in dataclasses.fields(ScopeProperties))
LIMIT_KEYS = tuple(name for name in _NAMES if name != "best_effort")
"""The keys that become unit properties, in declaration order."""

_USEC = 1_000_000


def bus_properties(props: ScopeProperties) -> list[tuple[str, str, Any]]:
    """(property, D-Bus signature, value) for ``StartTransientUnit``."""
    out: list[tuple[str, str, Any]] = []
    simple = (
        ("memory_high", "MemoryHigh"),
        ("memory_max", "MemoryMax"),
        ("memory_swap_max", "MemorySwapMax"),
        ("cpu_weight", "CPUWeight"),
        ("tasks_max", "TasksMax"),
        ("io_weight", "IOWeight"),
    )
    for key, name in simple:
        value = getattr(props, key)
        if value is not None:
            out.append((name, "t", int(value)))
    if props.cpu_quota is not None:
        # CPUQuota=x% is stored as x/100 s of CPU per second; hundredths of a percent are exact.
        out.append(("CPUQuotaPerSecUSec", "t", round(props.cpu_quota * 100) * _USEC // 10000))
    if props.runtime_max is not None:
        out.append(("RuntimeMaxUSec", "t", int(props.runtime_max * _USEC)))
    return out


def run_properties(props: ScopeProperties) -> list[str]:
    """``-p NAME=VALUE`` arguments for ``systemd-run`` giving the same unit properties."""
    out: list[str] = []
    for name, _signature, value in bus_properties(props):
        if name == "CPUQuotaPerSecUSec":
            out += ["-p", f"CPUQuota={format_percentage(props.cpu_quota or 0)}"]
        elif name == "RuntimeMaxUSec":
            # Microseconds, as D-Bus gets them: a float in seconds could round differently.
            out += ["-p", f"RuntimeMaxSec={value}us"]
        else:
            out += ["-p", f"{name}={value}"]
    return out


def describe(props: ScopeProperties) -> str:
    """A short one-line spelling of a class (``memory_max 512MiB, cpu_quota 150%``) or
    ``default`` when it sets nothing."""
    parts = []
    for key, value in props.limits.items():
        if key.startswith("memory"):
            shown = format_size(value)
        elif key == "cpu_quota":
            shown = format_percentage(value)
        elif key == "runtime_max":
            shown = f"{value:g}s"
        else:
            shown = str(value)
        parts.append(f"{key} {shown}")
    return ", ".join(parts) or "default"
