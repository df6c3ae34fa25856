"""An in-memory :class:`~scope.abc.Scoper` for tests of the packages above scope/.

:class:`FakeScoper` makes the same placement decisions as the real scoper (it calls the real
:func:`scope.placement.decide`) from facts the test sets (``in_teardown_unit``, ``probe_ok``, both
plain attributes that may change at any time), and it really starts processes. No systemd is
involved: a "scoped" launch starts the program in a new session and records a fake unit name
(named like the real ones) for its process group, so :meth:`~FakeScoper.stop` and
:meth:`~FakeScoper.unit_pids` work on that group. A grandchild that calls ``setsid`` itself
leaves the group and is therefore invisible here (a real scope would still hold it).

The gate protocol is honoured for scoped launches of ``gated`` programs (the variable is set and
``b"1"`` is written right after the spawn), as the real D-Bus backend does, so a keeper under test
runs through its gate. :meth:`~FakeScoper.lose_manager_on_next_launch` makes the next scoped launch
raise :class:`~scope.errors.ManagerLost` and flip ``probe_ok`` to False, like a real lost manager.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from scope.abc import (
    CallerKind,
    Decision,
    Facts,
    Launched,
    LaunchSpec,
    Placement,
    Policy,
    ProbeVerdict,
    Scoper,
    Started,
    StopResult,
)
from scope.errors import ManagerLost
from scope.foundation.clock import Clock, SystemClock
from scope.foundation.procstat import group_members, read_stat
from scope.gate import Gate
from scope.hierarchy import Controllers, admit
from scope.placement import decide
from scope.spawn import popen, start_held, start_released
from scope.unitname import scope_name
from scope.warnings import WarnOnce

__all__ = ["FakeScoper"]

BACKEND = "fake"


@dataclass(kw_only=True)
class _FakeUnit:
    """A process group standing in for a scope; ``leader_start`` proves it is still ours."""

    pgid: int
    leader_start: int


@dataclass(kw_only=True)
class _Counters:
    launches: int = 0
    probes: int = 0
    stops: int = 0
    by_placement: dict[str, int] = field(default_factory=dict)


class FakeScoper(Scoper):
    """A scoper without systemd; see the module docstring.

    Counters for assertions: :attr:`launch_count`, :attr:`probe_count`, :attr:`stop_count`,
    :attr:`placements` (placement value → launches), :attr:`launched` (every :class:`Launched`).
    """

    def __init__(
        self,
        *,
        in_teardown_unit: bool = False,
        probe_ok: bool = True,
        policy: Policy | None = None,
        caller_unit: str | None = None,
        probe_detail: str = "the fake probe is set to fail",
        clock: Clock | None = None,
    ) -> None:
        self.in_teardown_unit = in_teardown_unit
        self.probe_ok = probe_ok
        self.policy = policy or Policy()
        self.caller_unit = caller_unit
        self.probe_detail = probe_detail
        self.clock: Clock = clock or SystemClock()
        self.launched: list[Launched] = []
        self.controllers: Controllers | None = None
        """What the fake manager can use for its scopes (None: every controller); a class
        that needs more is refused or, with ``best_effort``, started as the real scoper
        does (:func:`scope.hierarchy.admit`)."""
        self.warnings = WarnOnce()
        self._lose_next = False
        self._units: dict[str, _FakeUnit] = {}
        self._lock = threading.Lock()
        self._counters = _Counters()

    # -- counters ----------------------------------------------------------------------------

    @property
    def launch_count(self) -> int:
        """Launches that started a process."""
        return self._counters.launches

    @property
    def probe_count(self) -> int:
        """Probe verdicts handed out (each decision consults one)."""
        return self._counters.probes

    @property
    def stop_count(self) -> int:
        """Calls of :meth:`stop`."""
        return self._counters.stops

    @property
    def placements(self) -> dict[str, int]:
        """Launches per placement value."""
        return dict(self._counters.by_placement)

    # -- fault injection ---------------------------------------------------------------------

    def lose_manager_on_next_launch(self, lose: bool = True) -> None:
        """Make the next scoped launch fail with ManagerLost (and set ``probe_ok`` False)."""
        self._lose_next = lose

    # -- Scoper ------------------------------------------------------------------------------

    def facts(self) -> Facts:
        """The facts the next decision will use."""
        verdict = self.probe()
        return Facts(
            in_teardown_unit=self.in_teardown_unit,
            caller_unit=self.caller_unit,
            probe_ok=verdict.ok,
            probe_detail=verdict.detail,
            user="tester",
            uid=os.getuid(),
        )

    def probe(self, *, force: bool = False) -> ProbeVerdict:
        with self._lock:
            self._counters.probes += 1
        ok = self.probe_ok
        return ProbeVerdict(
            ok=ok,
            backend=BACKEND if ok else None,
            elapsed_ms=0.0,
            detail="" if ok else self.probe_detail,
            checked_at=self.clock.monotonic(),
        )

    def decide(self, caller: CallerKind, *, wants_isolation: bool = True) -> Decision:
        return decide(self.facts(), caller, self.policy, wants_isolation=wants_isolation)

    def launch(
        self, spec: LaunchSpec, caller: CallerKind, *, wants_isolation: bool = True
    ) -> Launched:
        caller = CallerKind(caller)
        decision = self.decide(caller, wants_isolation=wants_isolation)
        if decision.placement is Placement.SCOPED:
            launched = self._launch_scoped(spec, caller)
        else:
            warning = None
            if decision.warn:
                warning = (
                    f"{caller.value} worker runs degraded: {decision.cause}; {decision.remedy}"
                )
                self.warnings.warn(caller.value, "no restart-safe scope", warning)
            launched = self._launch_unscoped(spec, decision.placement, warning)
        with self._lock:
            self._counters.launches += 1
            key = launched.placement.value
            self._counters.by_placement[key] = self._counters.by_placement.get(key, 0) + 1
            self.launched.append(launched)
        return launched

    @staticmethod
    def _launch_unscoped(spec: LaunchSpec, placement: Placement, warning: str | None) -> Launched:
        if spec.starter is not None and spec.gated:
            started = start_released(spec)
            return Launched(
                process=started.process,
                pid=started.pid,
                start_time=started.start_time,
                placement=placement,
                warning=warning,
            )
        process = popen(spec, spec.argv, spec.env)
        return Launched(process=process, pid=process.pid, placement=placement, warning=warning)

    def _launch_scoped(self, spec: LaunchSpec, caller: CallerKind) -> Launched:
        skipped: tuple[str, ...] = ()
        if self.controllers is not None and spec.resources is not None:
            skipped = admit(
                spec.resources,
                self.controllers,
                caller=caller.value,
                uid=os.getuid(),
                warnings=self.warnings,
            )
        unit = scope_name(caller.value, spec.unit_parts)
        if self._lose_next:
            self._lose_next = False
            self.probe_ok = False
            raise ManagerLost(
                "the fake manager vanished",
                remedy="fix: the next launch follows the 'probe not OK' row",
                unit=unit,
            )
        if not spec.gated:
            process = popen(spec, spec.argv, spec.env, new_session=True)
            started = Started(pid=process.pid, process=process)
            self._note_unit(unit, started)
        else:
            gate = first = Gate.open()
            try:
                # Through the spec's starter when it has one, as the D-Bus backend does.
                started, gate = start_held(spec, spec.argv, gate, new_session=True)
                self._note_unit(unit, started)
                gate.release()
            finally:
                first.close()
                gate.close()
        return Launched(
            process=started.process,
            pid=started.pid,
            start_time=started.start_time,
            placement=Placement.SCOPED,
            unit=unit,
            backend=BACKEND,
            resources=spec.resources,
            ineffective=skipped,
        )

    def _note_unit(self, unit: str, started: Started) -> None:
        """The started process's group stands in for the unit (the keeper leads its own)."""
        start = started.start_time
        if start is None:
            stat = read_stat(started.pid)
            start = stat.start_time if stat is not None else 0
        with self._lock:
            self._units[unit] = _FakeUnit(pgid=started.pid, leader_start=start)

    def unit_pids(self, unit: str) -> list[int] | None:
        with self._lock:
            fake = self._units.get(unit)
        if fake is None:
            return None
        pids = self._members(fake)
        if not pids:
            # A real scope with nothing left is collected (CollectMode=inactive-or-failed).
            with self._lock:
                self._units.pop(unit, None)
            return None
        return pids

    def stop(self, unit: str, *, grace: float) -> StopResult:
        with self._lock:
            self._counters.stops += 1
            fake = self._units.get(unit)
        if fake is None:
            return StopResult(unit=unit, stopped=True)
        sent: str | None = None
        for sig, bound in ((signal.SIGTERM, grace), (signal.SIGKILL, 1.0)):
            if not self._members(fake):
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(fake.pgid, sig)
            sent = sig.name
            deadline = time.monotonic() + max(bound, 0.0)
            # Real processes die in real time; the injected clock is for TTLs, not for this.
            while self._members(fake) and time.monotonic() < deadline:
                time.sleep(0.01)
        survivors = self._members(fake)
        if not survivors:
            with self._lock:
                self._units.pop(unit, None)
        return StopResult(unit=unit, stopped=not survivors, signal=sent, survivors=tuple(survivors))

    def _members(self, fake: _FakeUnit) -> list[int]:
        """Live members of the group, or [] when the group is no longer the one we created."""
        members = group_members(fake.pgid)
        leader = next((m for m in members if m.pid == fake.pgid), None)
        if leader is not None and leader.start_time != fake.leader_start:
            return []  # the pid was reused by a stranger's session: not ours to touch
        if leader is None:
            # Without the leader, only processes started after it can belong to our group.
            members = [m for m in members if m.start_time >= fake.leader_start]
        return sorted(m.pid for m in members)

    def close(self) -> None:
        """Nothing to release; scoped workers are meant to outlive the scoper."""
