"""The launch life cycle shared by cron and kanban: spawn → record → settle, and recovery.

A policy (the kanban dispatcher, the cron fire runner) claims something in its own store and
then hands the launch to :class:`LaunchCore` together with its :class:`Books`, the two writes
only the policy knows how to make:

* ``record(session)``: store that this claim now has this worker (a compare-and-set on the
  claim). :attr:`Recorded.CLOSED` means the claim was closed meanwhile (archived, replaced,
  rescued): the worker must not outlive that decision, so the core stops it at once.
* ``settle(result, session)``: close the claim with a result (a compare-and-set too; a claim
  settled by somebody else first is left alone).

The core prepares the request (errors classified by
:func:`~dispatcher.launch.failure.classify_spawn_error`), refuses to start while the state dir
is nearly full, spawns with the one bounded retry a lost manager gets, records, and settles at
once a worker that was already over when its spawn returned. For recovery it answers the two
questions every reconcile asks: is a recorded session still known (:meth:`LaunchCore.session`),
and what became of a claim whose claimant may be gone (:meth:`LaunchCore.orphan`).
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from dispatcher.launch.claimant import Claimant
from dispatcher.launch.failure import SpawnFailure, classify_spawn_error, host_out_of_space
from dispatcher.launch.outcome import Outcome, Result, outcome_of
from registry.abc import Owner, Registry, Session, SessionState, SpawnRequest
from registry.store.database import space_problem
from scope.foundation.errors import DispatchError, NotFoundError

__all__ = ["Books", "Launch", "LaunchCore", "Orphan", "Recorded"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Recorded(enum.Enum):
    """What :meth:`Books.record` did."""

    RECORDED = "recorded"
    """This call stored the session on the claim."""
    ALREADY = "already"
    """Somebody (a reconcile, a finish listener) already stored this very session."""
    CLOSED = "closed"
    """The claim was closed while its worker started: the worker must be stopped."""


class Books(Protocol[T_co]):
    """A policy's record of one claimed launch (see the module docstring)."""

    def record(self, session: Session) -> Recorded:
        """Store ``session`` as the claim's worker (compare-and-set on the claim)."""
        ...

    def settle(self, result: Result, session: Session | None) -> T_co | None:
        """Close the claim with ``result`` (``session``: the worker, when one started);
        None when somebody else settled it first."""
        ...


@dataclass(frozen=True, kw_only=True)
class Launch(Generic[T]):
    """What one launch came to."""

    session: Session | None = None
    """The worker (recorded on the claim), or None when nothing started."""
    settled: T | None = None
    """What :meth:`Books.settle` returned when the launch ended at once (a failed spawn, or a
    worker already over when its spawn returned)."""
    failure: SpawnFailure | None = None
    """The spawn failed before any worker ran."""
    stopped: bool = False
    """The claim was closed while the worker started; the worker was stopped."""


class Orphan(enum.Enum):
    """What became of a claim whose worker was never recorded."""

    WAIT = "wait"
    """Its claimant still runs (it may still be spawning): never decide on a guess."""
    ATTACH = "attach"
    """Its claimant is gone but a worker of it exists: record that worker."""
    GONE = "gone"
    """Its claimant is gone and no keeper ever started: nothing runs for this claim."""


