"""Admission under pressure: whether this host takes new work now. A pure policy.

The ``admission:`` section sets, per host, when to hold new claims (kanban) and cron starts:

* ``memory_pressure``: the kernel's PSI (``/proc/pressure/memory``, ``some avg10``: the share
  of the last ten seconds in which some task waited for memory), default 20 %;
* ``memory_available``: a floor on ``MemAvailable`` (``/proc/meminfo``), default 256MiB;
* ``cpu_pressure``: PSI ``/proc/pressure/cpu`` ``some avg10`` (off unless set).

Each has a resume threshold on the calm side of it (hysteresis: lower for the pressures,
higher for the floor; by default half a pressure threshold and twice the floor), and a hold
lasts at least ``min_hold``: a host never flips from held to taking work faster than that,
however its readings jitter around a threshold. Running workers are never touched; only new
work waits.

:func:`decide` is the one decision: given the readings, the thresholds, the previous state and
``now`` (wall seconds, injected), it returns the new :class:`AdmissionState`. A reading that
is missing (``None``: a kernel or container without PSI) neither starts nor prolongs a hold, so
a host without PSI is held by ``memory_available`` alone. :func:`reason_text` spells why
(``memory pressure 34 %``); nothing here reads a file or a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dispatcher.launch.resources import human_size
from scope.foundation.errors import Invalid
from scope.foundation.schema import Bool, Duration, Optional, Percent, Size, setting
from scope.foundation.values import format_size

__all__ = [
    "SIGNALS",
    "AdmissionSettings",
    "AdmissionState",
    "Readings",
    "decide",
    "reason_text",
]

SIGNALS = ("memory_pressure", "memory_available", "cpu_pressure")
"""The readings admission looks at, in the order reasons are given."""

_PAIRS = (
    ("memory_pressure", "memory_pressure_resume", "below"),
    ("memory_available", "memory_available_resume", "at least"),
    ("cpu_pressure", "cpu_pressure_resume", "below"),
)
"""Each hold threshold, its resume threshold, and the side of it where that one lies."""

_PERCENT = Percent(min=0.01, max=100)
_RESUME = Percent(min=0, max=100)


@dataclass(frozen=True, kw_only=True)
class AdmissionSettings:
    """The ``admission:`` section (this host's; each host of a cluster has its own)."""

    enabled: bool = setting(
        True, kind=Bool(), doc="false: take new work whatever the pressure (no admission)."
    )
    memory_pressure: float | None = setting(
        20.0,
        kind=Optional(_PERCENT),
        doc="Hold new work while PSI memory 'some avg10' (/proc/pressure/memory) is at or "
        "above this (null: ignore memory pressure).",
    )
    memory_pressure_resume: float | None = setting(
        None,
        kind=Optional(_RESUME),
        doc="Take work again once memory pressure is below this (lower than memory_pressure; "
        "default: half of memory_pressure).",
    )
    memory_available: int | None = setting(
        256 * 2**20,
        kind=Optional(Size(min=0)),
        doc="Hold new work while MemAvailable (/proc/meminfo) is below this (null: no floor).",
    )
    memory_available_resume: int | None = setting(
        None,
        kind=Optional(Size(min=0)),
        doc="Take work again once MemAvailable is at least this (at least memory_available; "
        "default: twice memory_available).",
    )
    cpu_pressure: float | None = setting(
        None,
        kind=Optional(_PERCENT),
        doc="Hold new work while PSI cpu 'some avg10' (/proc/pressure/cpu) is at or above "
        "this (null: ignore CPU pressure).",
    )
    cpu_pressure_resume: float | None = setting(
        None,
        kind=Optional(_RESUME),
        doc="Take work again once CPU pressure is below this (default: half of cpu_pressure).",
    )
    min_hold: float = setting(
        30.0,
        kind=Duration(min=0),
        doc="A hold lasts at least this long, so admission never flaps faster.",
    )

    def check(self) -> None:
        """A resume threshold needs its hold threshold (without one it would never apply) and
        lies on the calm side of it (one left out is derived from it, so it always does)."""
        for hold, resume, calm in _PAIRS:
            limit, back = getattr(self, hold), getattr(self, resume)
            if back is None:
                continue
            if limit is None:
                raise Invalid(
                    f"is set but {hold} is null, so it would never apply; set {hold} or "
                    f"remove {resume}",
                    (resume,),
                )
            if (back >= limit) if calm == "below" else (back < limit):
                raise Invalid(
                    f"must be {calm} {hold} (resume when "
                    + ("the pressure has eased)" if calm == "below" else "memory is back)"),
                    (resume,),
                )

    @property
    def memory_resume(self) -> float | None:
        """The memory pressure resume threshold in effect (half of ``memory_pressure`` unless
        set)."""
        if self.memory_pressure is None:
            return None
        if self.memory_pressure_resume is None:
            return self.memory_pressure / 2
        return self.memory_pressure_resume

    @property
    def available_resume(self) -> int | None:
        """The ``MemAvailable`` resume floor in effect (twice ``memory_available`` unless
        set)."""
        if self.memory_available is None:
            return None
        if self.memory_available_resume is None:
            return 2 * self.memory_available
        return self.memory_available_resume

    @property
    def cpu_resume(self) -> float | None:
        """The CPU resume threshold in effect (half of ``cpu_pressure`` unless set)."""
        if self.cpu_pressure is None:
            return None
        return (
            self.cpu_pressure / 2 if self.cpu_pressure_resume is None else self.cpu_pressure_resume
        )


@dataclass(frozen=True, kw_only=True)
class Readings:
    """What the host reports now (None: not available here)."""

    memory_pressure: float | None = None
    """PSI memory ``some avg10``, percent."""
    memory_available: int | None = None
    """``MemAvailable``, bytes."""
    cpu_pressure: float | None = None
    """PSI cpu ``some avg10``, percent."""

    @property
    def psi(self) -> bool:
        """Whether the kernel reports pressure stall information here."""
        return self.memory_pressure is not None


@dataclass(frozen=True, kw_only=True)
class AdmissionState:
    """Held or taking work, since when, and which readings hold it."""

    held: bool = False
    since: float | None = None
    """Wall time of the last change (None: never changed)."""
    reasons: tuple[str, ...] = ()
    """Signals (:data:`SIGNALS`) past their threshold while held, in that order."""


def _over(settings: AdmissionSettings, readings: Readings) -> list[str]:
    """Signals past their hold threshold."""
    out = []
    if _at_least(readings.memory_pressure, settings.memory_pressure):
        out.append("memory_pressure")
    if _below(readings.memory_available, settings.memory_available):
        out.append("memory_available")
    if _at_least(readings.cpu_pressure, settings.cpu_pressure):
        out.append("cpu_pressure")
    return out


def _not_calm(settings: AdmissionSettings, readings: Readings) -> list[str]:
    """Signals not yet back on the calm side of their resume threshold."""
    out = []
    if _at_least(readings.memory_pressure, settings.memory_resume):
        out.append("memory_pressure")
    if _below(readings.memory_available, settings.available_resume):
        out.append("memory_available")
    resume = settings.cpu_resume
    if resume is not None and _at_least(readings.cpu_pressure, resume):
        out.append("cpu_pressure")
    return out


def _at_least(value: float | None, threshold: float | None) -> bool:
    """``value >= threshold``, where None on either side means "cannot tell": never."""
    if value is None or threshold is None or not math.isfinite(value):
        return False
    return value >= threshold


def _below(value: int | None, floor: int | None) -> bool:
    """``value < floor``, where None on either side means "cannot tell": never."""
    return value is not None and floor is not None and value < floor


def decide(
    readings: Readings, settings: AdmissionSettings, previous: AdmissionState, now: float
) -> AdmissionState:
    """The admission state at ``now`` (see the module docstring)."""
    if not settings.enabled:
        return AdmissionState(since=now) if previous.held else previous
    if not previous.held:
        over = _over(settings, readings)
        if over:
            return AdmissionState(held=True, since=now, reasons=tuple(over))
        return previous
    still = _not_calm(settings, readings)
    held_for = now - previous.since if previous.since is not None else math.inf
    if held_for < 0:
        held_for = math.inf  # the wall clock stepped back: the hold is as old as can be
    if not still and held_for >= settings.min_hold:
        return AdmissionState(held=False, since=now)
    return AdmissionState(held=True, since=previous.since, reasons=tuple(still) or previous.reasons)


def reason_text(state: AdmissionState, readings: Readings, settings: AdmissionSettings) -> str:
    """Why the host is held, in words (``memory pressure 34 %``), or "" when it is not."""
    if not state.held:
        return ""
    parts = []
    for signal in state.reasons:
        if signal == "memory_pressure" and readings.memory_pressure is not None:
            parts.append(f"memory pressure {readings.memory_pressure:.0f} %")
        elif signal == "cpu_pressure" and readings.cpu_pressure is not None:
            parts.append(f"cpu pressure {readings.cpu_pressure:.0f} %")
        elif signal == "memory_available" and readings.memory_available is not None:
            floor = format_size(settings.memory_available or 0)
            shown = human_size(readings.memory_available)
            parts.append(f"MemAvailable {shown} (floor {floor})")
        else:
            parts.append(signal.replace("_", " "))
    return ", ".join(parts) or "pressure (readings gone)"
