"""This host's admission under pressure, as the gateway and ``kanban tick`` apply it.

:class:`HostAdmission` reads the host's pressure (:mod:`dispatcher.launch.pressure`), decides
with the pure policy (:mod:`dispatcher.launch.admission`), logs one line on each change and
keeps the verdict with its readings in ``admission.json`` in the state dir (atomic, 0600): the
next ``kanban tick`` continues from it (the hysteresis and the minimum hold span processes),
and ``dispatch status``, the web's status page and ``/metrics`` read it.

:class:`Admitted` wraps the gateway's cluster member (:mod:`dispatcher.gateway.member`), the
seam every claim and the ``STATUS=`` line already pass: while held, a kanban tick may claim
nothing, cron starts no scheduled fire (:mod:`dispatcher.cron.hold`: it waits ``queued`` until
its start deadline, then is ``missed`` with the reason) and the ``STATUS=`` line says why. In
cluster mode a held host also decides no new cron fires, so the other hosts take them. Running
workers are never touched.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dispatcher.cron.scheduler import CronScheduler
from dispatcher.cron.waker import CronWaker
from dispatcher.gateway.member import Alone, Member
from dispatcher.gateway.statusfile import read_json, write_json
from dispatcher.kanban.settings import KanbanSettings
from dispatcher.launch.admission import (
    AdmissionSettings,
    AdmissionState,
    Readings,
    decide,
    reason_text,
)
from dispatcher.launch.pressure import proc_root, read_readings
from scope.foundation.clock import Clock

__all__ = [
    "ADMISSION_NAME",
    "Admitted",
    "HostAdmission",
    "Verdict",
    "admission_status",
    "admitted",
    "read_verdict",
]

log = logging.getLogger("dispatch.admission")

ADMISSION_NAME = "admission.json"
CHECK_EVERY = 2.0
"""Seconds between readings in the gateway (PSI's avg10 moves every two seconds)."""
WRITE_EVERY = 5.0
"""Seconds between rewrites of ``admission.json`` while nothing changes (fresh readings)."""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What admission decided, from which readings, when and where."""

    held: bool = False
    since: float | None = None
    reasons: tuple[str, ...] = ()
    reason: str = ""
    """Why it holds, in words (``memory pressure 34 %``); empty when it does not."""
    readings: Readings = field(default_factory=Readings)
    updated_at: float = 0.0
    writer: str = ""
    """``serve`` or ``kanban tick``."""
    pid: int = 0

    @property
    def state(self) -> AdmissionState:
        """The policy's state (what the next decision continues from)."""
        return AdmissionState(held=self.held, since=self.since, reasons=self.reasons)

    def to_json(self) -> dict[str, Any]:
        """The stored and ``--json`` form."""
        data = asdict(self)
        data["reasons"] = list(self.reasons)
        data["readings"]["psi"] = self.readings.psi
        return data

    @classmethod
    def from_json(cls, data: Any) -> Verdict | None:
        """Parse a stored verdict (None when unusable)."""
        if not isinstance(data, Mapping):
            return None
        raw = data.get("readings")
        readings = raw if isinstance(raw, Mapping) else {}
        try:
            return cls(
                held=bool(data.get("held")),
                since=_number(data.get("since")),
                reasons=tuple(str(r) for r in data.get("reasons") or ()),
                reason=str(data.get("reason") or ""),
                readings=Readings(
                    memory_pressure=_number(readings.get("memory_pressure")),
                    cpu_pressure=_number(readings.get("cpu_pressure")),
                    memory_available=_count(readings.get("memory_available")),
                ),
                updated_at=_number(data.get("updated_at")) or 0.0,
                writer=str(data.get("writer") or ""),
                pid=_count(data.get("pid")) or 0,
            )
        except (TypeError, ValueError):
            return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_verdict(state_dir: Path) -> Verdict | None:
    """The last verdict written in ``state_dir`` (None: none, or unreadable)."""
    return Verdict.from_json(read_json(Path(state_dir) / ADMISSION_NAME))


def admission_status(
    state_dir: Path, environ: Mapping[str, str], settings: AdmissionSettings
) -> dict[str, Any]:
    """What ``dispatch status``, the web and ``/metrics`` show: the last decision (who made it,
    when) and the readings now (epoch seconds; sizes in bytes; pressures in percent)."""
    verdict = read_verdict(state_dir)
    readings = read_readings(proc_root(environ))
    return {
        "enabled": settings.enabled,
        "held": bool(verdict and verdict.held),
        "reasons": list(verdict.reasons) if verdict and verdict.held else [],
        "reason": verdict.reason if verdict and verdict.held else "",
        "since": verdict.since if verdict else None,
        "decided_by": verdict.writer if verdict else None,
        "decided_at": verdict.updated_at if verdict else None,
        "readings": {**asdict(readings), "psi": readings.psi},
        "now": describe(readings),
    }


class HostAdmission:
    """Reads, decides, logs each change, keeps the verdict (see the module docstring)."""

    def __init__(
        self,
        settings: Callable[[], AdmissionSettings],
        state_dir: Path,
        environ: Mapping[str, str],
        clock: Clock,
        *,
        writer: str,
    ) -> None:
        self._settings = settings
        self._state_dir = Path(state_dir)
        self._proc = proc_root(environ)
        self._clock = clock
        self._writer = writer
        self._lock = threading.Lock()
        previous = read_verdict(self._state_dir)
        self._verdict = Verdict() if previous is None else previous
        self._checked: float | None = None
        self._written = 0.0

    @property
    def verdict(self) -> Verdict:
        """The last decision (no new reading)."""
        with self._lock:
            return self._verdict

    def check(self, *, every: float = 0.0) -> Verdict:
        """Read and decide now (at most once per ``every`` monotonic seconds: else the last
        decision), log a change, keep the verdict."""
        with self._lock:
            started = self._clock.monotonic()
            if self._checked is not None and started - self._checked < every:
                return self._verdict
            self._checked = started
            before = self._verdict
            self._verdict = self._decide()
            now = self._verdict.updated_at
            changed = self._verdict.held != before.held
            if changed:
                self._log_change(before, self._verdict, now)
            if changed or now - self._written >= WRITE_EVERY:
                self._write(now)
            return self._verdict

    def peek(self) -> Verdict:
        """What :meth:`check` would decide now, without keeping, logging or writing it (a
        ``kanban tick --dry-run`` changes nothing, the admission state included)."""
        with self._lock:
            return self._decide()

    def _decide(self) -> Verdict:
        """Read and decide from the last verdict kept (the caller holds the lock)."""
        settings = self._settings()
        readings = read_readings(self._proc)
        now = self._clock.time()
        state = decide(readings, settings, self._verdict.state, now)
        return Verdict(
            held=state.held,
            since=state.since,
            reasons=state.reasons,
            reason=reason_text(state, readings, settings),
            readings=readings,
            updated_at=now,
            writer=self._writer,
            pid=os.getpid(),
        )

    def hold(self, _now: float) -> str | None:
        """The :data:`dispatcher.cron.hold.Hold` of cron: the reason while held."""
        verdict = self.verdict
        return (verdict.reason or "admission") if verdict.held else None

    def _log_change(self, before: Verdict, after: Verdict, now: float) -> None:
        if after.held:
            log.warning("admission: holding new work: %s; running workers continue", after.reason)
            return
        took = f" after {now - before.since:.0f} s" if before.since is not None else ""
        log.info("admission: taking new work again%s (%s)", took, describe(after.readings))

    def _write(self, now: float) -> None:
        try:
            write_json(self._state_dir / ADMISSION_NAME, self._verdict.to_json())
            self._written = now
        except OSError as err:
            log.error("cannot write %s: %s", ADMISSION_NAME, err)


def describe(readings: Readings) -> str:
    """``memory pressure 3 %, MemAvailable 3.1GiB, cpu pressure 1 %`` (what is known)."""
    from dispatcher.launch.resources import human_size

    parts = []
    if readings.memory_pressure is not None:
        parts.append(f"memory pressure {readings.memory_pressure:.0f} %")
    else:
        parts.append("no PSI")
    if readings.memory_available is not None:
        parts.append(f"MemAvailable {human_size(readings.memory_available)}")
    if readings.cpu_pressure is not None:
        parts.append(f"cpu pressure {readings.cpu_pressure:.0f} %")
    return ", ".join(parts)


class GatewayLike(Protocol):
    """What :func:`admitted` reads of the gateway (its settings follow reloads)."""

    settings: Any
    state_dir: Path
    environ: dict[str, str]
    clock: Clock


def admitted(member: Alone, gateway: GatewayLike) -> Admitted:
    """The gateway's ``member`` with this host's admission applied to its claims."""
    admission = HostAdmission(
        lambda: gateway.settings.admission,
        gateway.state_dir,
        gateway.environ,
        gateway.clock,
        writer="serve",
    )
    return Admitted(member, admission)


class Admitted(Alone):
    """A cluster member (or :class:`Alone`) that claims nothing while admission holds."""

    def __init__(self, inner: Alone, admission: HostAdmission) -> None:
        super().__init__(inner.db_clock, inner.board_poll)
        self.inner = inner
        self.admission = admission
        self._clustered = isinstance(inner, Member)

    def start(self, cron: CronScheduler) -> None:
        self.inner.start(cron)
        self.admission.check()
        cron.set_hold(self.admission.hold, decide=not self._clustered)

    def stop(self) -> None:
        self.inner.stop()

    def down(self) -> bool:
        return self.inner.down()

    def cron_refused(self) -> bool:
        return self.inner.cron_refused()

    def claim_room(self, kanban: KanbanSettings, now: float) -> int | None:
        """0 while admission holds, else what the member allows."""
        if self.admission.check(every=CHECK_EVERY).held:
            return 0
        return self.inner.claim_room(kanban, now)

    def note(self) -> str | None:
        inner = self.inner.note()
        verdict = self.admission.verdict
        if not verdict.held:
            return inner
        held = f"new work held: {verdict.reason}"
        return held if inner is None else f"{inner}; {held}"

    def events(self, cron: CronScheduler | None, waker: CronWaker | None) -> bool:
        """The member's events, and a tick (and a cron wake) when admission lets work in
        again."""
        wanted = self.inner.events(cron, waker)
        was = self.admission.verdict.held
        now = self.admission.check(every=CHECK_EVERY)
        if was and not now.held:
            if cron is not None and waker is not None and waker.running:
                waker.request(cron.clock.time())
            return True
        return wanted
