"""Starting claimed runs and closing them: kanban's policy over the launch core.

:class:`RunLauncher` hands each claimed run to :class:`~dispatcher.launch.core.LaunchCore`
with the board's side of the launch (:class:`_RunBooks`: record the spawn on the run, close the
run through the taxonomy), and reconciles open runs: a run whose worker finished or vanished
gets its outcome; a run claimed by a dispatcher that died before recording a spawn is reclaimed
(never counted) or attached to the worker that dispatcher did start. What is kanban's own here:
the failure taxonomy (:mod:`dispatcher.kanban.taxonomy`) and the rule that a degraded worker
taken down by its gateway's stop is infrastructure.

A run is reclaimed only when its keeper is confirmed gone (the registry says the session is
final, or nothing was ever started and the claimant, pid + start time + boot id, is dead), so a
card never has two live workers.
"""

from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass, replace

from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.faults import FaultPoint
from dispatcher.kanban.model import Card, CardChange, CardStatus, EventKind, Run
from dispatcher.kanban.report import Closed, Dispatched
from dispatcher.kanban.settings import Assignee, KanbanSettings
from dispatcher.kanban.taxonomy import Breaker, after_run, retry_class
from dispatcher.kanban.worker import WorkerContext, remove_body, spawn_request
from dispatcher.launch.core import LaunchCore, Orphan, Recorded
from dispatcher.launch.outcome import Outcome, Result, outcome_of
from registry.abc import Owner, OwnerKind, Registry, Session, SessionState
from scope.abc import Placement
from scope.foundation.errors import Invalid
from scope.resources import ScopeProperties

__all__ = ["TIMEOUT_SLACK", "Launches", "RunLauncher", "Spawned"]

log = logging.getLogger("dispatch.kanban")

TIMEOUT_SLACK = 30.0
"""Seconds past an assignee's timeout before the dispatcher kills a worker itself. The keeper
enforces timeouts; this only covers a keeper that could not (it is a backstop)."""


def deferred(card: Card, run: Run, result: Result) -> Result:
    """``result`` as ``deferred`` when the run's worker chose its next try (``kanban defer``
    set ``retry_at`` on its running card, which a claim always clears)."""
    mine = card.status is CardStatus.RUNNING and card.current_run_id == run.run_id
    if mine and card.retry_at is not None and not result.infrastructure:
        return replace(result, outcome=Outcome.DEFERRED, error=None)
    return result


@dataclass(frozen=True, kw_only=True)
class Spawned:
    """What starting one claimed run came to."""

    dispatched: Dispatched | None = None
    closed: Closed | None = None
    refused: bool = False
    """``closed`` is a refusal or failure at spawn time (not a worker that already ended)."""


class _RunBooks:
    """The board's side of one run's launch (see :class:`~dispatcher.launch.core.Books`)."""

    def __init__(self, launcher: RunLauncher, run: Run, now: float) -> None:
        self.launcher = launcher
        self.run = run
        self.now = now

    def record(self, session: Session) -> Recorded:
        store = self.launcher.store
        recorded = store.record_spawn(
            self.run.run_id,
            session_id=session.id,
            placement=session.placement.value,
            unit=session.unit,
            now=self.now,
        )
        if recorded:
            return Recorded.RECORDED
        # Else the run was closed (archived, reclaimed) meanwhile, or someone (a reconcile, a
        # finish listener) already recorded this very session.
        current = store.get_run(self.run.run_id)
        return Recorded.ALREADY if current.session_id == session.id else Recorded.CLOSED

    def settle(self, result: Result, session: Session | None) -> Closed | None:
        if session is not None:
            result = self.launcher.interrupted(self.run, session, result)
        return self.launcher.close(self.run, result, self.now)


