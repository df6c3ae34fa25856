"""The probe verdict cache: "can a scope be made right now?", asked at most once per TTL.

The check itself (placing a real no-op through the backend real spawns use) is handed in as a
callable, so this module is only about time and threads:

* both verdicts (up and down) are cached for ``ttl`` seconds of the injected clock;
* one check in flight at a time: concurrent callers wait for its verdict instead of piling up;
* a check that only timed out is retried once with the longer ``retry_timeout`` before "down"
  is cached (a slow manager under load is not a missing one);
* :meth:`Probe.mark_down` flips the cached verdict at once (a scoped spawn just found the manager
  gone), so the next spawn follows the "probe not OK" row without waiting for the TTL.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from scope.abc import ProbeVerdict
from scope.foundation.clock import Clock, SystemClock

__all__ = ["Probe"]

Check = Callable[[float], ProbeVerdict]
"""Runs one probe bounded by the given seconds; never raises (a failure is a verdict)."""


class Probe:
    """A TTL cache with single flight around a :data:`Check` (see the module docstring)."""

    def __init__(
        self,
        check: Check,
        *,
        ttl: float,
        timeout: float,
        retry_timeout: float,
        clock: Clock | None = None,
        on_change: Callable[[ProbeVerdict | None, ProbeVerdict], None] | None = None,
    ) -> None:
        self._check = check
        self.ttl = ttl
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.clock: Clock = clock or SystemClock()
        self._on_change = on_change
        self._cond = threading.Condition()
        self._verdict: ProbeVerdict | None = None
        self._in_flight = False
        self._generation = 0
        self.runs = 0
        """How many checks actually ran (a retry counts)."""

    def cached(self) -> ProbeVerdict | None:
        """The last verdict, fresh or not, without probing."""
        with self._cond:
            return self._verdict

    def _fresh(self, now: float) -> bool:
        verdict = self._verdict
        return verdict is not None and now - verdict.checked_at < self.ttl

    def verdict(self, *, force: bool = False) -> ProbeVerdict:
        """The cached verdict while fresh, else a new one; ``force`` skips the cache (but joins a
        check already in flight rather than starting a second one)."""
        with self._cond:
            if not force and self._fresh(self.clock.monotonic()) and self._verdict is not None:
                return self._verdict
            if self._in_flight:
                generation = self._generation
                # The running check is bounded by timeout + retry_timeout; wait a little longer.
                bound = self.timeout + self.retry_timeout + 5.0
                self._cond.wait_for(lambda: self._generation != generation, timeout=bound)
                if self._verdict is not None and self._generation != generation:
                    return self._verdict
            self._in_flight = True
        try:
            verdict = self._run()
        except BaseException:
            with self._cond:
                self._in_flight = False
                self._cond.notify_all()
            raise
        return self._store(verdict)

    def _run(self) -> ProbeVerdict:
        self.runs += 1
        verdict = self._check(self.timeout)
        if not verdict.ok and verdict.timed_out:
            self.runs += 1
            verdict = self._check(self.retry_timeout)
        return verdict

    def _store(self, verdict: ProbeVerdict) -> ProbeVerdict:
        with self._cond:
            previous = self._verdict
            verdict = dataclasses.replace(verdict, checked_at=self.clock.monotonic())
            self._verdict = verdict
            self._in_flight = False
            self._generation += 1
            self._cond.notify_all()
        if self._on_change is not None and (previous is None or previous.ok != verdict.ok):
            self._on_change(previous, verdict)
        return verdict

    def mark_down(self, detail: str, *, backend: str | None = None) -> ProbeVerdict:
        """Cache "down" now (see the module docstring); the TTL starts from now."""
        with self._cond:
            previous = self._verdict
            verdict = ProbeVerdict(
                ok=False,
                backend=backend,
                elapsed_ms=0.0,
                detail=detail,
                checked_at=self.clock.monotonic(),
            )
            # A check in flight keeps running and will overwrite this with what it finds.
            self._verdict = verdict
            self._generation += 1
            self._cond.notify_all()
        if self._on_change is not None and (previous is None or previous.ok):
            self._on_change(previous, verdict)
        return verdict