class LaunchCore:
    """Spawn, record and settle for one policy (see the module docstring).

    ``fault`` is called with ``"prepared"``, ``"spawned"`` and ``"recorded"`` as the launch
    passes those points (crash tests stop the process there); ``log`` is the policy's logger.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        state_dir: Path,
        log: logging.Logger,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        self.registry = registry
        self.state_dir = Path(state_dir)
        self.log = log
        self.fault = fault or (lambda point: None)

    def launch(
        self, books: Books[T], prepare: Callable[[], SpawnRequest], *, label: str
    ) -> Launch[T]:
        """Prepare, spawn, record and (for a worker already over) settle one claim."""
        try:
            request = prepare()
        except Exception as err:  # classified: a bad definition or a bug is recorded, not raised
            return self._failed(books, self._classified(err, label), label)
        self.fault("prepared")
        problem = space_problem(self.state_dir)
        if problem is not None:
            return self._failed(books, host_out_of_space(problem), label)
        spawned = self.spawn(request, label=label)
        if isinstance(spawned, SpawnFailure):
            return self._failed(books, spawned, label)
        self.fault("spawned")
        if books.record(spawned) is Recorded.CLOSED:
            self.log.warning("%s closed while starting; stopping session %s", label, spawned.id)
            self.kill(spawned.id, f"{label} was closed before its spawn was recorded")
            return Launch(session=spawned, stopped=True)
        self.fault("recorded")
        self.log.info(
            "%s: session %s (%s%s)",
            label,
            spawned.id,
            spawned.placement.value,
            f", {spawned.unit}" if spawned.unit else "",
        )
        fresh = self.fresh(spawned)
        if not fresh.finished:
            return Launch(session=fresh)
        return Launch(session=fresh, settled=books.settle(outcome_of(fresh), fresh))

    def spawn(self, request: SpawnRequest, *, label: str) -> Session | SpawnFailure:
        """Spawn through the registry with the one retry a lost manager gets."""
        for attempt in (1, 2):
            try:
                return self.registry.spawn(request)
            except Exception as err:  # classified below; never escapes as a crash
                failure = self._classified(err, label)
            if not failure.retry:
                return failure
            if attempt == 1:
                self.log.warning("%s: %s; retrying once", label, failure.error)
                continue
            return replace(failure, error=f"{failure.error} (after one retry)")
        raise AssertionError("unreachable")  # pragma: no cover

    def _classified(self, err: Exception, label: str) -> SpawnFailure:
        failure = classify_spawn_error(err)
        if failure.unexpected:
            self.log.error("%s: spawn failed unexpectedly", label, exc_info=err)
        return failure

    def _failed(self, books: Books[T], failure: SpawnFailure, label: str) -> Launch[T]:
        self.log.warning("%s: %s: %s", label, failure.outcome.value, failure.error)
        return Launch(failure=failure, settled=books.settle(failure.result(), None))

    # -- recovery ------------------------------------------------------------------------------

    def session(self, session_id: str) -> Session | Result:
        """The recorded session, or the ``lost`` result when the registry no longer knows it."""
        try:
            return self.registry.get(session_id)
        except NotFoundError:
            return Result(
                outcome=Outcome.LOST,
                error=f"session {session_id} is no longer known to the registry",
                session_id=session_id,
            )

    def orphan(self, owner: Owner, claimant: Claimant | None) -> tuple[Orphan, Session | None]:
        """What became of a claim of ``owner`` with no recorded worker (see :class:`Orphan`).

        A session without a keeper is only the registry's draft of a launch that never got
        that far (a held keeper exits when its launcher's gate closes): nothing runs."""
        if claimant is not None and claimant.alive():
            return Orphan.WAIT, None
        session = self.registry.find(owner)
        if session is None or session.keeper_pid is None:
            return Orphan.GONE, None
        return Orphan.ATTACH, session

    def fresh(self, session: Session) -> Session:
        """The session as the registry knows it now (the given one when it is gone)."""
        try:
            return self.registry.get(session.id)
        except NotFoundError:
            return session

    def kill(
        self, session_id: str, reason: str, state: SessionState = SessionState.KILLED
    ) -> Session | None:
        """Stop a worker (killing one already gone is fine); its final session, if known."""
        try:
            return self.registry.kill(session_id, state=state, reason=reason).session
        except NotFoundError:
            return None
        except (DispatchError, OSError) as err:
            self.log.warning("could not stop session %s: %s", session_id, err)
            with contextlib.suppress(NotFoundError):
                return self.registry.get(session_id)
            return None
