"""Held fires: a cron fire that a full named limit holds back is ``queued`` until a slot frees
within its start deadline, then ``missed`` with the reason (``limit deploys``); never dropped.
The policy as a pure function, then the scheduler over a real SQLite ledger and board that
share the limit (FakeRegistry, FakeClock)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.cron.errors import CronError
from dispatcher.cron.hold import HELD_POLL, Verdict, Waiting, decide
from dispatcher.cron.records import Status
from dispatcher.cron.scheduler import CronScheduler
from dispatcher.cron.settings import CronSettings, OverlapPolicy
from dispatcher.cron.zones import fixed_zone
from dispatcher.kanban.abc import Claim, ClaimVerdict
from dispatcher.kanban.model import CardChange, CardStatus, Limits, NewCard
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.limits import LimitSpec, Rate
from dispatcher.launch.outcome import Outcome, Result
from registry.fake import FakeRegistry
from tests.test_cron_scheduler import World, job, utc

DEPLOYS = {"deploys": LimitSpec(concurrency=1)}


# -- the policy -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "retry_at", "verdict", "look_at"),
    [
        (100.0, None, Verdict.WAIT, 100.0 + HELD_POLL),  # no end known: look again soon
        (100.0, 130.0, Verdict.WAIT, 130.0),  # a rate window says when
        (100.0, 900.0, Verdict.WAIT, 700.0),  # never past the deadline
        (699.0, None, Verdict.WAIT, 700.0),
        (700.0, None, Verdict.MISS, 700.0),  # the deadline: due 100 + catch_up_window 600
        (5000.0, 130.0, Verdict.MISS, 5000.0),
    ],
)
def test_a_held_fire_waits_until_its_deadline_then_misses(
    now: float, retry_at: float | None, verdict: Verdict, look_at: float
) -> None:
    waiting = Waiting(reason="limit x", detail="limit x (1 of 1 running)", retry_at=retry_at)
    decision = decide(waiting, deadline=700.0, now=now)
    assert (decision.verdict, decision.look_at) == (verdict, look_at)


# -- the scheduler ----------------------------------------------------------------------------


class Rig(World):
    def cron(
        self, *jobs: object, limits: dict[str, LimitSpec], **settings: object
    ) -> CronScheduler:
        scheduler = CronScheduler(
            CronSettings(jobs=tuple(jobs), **settings),  # type: ignore[arg-type]
            self.registry,
            self.db,
            clock=self.clock,
            environ={"PATH": "/usr/bin:/bin", "HOME": str(self.tmp_path)},
            state_dir=self.tmp_path / "state",
            zone_resolver=fixed_zone("UTC"),
            rng=random.Random(5),
            ledger=self.ledger,
            limits=limits,
        )
        self.schedulers.append(scheduler)
        return scheduler

    def claim(self, limits: dict[str, LimitSpec]) -> Claim:
        """A kanban claim of a new card taking every limit in ``limits`` (as a gateway's)."""
        board = SqliteBoardStore(self.db)
        card, _ = board.add_card(NewCard(title="t", assignee="a"), now=self.clock.time())
        return board.claim(
            card.id,
            now=self.clock.time(),
            claimer=Claimant(pid=1, start=1, boot=None),
            limits=Limits(max_in_progress=9, wants=tuple(limits.items())),
        )

    def kanban_run(self, limits: dict[str, LimitSpec]) -> str:
        """A kanban run holding every limit in ``limits``."""
        run = self.claim(limits).run
        assert run is not None
        return run.run_id

    def end_run(self, run_id: str) -> None:
        done = CardChange(fields={"status": CardStatus.DONE})
        result = Result(outcome=Outcome.COMPLETED)
        SqliteBoardStore(self.db).close_run(
            run_id, result, lambda c, r: done, now=self.clock.time()
        )


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    world = Rig(tmp_path)
    yield world
    for scheduler in world.schedulers:
        scheduler.stop()
    world.db.close()


def test_a_fire_held_by_a_kanban_run_starts_when_the_run_ends(rig: Rig) -> None:
    cron = rig.cron(job("release", uses=("deploys",)), limits=DEPLOYS)
    cron.tick()
    run_id = rig.kanban_run(DEPLOYS)
    report = cron.tick(rig.at("2026-01-05T10:00:00"))
    assert not report.started
    (row,) = rig.rows()
    assert (row.status, row.shown_outcome) == (Status.CLAIMED, "queued")
    assert row.error == "waiting: limit deploys (1 of 1 running)"
    assert report.next_wake == utc("2026-01-05T10:00:00") + HELD_POLL
    rig.end_run(run_id)
    report = cron.tick(rig.at("2026-01-05T10:00:05"))
    assert [r.fire_key for r in report.started] == [row.fire_key]
    (row,) = rig.rows()
    assert row.status is Status.RUNNING and row.error is None
    # The running fire holds the limit in turn: a kanban claim now waits for it.
    assert rig.claim(DEPLOYS).verdict is ClaimVerdict.LIMIT


def test_a_fire_held_past_its_deadline_is_missed_with_the_reason(rig: Rig) -> None:
    cron = rig.cron(job("release", uses=("deploys",), catch_up_window=120.0), limits=DEPLOYS)
    cron.tick()
    rig.kanban_run(DEPLOYS)
    cron.tick(rig.at("2026-01-05T10:00:00"))
    cron.tick(rig.at("2026-01-05T10:01:59"))
    assert rig.outcomes() == [("release@2026-01-05T10:00:00", "queued")]
    cron.tick(rig.at("2026-01-05T10:02:00"))
    (row,) = rig.rows()
    assert (row.status, row.outcome, row.error) == (Status.DONE, Outcome.MISSED, "limit deploys")
    assert not rig.registry.requests


def test_a_rate_holds_a_fire_until_its_window_lets_it_through(rig: Rig) -> None:
    limits = {"deploys": LimitSpec(rate=Rate(starts=1, window=300))}
    cron = rig.cron(job("release", every=120.0, uses=("deploys",)), limits=limits)
    cron.tick(rig.at("2026-01-05T10:00:30"))
    cron.tick(rig.at("2026-01-05T10:02:00"))  # the first fire starts
    rig.finish_all()
    report = cron.tick(rig.at("2026-01-05T10:04:00"))  # the second waits for the window
    assert not report.started
    assert rig.rows()[-1].error == "waiting: limit deploys (next start in 3m)"
    assert not cron.tick(rig.at("2026-01-05T10:06:59")).started
    report = cron.tick(rig.at("2026-01-05T10:07:00"))
    assert [r.fire_key for r in report.started] == ["release@2026-01-05T10:04:00"]


def test_a_lowered_limit_holds_new_fires_and_stops_none(rig: Rig) -> None:
    cron = rig.cron(job("a", uses=("deploys",), overlap=OverlapPolicy.ALLOW), limits=DEPLOYS)
    cron.tick()
    cron.tick(rig.at("2026-01-05T10:00:00"))
    assert rig.registry.running()
    cron.reload(cron.settings, limits={"deploys": LimitSpec(concurrency=1, rate=Rate(1, 3600))})
    cron.tick(rig.at("2026-01-05T10:05:00"))
    first, second = rig.rows()
    assert first.status is Status.RUNNING  # still running
    assert second.shown_outcome == "queued" and second.error is not None


def test_run_now_names_a_full_limit_and_starts_nothing(rig: Rig) -> None:
    cron = rig.cron(job("release", uses=("deploys",)), limits=DEPLOYS)
    rig.kanban_run(DEPLOYS)
    with pytest.raises(CronError, match=r"limit deploys \(1 of 1 running\)"):
        cron.run_now("release")
    assert rig.rows() == [] and not rig.registry.requests


def test_a_finished_fire_of_another_process_frees_the_limit_for_a_held_fire(rig: Rig) -> None:
    """A fire started by ``dispatch cron run`` (another process, which does not wait) holds
    the limit until its row is settled; a held fire's next look settles such fires first, so
    one that already ended does not hold it back until the periodic reconcile."""
    serve = rig.cron(job("release", uses=("deploys",), catch_up_window=20.0), limits=DEPLOYS)
    serve.tick()
    # The CLI's own registry on the same state: the sessions are shared, its finish
    # listeners (the CLI's, gone with its process) are not serve's.
    mine, other = rig.registry, FakeRegistry(clock=rig.clock)
    other.sessions, other.outputs, other.requests = mine.sessions, mine.outputs, mine.requests
    rig.registry = other
    cli = rig.cron(job("release", uses=("deploys",), catch_up_window=20.0), limits=DEPLOYS)
    rig.registry = mine
    run_id = rig.kanban_run(DEPLOYS)
    assert not serve.tick(rig.at("2026-01-05T10:00:00")).started
    rig.end_run(run_id)
    rig.at("2026-01-05T10:00:01")
    manual = cli.run_now("release")
    assert manual.session_id is not None
    other.finish(manual.session_id)  # the operator's fire ended; nobody settled it yet
    report = serve.tick(rig.at("2026-01-05T10:00:05"))
    assert [r.fire_key for r in report.started] == ["release@2026-01-05T10:00:00"]
    assert rig.ledger.get(manual.id).outcome is Outcome.COMPLETED