class RunLauncher:
    """Spawns claimed runs and closes them (see the module docstring)."""

    def __init__(
        self,
        *,
        store: BoardStore,
        registry: Registry,
        settings: KanbanSettings,
        worker: WorkerContext,
        fault: FaultPoint,
    ) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.breaker = Breaker.from_settings(settings)
        self.worker = worker
        self.fault = fault
        self.core = LaunchCore(registry, state_dir=worker.state_dir, log=log, fault=fault.reach)

    # -- spawning ------------------------------------------------------------------------------

    def spawn(self, card: Card, run: Run, now: float) -> Spawned:
        """Prepare, spawn and record one claimed run (may run on a pool thread)."""
        self.fault.reach("claimed")
        assignee = self.settings.assignees[card.assignee]
        resources = self._resources(card, assignee)
        launch = self.core.launch(
            _RunBooks(self, run, now),
            lambda: spawn_request(card, run, assignee, self.worker, resources=resources),
            label=f"card {card.id} run {run.run_id}",
        )
        session = launch.session
        if session is None or launch.stopped:
            return Spawned(closed=launch.settled, refused=launch.failure is not None)
        dispatched = Dispatched(
            card_id=card.id,
            run_id=run.run_id,
            session_id=session.id,
            placement=session.placement.value,
            unit=session.unit,
        )
        if session.state is SessionState.FAILED_START:
            return Spawned(closed=launch.settled, refused=True)
        return Spawned(dispatched=dispatched, closed=launch.settled)

    def _resources(self, card: Card, assignee: Assignee) -> ScopeProperties:
        """The assignee's class, under the class a retry rule chose for this try (the events
        are read only when the card's policy has such a rule)."""
        if all(rule.resources is None for rule in self.breaker.policy(card.assignee).rules):
            return assignee.resources
        chosen = retry_class(self.store.events_of(card.id))
        if chosen is None:
            return assignee.resources
        try:
            return chosen.over(assignee.resources)
        except Invalid as err:
            # Chosen under an older config whose classes fit together; this one's do not.
            log.warning("card %s: the retry rule's class no longer fits: %s", card.id, err)
            return assignee.resources

    # -- closing -------------------------------------------------------------------------------

    def close(self, run: Run, result: Result, now: float) -> Closed | None:
        """Close ``run`` with ``result`` through the taxonomy (None: closed already)."""

        def decide(card: Card, current: Run) -> CardChange:
            return after_run(card, current, result, self.breaker, now)

        result = deferred(self.store.get_card(run.card_id), run, result)
        outbox = self.store.outbox
        if outbox is not None and result.output is None:
            # Read here, before close_run's transaction: no lock is held while a log is read.
            result = replace(result, output=outbox.tail(self.registry, result.session_id))

        done = self.store.close_run(run.run_id, result, decide, now=now)
        if done is None:
            return None
        remove_body(self.worker.state_dir, run.run_id)
        closed_run, card = done
        return Closed(
            card_id=card.id,
            run_id=closed_run.run_id,
            outcome=result.outcome,
            status=card.status.value,
            error=result.error,
            infrastructure=result.infrastructure,
        )

    def close_from_session(self, run: Run, session: Session, now: float) -> Closed | None:
        """Close ``run`` with what its finished worker came to."""
        return self.close(run, self.interrupted(run, session, outcome_of(session)), now)

    def interrupted(self, run: Run, session: Session, result: Result) -> Result:
        """``result``, marked infrastructure when a degraded worker died with its gateway's
        unit (the gateway noted the stop beforehand): not the card's fault, not counted."""
        if (
            result.outcome in (Outcome.FAILED, Outcome.LOST)
            and session.placement is Placement.DEGRADED
            and session.exit_code is None
            and self._noted_interrupted(run)
        ):
            return replace(
                result,
                infrastructure=True,
                error=f"{result.error or 'ended'}: the gateway stopped and its unit took this "
                "degraded (unscoped) worker with it; not counted",
            )
        return result

    def _noted_interrupted(self, run: Run) -> bool:
        return any(
            event.kind == EventKind.INTERRUPTED and event.run_id == run.run_id
            for event in self.store.events_of(run.card_id)
        )

    # -- reconcile -----------------------------------------------------------------------------

    def reconcile(self, now: float, *, adopt: bool) -> list[Closed]:
        """Close every open run whose worker is confirmed finished or never started."""
        runs = self.store.open_runs()
        if not runs:
            return []
        if adopt:
            self.registry.adopt()
        closed = [self._reconcile_run(run, now) for run in runs]
        return [done for done in closed if done is not None]

    def _reconcile_run(self, run: Run, now: float) -> Closed | None:
        if run.session_id is None:
            owner = Owner(kind=OwnerKind.KANBAN, id=run.run_id)
            verdict, found = self.core.orphan(owner, run.claimant)
            if verdict is Orphan.WAIT:
                # Its claimant may still be spawning: never reclaim on a guess, and never record
                # its session from here either (mid-launch the registry's row is only a draft).
                return None
            if found is None:
                reclaimed = Result(
                    outcome=Outcome.RECLAIMED,
                    error="the dispatcher that claimed this run stopped before starting a worker",
                )
                return self.close(run, reclaimed, now)
            self.store.record_spawn(
                run.run_id,
                session_id=found.id,
                placement=found.placement.value,
                unit=found.unit,
                now=now,
            )
            session: Session | Result = found
        else:
            session = self.core.session(run.session_id)
        if isinstance(session, Result):
            return self.close(run, session, now)
        if not session.finished:
            session = self._enforce_timeout(run, session, now)
            if not session.finished:
                return None
        return self.close_from_session(run, session, now)

    def _enforce_timeout(self, run: Run, session: Session, now: float) -> Session:
        """The session, killed as ``timed_out`` when it is well past its timeout."""
        timeout = session.timeout
        started = run.started_at or run.claimed_at
        if timeout is None or now < started + timeout + TIMEOUT_SLACK:
            return session
        log.warning("run %s outlived its timeout; killing session %s", run.run_id, session.id)
        killed = self.core.kill(
            session.id, f"timed out after {timeout:g}s", state=SessionState.TIMED_OUT
        )
        return killed or session


class Launches:
    """Spawns of one tick, up to ``kanban.spawn_concurrency`` at a time.

    Claims stay sequential (in priority order, budgets checked per claim); each start waits
    for its keeper, so starts overlap on a small pool. Results come back in claim order."""

    def __init__(self, launcher: RunLauncher, now: float) -> None:
        self.launcher = launcher
        self.now = now
        self.limit = launcher.settings.spawn_concurrency
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.started: list[concurrent.futures.Future[Spawned] | Spawned] = []

    def start(self, card: Card, run: Run) -> None:
        """Start ``run`` now (inline when the limit is 1) or on the pool."""
        if self.limit <= 1:
            self.started.append(self.launcher.spawn(card, run, self.now))
            return
        if self.pool is None:
            self.pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.limit, thread_name_prefix="kanban-spawn"
            )
        self.started.append(self.pool.submit(self.launcher.spawn, card, run, self.now))

    def results(self) -> list[Spawned]:
        """Wait for every start; their results in claim order."""
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        return [
            item.result() if isinstance(item, concurrent.futures.Future) else item
            for item in self.started
        ]

    def abandon(self) -> None:
        """The claim loop failed: wait for the starts already submitted, ignore their results
        (the loop's error is what the caller sees)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True)
