"""A board with a known history, written through the board store's own calls.

:func:`run_once` claims a card, starts its worker and closes the run at the given instants,
the card's change decided by the real taxonomy (:func:`dispatcher.kanban.taxonomy.after_run`),
exactly as the dispatcher would at those times. :func:`seed_small` writes the small board whose
every chart number is worked out by hand in its docstring; the contract suite, the web's unit
tests and the browser tier assert those numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dispatcher.buckets import Window
from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.model import Limits, NewCard, Run
from dispatcher.kanban.taxonomy import Breaker, after_run
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.outcome import Outcome, Result

T0 = 1_800_000_000.0
"""A multiple of every chart step (15 s ... 2 h)."""
ME = Claimant(pid=1, start=1, boot=None)
WIDE = Limits(max_in_progress=1000)
BREAKER = Breaker(failure_limit=3, rng=lambda: 0.0)
"""Three tries; a counted failure's next try is due at once (full jitter at its floor)."""


def result_of(outcome: Outcome) -> Result:
    """A worker's end with ``outcome`` (the exit code it implies)."""
    codes = {Outcome.COMPLETED: 0, Outcome.FAILED: 1, Outcome.TEMPFAIL: 75}
    return Result(
        outcome=outcome,
        exit_code=codes.get(outcome),
        infrastructure=outcome is Outcome.SPAWN_REFUSED,
        error=None if outcome is Outcome.COMPLETED else f"{outcome.value} here",
    )


def claim(store: BoardStore, card_id: str, at: float) -> Run:
    """Claim ``card_id`` at ``at`` (it must be claimable)."""
    claim = store.claim(card_id, now=at, claimer=ME, limits=WIDE)
    assert claim.run is not None, claim.verdict
    return claim.run


def spawn(store: BoardStore, run: Run, at: float) -> None:
    """The run's worker started at ``at``."""
    session = f"s_{run.run_id[2:]}"
    assert store.record_spawn(run.run_id, session_id=session, placement="scoped", unit=None, now=at)


def close(
    store: BoardStore, run: Run, outcome: Outcome, at: float, breaker: Breaker = BREAKER
) -> Run:
    """The run ended with ``outcome`` at ``at``; the taxonomy decides what the card does."""
    result = result_of(outcome)
    closed = store.close_run(
        run.run_id, result, lambda c, r: after_run(c, r, result, breaker, at), now=at
    )
    assert closed is not None
    return closed[0]


def run_once(
    store: BoardStore,
    card_id: str,
    *,
    claimed: float,
    started: float | None,
    ended: float | None,
    outcome: Outcome = Outcome.COMPLETED,
) -> Run:
    """One attempt of ``card_id``: claimed, its worker started (unless ``started`` is None) and
    closed with ``outcome`` at ``ended`` (left open when None)."""
    run = claim(store, card_id, claimed)
    if started is not None:
        spawn(store, run, started)
    if ended is None:
        return store.get_run(run.run_id)
    return close(store, run, outcome, ended)


@dataclass
class Seeded:
    """The cards and runs of :func:`seed_small`, by name."""

    cards: dict[str, str] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)


WINDOW = Window(start=T0, step=60.0, count=3)
"""Three one-minute buckets from :data:`T0`."""


def seed_small(store: BoardStore, start: float = T0, step: float = 60.0) -> Seeded:
    """Four cards and five runs in three buckets of ``step`` seconds from ``start`` (times below
    for a step of 60; other steps scale them):

    ===========  ========================  =====================================================
    card         assignee                  runs (claimed / started / ended → outcome)
    ===========  ========================  =====================================================
    alpha        a, created +0             10 / 12 / 30 → completed (wait 12, run 18)
    beta         b, created +5             20 / 25 / 70 → failed (wait 20, run 45);
                                           100 / 104 / 130 → tempfail (wait 34: ready since the
                                           failure at 70; run 26)
    gamma        a, created +130           140 / - / 150 → spawn_refused (no wait, no run)
    delta        b, created +150           160 / 165 / open
    ===========  ========================  =====================================================

    Runs per bucket: {completed 1}, {failed 1}, {tempfail 1, spawn_refused 1}. Cards now:
    alpha done, beta ready, gamma ready, delta running; at the end of each bucket ready 0, 0, 2,
    running 1, 1, 1, blocked 0, 0, 0.
    """
    k = step / 60.0

    def at(seconds: float) -> float:
        return start + seconds * k

    seeded = Seeded()
    c = seeded.cards

    def add(name: str, assignee: str, created: float) -> None:
        card, _ = store.add_card(NewCard(title=name, assignee=assignee), now=at(created))
        c[name.split()[0].lower()] = card.id

    # Every step in time order, as the board would have seen them.
    add("alpha deploy", "a", 0)
    add("Beta DB migration", "b", 5)
    alpha = claim(store, c["alpha"], at(10))
    spawn(store, alpha, at(12))
    beta = claim(store, c["beta"], at(20))
    spawn(store, beta, at(25))
    seeded.runs["alpha"] = close(store, alpha, Outcome.COMPLETED, at(30))
    seeded.runs["beta1"] = close(store, beta, Outcome.FAILED, at(70))
    beta = claim(store, c["beta"], at(100))
    spawn(store, beta, at(104))
    seeded.runs["beta2"] = close(store, beta, Outcome.TEMPFAIL, at(130))
    add("gamma", "a", 130)
    gamma = claim(store, c["gamma"], at(140))
    seeded.runs["gamma"] = close(store, gamma, Outcome.SPAWN_REFUSED, at(150))
    add("delta", "b", 150)
    delta = claim(store, c["delta"], at(160))
    spawn(store, delta, at(165))
    seeded.runs["delta"] = store.get_run(delta.run_id)
    return seeded
