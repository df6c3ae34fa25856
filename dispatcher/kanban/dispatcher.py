"""The kanban dispatcher: one :meth:`KanbanDispatcher.tick` step, driven with an explicit time.

A tick reconciles first (runs whose keeper wrote an exit record or vanished get their outcome;
runs claimed by a dispatcher that died before recording a spawn are reclaimed), promotes
``todo`` cards whose parents are done and transient blocks that ended, then, unless claiming is
paused, walks the ``ready`` cards by priority then age: back-off and cooldown are honoured (a
successful probe ends a cooldown at once), both budgets are checked inside the claim
transaction, and each claimed card is placed and spawned through the registry.

A run is reclaimed only when its keeper is confirmed gone (the registry says the session is
final, or nothing was ever spawned and the claiming process, identified by pid + start time, is
dead), so a card never has two live workers. The gateway calls :meth:`tick` when woken; ``dispatch
kanban tick`` calls it once (caller kind ``oneshot``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from dispatcher.kanban.abc import BoardStore, ClaimVerdict
from dispatcher.kanban.claimer import claimer_alive, current_claimer
from dispatcher.kanban.faults import FaultPoint
from dispatcher.kanban.model import (
    Card,
    CardChange,
    EventKind,
    Limits,
    Run,
    RunOutcome,
    RunResult,
)
from dispatcher.kanban.report import Closed, Dispatched, TickReport
from dispatcher.kanban.settings import KanbanSettings
from dispatcher.kanban.taxonomy import Breaker, after_run, result_from_session
from dispatcher.kanban.worker import (
    WorkerContext,
    WorkerSetupError,
    remove_body,
    spawn_request,
)
from registry.abc import Owner, Registry, Session, SessionState
from registry.errors import SpawnRefused
from registry.state import space_problem
from scope.abc import CallerKind, Placement, Scoper
from scope.errors import ManagerLost, ScopeUnavailable
from scope.foundation.errors import DispatchError, NotFoundError

log = logging.getLogger("dispatch.kanban")

HOST_LIMITS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})
"""errno values of a spawn that failed for lack of host resources (infrastructure)."""

TIMEOUT_SLACK = 30.0
"""Seconds past an assignee's timeout before the dispatcher kills a worker itself. The keeper
enforces timeouts; this only covers a keeper that could not (it is a backstop)."""

DEGRADED_WARNING = (
    "kanban workers were started degraded (no restart-safe scope): they die when the caller's "
    "unit stops; set KillMode=process on that unit, or make scopes work (loginctl enable-linger "
    "$USER; export XDG_RUNTIME_DIR and DBUS_SESSION_BUS_ADDRESS into the unit)"
)


@dataclass
class _Pass:
    """Mutable bookkeeping of one tick."""

    now: float
    reconciled: list[Closed] = field(default_factory=list)
    dispatched: list[Dispatched] = field(default_factory=list)
    refused: list[Closed] = field(default_factory=list)
    planned: list[str] = field(default_factory=list)
    guarded: list[str] = field(default_factory=list)
    backing_off: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    probe_ok: bool | None = None


@dataclass(frozen=True, kw_only=True)
class _Spawned:
    """What starting one claimed run came to."""

    dispatched: Dispatched | None = None
    closed: Closed | None = None
    refused: bool = False
    """``closed`` is a refusal or failure at spawn time (not a worker that already ended)."""


class _Launches:
    """Spawns of one tick, up to ``kanban.spawn_concurrency`` at a time.

    Claims stay sequential (in priority order, budgets checked per claim); each start waits
    for its keeper, so starts overlap on a small pool. Results are merged in claim order."""

    def __init__(self, dispatcher: KanbanDispatcher, work: _Pass) -> None:
        self.dispatcher = dispatcher
        self.work = work
        self.limit = dispatcher.settings.spawn_concurrency
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.started: list[concurrent.futures.Future[_Spawned] | _Spawned] = []

    def start(self, card: Card, run: Run) -> None:
        """Start ``run`` now (inline when the limit is 1) or on the pool."""
        if self.limit <= 1:
            self.started.append(self.dispatcher._spawn(card, run, self.work.now))
            return
        if self.pool is None:
            self.pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.limit, thread_name_prefix="kanban-spawn"
            )
        self.started.append(self.pool.submit(self.dispatcher._spawn, card, run, self.work.now))

    def __enter__(self) -> _Launches:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        if exc_type is not None:
            return  # the claim loop failed: let its error through, not a spawn's
        for item in self.started:
            spawned = item.result() if isinstance(item, concurrent.futures.Future) else item
            if spawned.dispatched is not None:
                self.work.dispatched.append(spawned.dispatched)
            if spawned.closed is not None:
                target = self.work.refused if spawned.refused else self.work.reconciled
                target.append(spawned.closed)


class KanbanDispatcher:
    """Reconcile, promote, budget, claim, place and spawn (see the module docstring).

    ``caller`` is :attr:`CallerKind.KANBAN` in the gateway and :attr:`CallerKind.ONESHOT` for
    ``dispatch kanban tick``. ``adopt`` makes every reconcile call ``registry.adopt()`` first,
    which a process without a follower thread (any CLI command) needs to see keepers that
    finished meanwhile; the gateway, whose registry follows its sessions, passes False.
    ``scoper`` (optional) answers the probe that ends an infrastructure cooldown early.
    """

    def __init__(
        self,
        *,
        store: BoardStore,
        registry: Registry,
        settings: KanbanSettings,
        state_dir: Path,
        caller: CallerKind = CallerKind.KANBAN,
        config_path: Path | None = None,
        environ: Mapping[str, str] | None = None,
        scoper: Scoper | None = None,
        adopt: bool = True,
        fault: FaultPoint | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.breaker = Breaker.from_settings(settings)
        self.scoper = scoper
        self.adopt = adopt
        self.fault = fault or FaultPoint()
        self.worker = WorkerContext(
            state_dir=Path(state_dir),
            config_path=config_path,
            environ=dict(environ or {}),
            caller=caller,
        )
        self._claimer = current_claimer()

    # -- the tick ----------------------------------------------------------------------------

    def tick(
        self, now: float, *, max_claims: int | None = None, dry_run: bool = False
    ) -> TickReport:
        """One pass at time ``now`` (epoch seconds). ``max_claims`` caps the claims of this
        pass; ``dry_run`` reports what would be claimed and changes nothing at all."""
        work = _Pass(now=now)
        promoted: list[str] = []
        if not dry_run:
            work.reconciled = self.reconcile(now)
            promoted = [card_id for card_id, _ in self.store.promote(now=now)]
        paused = self.store.paused()
        full = None if dry_run else space_problem(self.worker.state_dir)
        if full is not None:  # a claim would fail half-way (or count against the card)
            work.warnings.append(full)
        elif not paused:
            self._claim_ready(work, max_claims, dry_run)
        if any(d.placement == Placement.DEGRADED.value for d in work.dispatched):
            work.warnings.append(DEGRADED_WARNING)
        return TickReport(
            now=now,
            paused=paused,
            dry_run=dry_run,
            reconciled=tuple(work.reconciled),
            promoted=tuple(promoted),
            dispatched=tuple(work.dispatched),
            refused=tuple(work.refused),
            planned=tuple(work.planned),
            guarded=tuple(work.guarded),
            backing_off=tuple(work.backing_off),
            deferred=tuple(work.deferred),
            unknown_assignee=tuple(work.unknown),
            warnings=tuple(work.warnings),
            board_version=self.store.board_version(),
        )

    def _claim_ready(self, work: _Pass, max_claims: int | None, dry_run: bool) -> None:
        with _Launches(self, work) as launches:
            self._walk_ready(work, max_claims, dry_run, launches)

    def _walk_ready(
        self, work: _Pass, max_claims: int | None, dry_run: bool, launches: _Launches
    ) -> None:
        settings = self.settings
        budget_full = False
        full_assignees: set[str] = set()
        claims = 0
        open_total, open_by_assignee = self._open_counts() if dry_run else (0, {})
        for card in self.store.ready_cards():
            assignee = settings.assignees.get(card.assignee)
            if assignee is None:
                work.unknown.append(card.id)
                if not card.assignee_noted and not dry_run:
                    self._note_unknown_assignee(card, work.now)
                continue
            if card.retry_at is not None and card.retry_at > work.now:
                work.backing_off.append(card.id)
                continue
            ignore_cooldown = False
            if card.cooldown_until is not None and card.cooldown_until > work.now:
                if not self._probe_ok(work):
                    work.guarded.append(card.id)
                    if not dry_run:
                        self._guard(card, work.now)
                    continue
                ignore_cooldown = True
            if (
                budget_full
                or card.assignee in full_assignees
                or (max_claims is not None and claims >= max_claims)
            ):
                work.deferred.append(card.id)
                continue
            if dry_run:
                mine = open_by_assignee.get(card.assignee, 0)
                if open_total >= settings.max_in_progress:
                    budget_full = True
                elif assignee.max_in_progress is not None and mine >= assignee.max_in_progress:
                    full_assignees.add(card.assignee)
                else:
                    work.planned.append(card.id)
                    open_total += 1
                    open_by_assignee[card.assignee] = mine + 1
                    claims += 1
                    continue
                work.deferred.append(card.id)
                continue
            if ignore_cooldown:
                self.store.append_event(
                    card.id,
                    EventKind.COOLDOWN_ENDED,
                    {"reason": "the scope probe succeeded"},
                    now=work.now,
                    fields={"cooldown_until": None},
                )
            claim = self.store.claim(
                card.id,
                now=work.now,
                claimer=self._claimer,
                limits=Limits(
                    max_in_progress=settings.max_in_progress,
                    assignee_max=assignee.max_in_progress,
                ),
                ignore_cooldown=ignore_cooldown,
            )
            if claim.verdict is ClaimVerdict.CLAIMED and claim.run is not None:
                claims += 1
                launches.start(card, claim.run)
            elif claim.verdict is ClaimVerdict.BUDGET:
                budget_full = True
                work.deferred.append(card.id)
            elif claim.verdict is ClaimVerdict.ASSIGNEE_BUDGET:
                full_assignees.add(card.assignee)
                work.deferred.append(card.id)
            elif claim.verdict is ClaimVerdict.PAUSED:
                return

    def _open_counts(self) -> tuple[int, dict[str, int]]:
        runs = self.store.open_runs()
        by_assignee: dict[str, int] = {}
        for run in runs:
            try:
                assignee = self.store.get_card(run.card_id).assignee
            except NotFoundError:
                continue
            by_assignee[assignee] = by_assignee.get(assignee, 0) + 1
        return len(runs), by_assignee

    def _probe_ok(self, work: _Pass) -> bool:
        """Whether scoping works right now (at most one real probe per tick).

        Forced: a cached "down" verdict may be up to ``scope.probe_ttl`` old, and the point is
        to notice at once that the manager is back. Only asked while a card is cooling down."""
        if work.probe_ok is None:
            work.probe_ok = False
            if self.scoper is not None:
                try:
                    work.probe_ok = bool(self.scoper.probe(force=True).ok)
                except DispatchError as err:
                    log.info("scope probe failed: %s", err)
        return work.probe_ok

    def _guard(self, card: Card, now: float) -> None:
        self.store.append_event(
            card.id,
            EventKind.RESPAWN_GUARDED,
            {"cooldown_until": card.cooldown_until, "last_error": card.last_failure_error},
            now=now,
        )

    def _note_unknown_assignee(self, card: Card, now: float) -> None:
        known = ", ".join(sorted(self.settings.assignees)) or "none configured"
        self.store.append_event(
            card.id,
            EventKind.ASSIGNEE_UNKNOWN,
            {
                "assignee": card.assignee,
                "message": f"assignee {card.assignee!r} is not in kanban.assignees "
                f"(known: {known}); the card is not spawned until it is configured or edited",
            },
            now=now,
            fields={"assignee_noted": True},
        )

    # -- spawning ----------------------------------------------------------------------------

    def _spawn(self, card: Card, run: Run, now: float) -> _Spawned:
        """Prepare, spawn and record one claimed run (may run on a pool thread)."""
        self.fault.reach("claimed")
        assignee = self.settings.assignees[card.assignee]
        try:
            request = spawn_request(card, run, assignee, self.worker)
        except WorkerSetupError as err:
            return self._close_at_spawn(run, now, RunOutcome.CONFIG_ERROR, err.message)
        except OSError as err:
            return self._close_at_spawn(
                run, now, RunOutcome.FAILED_START, f"cannot write the card body file: {err}"
            )
        self.fault.reach("prepared")
        try:
            session = self.registry.spawn(request)
        except (ScopeUnavailable, ManagerLost) as err:
            return self._close_at_spawn(
                run, now, RunOutcome.SPAWN_REFUSED, err.message, infrastructure=True
            )
        except SpawnRefused as err:
            return self._close_at_spawn(run, now, RunOutcome.CONFIG_ERROR, err.message)
        except DispatchError as err:
            return self._close_at_spawn(run, now, RunOutcome.FAILED_START, err.message)
        except OSError as err:
            if err.errno in HOST_LIMITS:
                # The host, not the card: out of descriptors, processes or memory. Infrastructure
                # (never counted, retried after the cooldown), like a refused placement.
                return self._close_at_spawn(
                    run,
                    now,
                    RunOutcome.SPAWN_REFUSED,
                    f"the host ran out of resources: {err.strerror or err}",
                    infrastructure=True,
                )
            log.exception("card %s run %s: spawn failed unexpectedly", card.id, run.run_id)
            return self._close_at_spawn(run, now, RunOutcome.FAILED_START, str(err))
        except Exception as err:
            # A bug below us must not leave the run open under a live claimer for good.
            log.exception("card %s run %s: spawn failed unexpectedly", card.id, run.run_id)
            return self._close_at_spawn(
                run, now, RunOutcome.FAILED_START, f"{type(err).__name__}: {err}"
            )
        self.fault.reach("spawned")
        recorded = self.store.record_spawn(
            run.run_id,
            session_id=session.id,
            placement=session.placement.value,
            unit=session.unit,
            now=now,
        )
        if not recorded:
            current = self.store.get_run(run.run_id)
            if current.session_id != session.id:
                # The run was closed (archived, reclaimed) while we were spawning: the worker
                # must not run for a card that no longer wants it.
                log.warning(
                    "run %s closed during its spawn; stopping session %s", run.run_id, session.id
                )
                self._kill(session.id, "its kanban run was closed before the spawn was recorded")
                return _Spawned()
            # Else someone (a reconcile, a finish listener) already recorded this very session.
        self.fault.reach("recorded")
        log.info(
            "card %s run %s: session %s (%s%s)",
            card.id,
            run.run_id,
            session.id,
            session.placement.value,
            f", {session.unit}" if session.unit else "",
        )
        dispatched = Dispatched(
            card_id=card.id,
            run_id=run.run_id,
            session_id=session.id,
            placement=session.placement.value,
            unit=session.unit,
        )
        if not session.finished:
            return _Spawned(dispatched=dispatched)
        # A worker that could not start (or was that quick) is final at once.
        sink: list[Closed] = []
        self._close_from_session(run, session, now, sink)
        closed = sink[0] if sink else None
        if session.state is SessionState.FAILED_START:
            return _Spawned(closed=closed, refused=True)
        return _Spawned(dispatched=dispatched, closed=closed)

    def _close_at_spawn(
        self,
        run: Run,
        now: float,
        outcome: RunOutcome,
        error: str,
        *,
        infrastructure: bool = False,
    ) -> _Spawned:
        result = RunResult(outcome=outcome, error=error, infrastructure=infrastructure)
        closed = self._close(run, result, now)
        log.warning("card %s run %s: %s: %s", run.card_id, run.run_id, outcome.value, error)
        return _Spawned(closed=closed, refused=True)

    def _kill(
        self, session_id: str, reason: str, state: SessionState = SessionState.KILLED
    ) -> None:
        with contextlib.suppress(NotFoundError):
            self.registry.kill(session_id, state=state, reason=reason)

    # -- reconcile ---------------------------------------------------------------------------

    def reconcile(self, now: float) -> list[Closed]:
        """Close every open run whose worker is confirmed finished or never started."""
        runs = self.store.open_runs()
        if not runs:
            return []
        if self.adopt:
            self.registry.adopt()
        closed: list[Closed] = []
        for run in runs:
            self._reconcile_run(run, now, closed)
        return closed

    def _reconcile_run(self, run: Run, now: float, closed: list[Closed]) -> None:
        if run.session_id is None:
            if claimer_alive(run.claimer_pid, run.claimer_start):
                # Its claimer may still be spawning: never reclaim on a guess, and never record
                # its session from here either (mid-launch the registry's row is only a draft,
                # e.g. its placement is not known yet); the claimer records it.
                return
            session = self._find_session(run)
            if session is None or session.keeper_pid is None:
                # No session, or only the registry's draft of one: the claimer died before
                # a keeper was started (a held keeper exits when its launcher's gate closes).
                result = RunResult(
                    outcome=RunOutcome.RECLAIMED,
                    error="the dispatcher that claimed this run stopped before starting a worker",
                )
                done = self._close(run, result, now)
                if done is not None:
                    closed.append(done)
                return
            self.store.record_spawn(
                run.run_id,
                session_id=session.id,
                placement=session.placement.value,
                unit=session.unit,
                now=now,
            )
        else:
            try:
                session = self.registry.get(run.session_id)
            except NotFoundError:
                result = RunResult(
                    outcome=RunOutcome.LOST,
                    error=f"session {run.session_id} is no longer known to the registry",
                    session_id=run.session_id,
                )
                done = self._close(run, result, now)
                if done is not None:
                    closed.append(done)
                return
        if not session.finished:
            session = self._enforce_timeout(run, session, now)
            if not session.finished:
                return
        self._close_from_session(run, session, now, closed)

    def _find_session(self, run: Run) -> Session | None:
        owner = Owner(kind="kanban", id=run.run_id)
        for session in self.registry.list_sessions(include_finished=True):
            if session.owner == owner:
                return session
        return None

    def _enforce_timeout(self, run: Run, session: Session, now: float) -> Session:
        """The session, killed as ``timed_out`` when it is well past its timeout."""
        timeout = session.timeout
        started = run.started_at or run.claimed_at
        if timeout is None or now < started + timeout + TIMEOUT_SLACK:
            return session
        log.warning("run %s outlived its timeout; killing session %s", run.run_id, session.id)
        try:
            snapshot = self.registry.kill(
                session.id, state=SessionState.TIMED_OUT, reason=f"timed out after {timeout:g}s"
            )
        except NotFoundError:
            return session
        return snapshot.session

    def _close_from_session(
        self, run: Run, session: Session, now: float, sink: list[Closed]
    ) -> None:
        result = result_from_session(session)
        if (
            result.outcome in (RunOutcome.FAILED, RunOutcome.LOST)
            and session.placement is Placement.DEGRADED
            and session.exit_code is None
            and self._interrupted(run)
        ):
            result = replace(
                result,
                infrastructure=True,
                error=f"{result.error or 'ended'}: the gateway stopped and its unit took this "
                "degraded (unscoped) worker with it; not counted",
            )
        done = self._close(run, result, now)
        if done is not None:
            sink.append(done)

    def _close(self, run: Run, result: RunResult, now: float) -> Closed | None:
        def decide(card: Card, current: Run) -> CardChange:
            return after_run(card, current, result, self.breaker, now)

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

    def _interrupted(self, run: Run) -> bool:
        return any(
            event.kind == EventKind.INTERRUPTED and event.run_id == run.run_id
            for event in self.store.events_of(run.card_id)
        )

    # -- for the gateway ---------------------------------------------------------------------

    def gateway_stopping(self, sessions: list[Session], now: float) -> list[str]:
        """Note that the gateway is stopping while these degraded kanban workers run: if they
        die with its unit, their runs close as infrastructure (card ready again, not counted).
        Returns the run ids noted."""
        noted = []
        for session in sessions:
            if session.owner.kind != "kanban" or session.placement is not Placement.DEGRADED:
                continue
            try:
                run = self.store.get_run(session.owner.id)
            except NotFoundError:
                continue
            if not run.open:
                continue
            self.store.append_event(
                run.card_id,
                EventKind.INTERRUPTED,
                {"session_id": session.id, "reason": "the gateway is stopping"},
                now=now,
                run_id=run.run_id,
            )
            noted.append(run.run_id)
        return noted

    def session_finished(self, session: Session, now: float) -> Closed | None:
        """Close the run of a finished kanban session at once (a registry finish listener
        can call this); None for other sessions or runs already closed."""
        if session.owner.kind != "kanban" or not session.finished:
            return None
        try:
            run = self.store.get_run(session.owner.id)
        except NotFoundError:
            return None
        if not run.open:
            return None
        sink: list[Closed] = []
        self._close_from_session(run, session, now, sink)
        return sink[0] if sink else None
