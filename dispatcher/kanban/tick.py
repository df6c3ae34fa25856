"""The kanban dispatcher: one :meth:`KanbanDispatcher.tick` step, driven with an explicit time.

A tick reconciles first (runs whose keeper wrote an exit record or vanished get their outcome;
runs claimed by a dispatcher that died before recording a spawn are reclaimed), promotes
``todo`` cards whose parents are done and transient blocks that ended, then, unless claiming is
paused, walks the ``ready`` cards by priority then age: back-off and cooldown are honoured (a
successful probe ends a cooldown at once), both budgets are checked inside the claim
transaction, and each claimed card is placed and spawned through the launch core
(:mod:`dispatcher.kanban.running`).

The gateway calls :meth:`tick` when woken; ``dispatch kanban tick`` calls it once (caller kind
``oneshot``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dispatcher.kanban.abc import BoardStore, ClaimVerdict
from dispatcher.kanban.faults import FaultPoint
from dispatcher.kanban.model import Card, EventKind, Limits
from dispatcher.kanban.report import Closed, Dispatched, TickReport
from dispatcher.kanban.running import Launches, RunLauncher
from dispatcher.kanban.settings import KanbanSettings
from dispatcher.kanban.worker import WorkerContext
from dispatcher.launch import holds
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.limits import (
    LimitSpec,
    LimitWait,
    Tally,
    WaitKind,
    Wants,
    refusal,
    wants_of,
)
from dispatcher.launch.setup import Workplace
from registry.abc import OwnerKind, Registry, Session
from registry.store.database import space_problem
from scope.abc import CallerKind, Placement, Scoper
from scope.foundation.errors import DispatchError, NotFoundError

log = logging.getLogger("dispatch.kanban")

WALK_PAGE = 256
"""Ready cards read per page while a tick walks the board."""

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
    claims: int = 0
    budget_full: bool = False
    full_assignees: set[str] = field(default_factory=set)
    open_total: int = 0
    """Dry run: open runs plus the claims planned so far."""
    open_by_assignee: dict[str, int] = field(default_factory=dict)
    limited: list[tuple[str, str]] = field(default_factory=list)
    """(card id, what it waits for): cards a full named limit held back."""
    full_limits: dict[str, str] = field(default_factory=dict)
    """Limits found full this tick, with the wait (cards using them are not asked again)."""
    full_groups: dict[tuple[str, str | None], str] = field(default_factory=dict)
    """(limit, group) pairs whose ``per_group`` cap was found full this tick."""
    clock: float = 0.0
    """Dry run: the time the limits were read at (the store's clock)."""
    tallies: dict[str, Tally] = field(default_factory=dict)
    """Dry run: what the limits held, plus the claims planned so far."""


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
        limits: Mapping[str, LimitSpec] | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.limits = dict(limits or {})
        """The named limits (``limits:``) the assignees' ``uses`` name."""
        self._pruned_at: float | None = None
        self.scoper = scoper
        self.adopt = adopt
        self.worker = WorkerContext(
            workplace=Workplace(
                state_dir=Path(state_dir), config_path=config_path, environ=dict(environ or {})
            ),
            caller=caller,
        )
        self.runs = RunLauncher(
            store=store,
            registry=registry,
            settings=settings,
            worker=self.worker,
            fault=fault or FaultPoint(),
        )
        self._claimant = Claimant.current()

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
            self._prune_holds(now)
        paused = self.store.paused()
        full = None if dry_run else space_problem(self.worker.state_dir)
        if full is not None:  # a claim would fail half-way (or count against the card)
            work.warnings.append(full)
        elif not paused:
            self._claim_ready(work, max_claims, dry_run)
        # The walk never reads cards backing off (an index leaves them out); list the soonest.
        work.backing_off = self.store.backing_off(now=now, limit=WALK_PAGE)
        if any(d.placement == Placement.DEGRADED for d in work.dispatched):
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
            limited=tuple(work.limited),
            unknown_assignee=tuple(work.unknown),
            warnings=tuple(work.warnings),
            board_version=self.store.board_version(),
        )

    def _claim_ready(self, work: _Pass, max_claims: int | None, dry_run: bool) -> None:
        launches = Launches(self.runs, work.now)
        try:
            self._walk_ready(work, max_claims, dry_run, launches)
        except BaseException:
            launches.abandon()
            raise
        for spawned in launches.results():
            if spawned.dispatched is not None:
                work.dispatched.append(spawned.dispatched)
            if spawned.closed is not None:
                target = work.refused if spawned.refused else work.reconciled
                target.append(spawned.closed)

    def _walk_ready(
        self, work: _Pass, max_claims: int | None, dry_run: bool, launches: Launches
    ) -> None:
        if dry_run:
            work.open_total, work.open_by_assignee = self._open_counts()
            every = wants_of(self.limits, self.limits)
            work.clock, work.tallies = self.store.limit_tallies(every, now=work.now)
        for card in self._ready(work, max_claims):
            assignee = self.settings.assignees.get(card.assignee)
            if assignee is None:
                work.unknown.append(card.id)
                if not card.assignee_noted and not dry_run:
                    self._note_unknown_assignee(card, work.now)
                continue
            wants = wants_of(assignee.uses, self.limits)
            if self._known_full(card, wants, work):
                continue
            if card.retry_at is not None and card.retry_at > work.now:
                continue  # not returned by the walk's query; kept as the rule's guard
            cooling = card.cooldown_until is not None and card.cooldown_until > work.now
            if cooling and not self._probe_ok(work):
                work.guarded.append(card.id)
                if not dry_run:
                    self._guard(card, work.now)
                continue
            if (
                work.budget_full
                or card.assignee in work.full_assignees
                or (max_claims is not None and work.claims >= max_claims)
            ):
                work.deferred.append(card.id)
            elif dry_run:
                self._plan(card, assignee.max_in_progress, wants, work)
            elif not self._claim(card, assignee.max_in_progress, wants, cooling, work, launches):
                return

    def _ready(self, work: _Pass, max_claims: int | None) -> Iterator[Card]:
        """The ready cards in claim order, a page at a time: once the board's budget (or
        ``max_claims``) is used up, the rest of the board is not read (its cards wait for a
        later tick; ``deferred`` lists those the walk looked at)."""
        after = None
        while True:
            page = self.store.ready_cards(after=after, limit=WALK_PAGE, now=work.now)
            yield from page
            done = work.budget_full or (max_claims is not None and work.claims >= max_claims)
            if len(page) < WALK_PAGE or done or self._all_held(work):
                return
            after = page[-1]

    def _all_held(self, work: _Pass) -> bool:
        """Whether no card could be claimed this tick whatever comes next: every configured
        assignee's budget, or one of the limits it uses, is full (then the rest of a big
        board is not read)."""
        assignees = self.settings.assignees
        return bool(assignees) and all(
            name in work.full_assignees or any(u in work.full_limits for u in spec.uses)
            for name, spec in assignees.items()
        )

    def _known_full(self, card: Card, wants: Wants, work: _Pass) -> bool:
        """Whether a limit ``card`` needs was already found full this tick (noted as such)."""
        for name, _ in wants:
            wait = work.full_limits.get(name) or work.full_groups.get((name, card.group))
            if wait is not None:
                work.limited.append((card.id, wait))
                return True
        return False

    def _held_back(self, card: Card, wait: LimitWait, work: _Pass) -> None:
        """``card`` waits for a full limit: remember which, so later cards are not asked."""
        text = wait.describe(work.clock or work.now)
        if wait.kind is WaitKind.GROUP:
            work.full_groups[(wait.limit, wait.group)] = text
        else:
            work.full_limits[wait.limit] = text
        work.limited.append((card.id, text))

    def _prune_holds(self, now: float) -> None:
        """Forget released limit holds no rate window reaches any more (at most hourly)."""
        if self._pruned_at is not None and now - self._pruned_at < 3600:
            return
        self._pruned_at = now
        windows = [spec.rate.window for spec in self.limits.values() if spec.rate is not None]
        self.store.prune_holds(now - holds.horizon(windows))

    def _plan(self, card: Card, assignee_max: int | None, wants: Wants, work: _Pass) -> None:
        """Dry run: would ``card`` be claimed, counting the claims planned so far?"""
        mine = work.open_by_assignee.get(card.assignee, 0)
        wait = refusal(wants, work.tallies, group=card.group)
        if work.open_total >= self.settings.max_in_progress:
            work.budget_full = True
        elif assignee_max is not None and mine >= assignee_max:
            work.full_assignees.add(card.assignee)
        elif wait is not None:
            self._held_back(card, wait, work)
            return
        else:
            work.planned.append(card.id)
            work.open_total += 1
            work.open_by_assignee[card.assignee] = mine + 1
            work.claims += 1
            for name, spec in wants:
                work.tallies[name] = planned_hold(
                    work.tallies.get(name), spec, card.group, work.clock
                )
            return
        work.deferred.append(card.id)

    def _claim(
        self,
        card: Card,
        assignee_max: int | None,
        wants: Wants,
        ignore_cooldown: bool,
        work: _Pass,
        launches: Launches,
    ) -> bool:
        """Claim ``card`` and start its run; False when claiming is paused (stop the walk)."""
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
            claimer=self._claimant,
            limits=Limits(
                max_in_progress=self.settings.max_in_progress,
                assignee_max=assignee_max,
                wants=wants,
            ),
            ignore_cooldown=ignore_cooldown,
        )
        if claim.verdict is ClaimVerdict.CLAIMED and claim.run is not None:
            work.claims += 1
            launches.start(card, claim.run)
        elif claim.verdict is ClaimVerdict.BUDGET:
            work.budget_full = True
            work.deferred.append(card.id)
        elif claim.verdict is ClaimVerdict.ASSIGNEE_BUDGET:
            work.full_assignees.add(card.assignee)
            work.deferred.append(card.id)
        elif claim.verdict is ClaimVerdict.LIMIT and claim.wait is not None:
            self._held_back(card, claim.wait, work)
        return claim.verdict is not ClaimVerdict.PAUSED

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

    # -- runs ---------------------------------------------------------------------------------

    def reconcile(self, now: float) -> list[Closed]:
        """Close every open run whose worker is confirmed finished or never started."""
        return self.runs.reconcile(now, adopt=self.adopt)

    # -- for the gateway ---------------------------------------------------------------------

    def gateway_stopping(self, sessions: list[Session], now: float) -> list[str]:
        """Note that the gateway is stopping while these degraded kanban workers run: if they
        die with its unit, their runs close as infrastructure (card ready again, not counted).
        Returns the run ids noted."""
        noted = []
        for session in sessions:
            kanban = session.owner.kind is OwnerKind.KANBAN
            if not kanban or session.placement is not Placement.DEGRADED:
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
        if session.owner.kind is not OwnerKind.KANBAN or not session.finished:
            return None
        try:
            run = self.store.get_run(session.owner.id)
        except NotFoundError:
            return None
        if not run.open:
            return None
        return self.runs.close_from_session(run, session, now)


def planned_hold(tally: Tally | None, spec: LimitSpec, group: str | None, now: float) -> Tally:
    """``tally`` with one more open hold and start for ``group``: a dry run's planned claim
    (a rate it fills counts as full from ``now``, so a dry run never promises more starts
    than a tick would make)."""
    base = tally or Tally()
    groups = dict(base.groups)
    groups[group] = groups.get(group, 0) + 1
    nth = base.nth_start
    if nth is None and spec.rate is not None and base.starts + 1 >= spec.rate.starts:
        nth = now
    return Tally(in_use=base.in_use + 1, groups=groups, starts=base.starts + 1, nth_start=nth)
