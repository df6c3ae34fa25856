"""The pure catch-up and overlap rules (dispatcher/cron/policy.py), table-driven."""

from __future__ import annotations

import datetime as dt

import pytest

from dispatcher.cron.policy import OverlapAction, Verdict, judge, overlap_action
from dispatcher.cron.settings import CatchUpPolicy, OverlapPolicy
from dispatcher.cron.timeline import Occurrence

NOW = 1_800_000_000.0


def _occ(minutes_ago: float, *, coalesced: bool = False) -> Occurrence:
    at = NOW - minutes_ago * 60
    wall = dt.datetime.fromtimestamp(at, dt.UTC).replace(tzinfo=None)
    return Occurrence(wall=wall, fold=0, at=at, coalesced=coalesced, gap=coalesced)


def _run(
    ages: list[float],
    policy: CatchUpPolicy,
    *,
    window: float = 3600,
    limit: int = 100,
    grace: float = 60,
) -> list[str]:
    """Verdicts as compact strings: run, run*, missed, coalesced (run* = flagged catch-up)."""
    judged = judge(
        [_occ(a) for a in ages], now=NOW, catch_up=policy, window=window, limit=limit, grace=grace
    )
    return [
        ("run*" if j.catch_up else "run") if j.verdict is Verdict.RUN else j.verdict.value
        for j in judged
    ]


# Fires every 15 minutes, the scheduler down for 2 hours: ages in minutes, oldest first.
DOWNTIME = [120, 105, 90, 75, 60, 45, 30, 15]


@pytest.mark.parametrize(
    ("policy", "kwargs", "expected"),
    [
        (
            CatchUpPolicy.LATEST,
            {},
            ["missed"] * 4 + ["coalesced", "coalesced", "coalesced", "run*"],
        ),
        (CatchUpPolicy.SKIP, {}, ["missed"] * 8),
        (CatchUpPolicy.ALL, {}, ["missed"] * 4 + ["run*"] * 4),
        (CatchUpPolicy.ALL, {"limit": 2}, ["missed"] * 6 + ["run*"] * 2),
        (CatchUpPolicy.LATEST, {"window": 0}, ["missed"] * 8),
        (CatchUpPolicy.ALL, {"window": 7200}, ["run*"] * 8),
        (
            CatchUpPolicy.LATEST,
            {"window": 20 * 60},
            ["missed"] * 7 + ["run*"],
        ),
    ],
)
def test_catch_up_after_downtime(policy, kwargs, expected) -> None:
    assert _run(DOWNTIME, policy, **kwargs) == expected


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # An on-time fire covers the late ones under latest: nothing extra runs.
        (CatchUpPolicy.LATEST, ["missed", "coalesced", "coalesced", "run"]),
        (CatchUpPolicy.SKIP, ["missed", "missed", "missed", "run"]),
        (CatchUpPolicy.ALL, ["missed", "run*", "run*", "run"]),
    ],
)
def test_an_on_time_fire_in_the_same_batch(policy, expected) -> None:
    assert _run([90, 40, 20, 0.5], policy) == expected


def test_lateness_within_the_grace_is_not_downtime() -> None:
    # APScheduler's 1 s misfire default must not leak: 30 s late still runs normally.
    assert _run([0.5], CatchUpPolicy.SKIP) == ["run"]
    assert _run([2], CatchUpPolicy.SKIP) == ["missed"]
    assert _run([2], CatchUpPolicy.SKIP, grace=300) == ["run"]


def test_dst_coalesced_fires_stay_coalesced() -> None:
    due = [_occ(0.2), _occ(0.2, coalesced=True)]
    judged = judge(due, now=NOW, catch_up=CatchUpPolicy.ALL, window=3600, limit=10, grace=60)
    assert [j.verdict for j in judged] == [Verdict.RUN, Verdict.COALESCED]
    assert judged[1].note and "DST" in judged[1].note


def test_notes_explain_non_runs() -> None:
    judged = judge(
        [_occ(a) for a in DOWNTIME],
        now=NOW,
        catch_up=CatchUpPolicy.LATEST,
        window=3600,
        limit=100,
        grace=60,
    )
    assert "catch_up_window" in (judged[0].note or "")
    assert (judged[4].note or "").startswith("covered by")
    assert judged[-1].note is None


@pytest.mark.parametrize(
    ("policy", "active", "queued", "action"),
    [
        (OverlapPolicy.SKIP, 0, 0, OverlapAction.RUN),
        (OverlapPolicy.SKIP, 1, 0, OverlapAction.SKIP),
        (OverlapPolicy.QUEUE_ONE, 1, 0, OverlapAction.QUEUE),
        (OverlapPolicy.QUEUE_ONE, 1, 1, OverlapAction.SKIP),
        (OverlapPolicy.REPLACE, 1, 0, OverlapAction.REPLACE),
        (OverlapPolicy.ALLOW, 3, 0, OverlapAction.RUN),
        (OverlapPolicy.REPLACE, 0, 0, OverlapAction.RUN),
    ],
)
def test_overlap_table(policy, active, queued, action) -> None:
    assert overlap_action(policy, active=active, queued=queued) is action
