"""The history pages' pure bucketing: windows, counts per outcome, percentiles, queue depth."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from dispatcher import buckets
from dispatcher.buckets import Bucket, Spread, Window


def test_windows_keep_a_few_hundred_aligned_buckets() -> None:
    for name, (span, step) in buckets.RANGES.items():
        win = buckets.window(name, 1_000_000.5)
        assert 200 <= win.count <= 400, name
        assert win.start % step == 0
        assert win.index(1_000_000.5) == win.count - 1
        assert win.end - win.start == span
    part = Window(start=100.0, step=10.0, count=5).part(2, 3)
    assert (part.start, part.end, part.count) == (120.0, 150.0, 3)


def test_counts_by_outcome_take_any_outcome() -> None:
    win = Window(start=0.0, step=10.0, count=3)
    rows = [(0.0, "completed"), (9.9, "failed"), (10.0, "oom_killed"), (30.0, "completed")]
    got = buckets.buckets_of(win, rows, {})
    assert [b.counts for b in got] == [{"completed": 1, "failed": 1}, {"oom_killed": 1}, {}]
    assert buckets.order_outcomes(["zz", "failed", "completed", "deferred"]) == [
        "completed",
        "failed",
        "deferred",
        "zz",
    ]


def test_percentile_is_nearest_rank() -> None:
    assert buckets.percentile([], 50) is None
    assert buckets.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert buckets.percentile([3.0, 1.0, 2.0, 4.0], 99) == 4.0
    assert buckets.percentile([5.0], 1) == 5.0
    assert [buckets.rank(10, q) for q in (50, 90, 99)] == [5, 9, 10]
    assert Spread.of([]) == Spread()
    spread = Spread.of([float(v) for v in range(1, 101)])
    assert (spread.count, spread.at(50), spread.at(90), spread.at(99)) == (100, 50.0, 90.0, 99.0)


def test_buckets_of_count_and_spread_each_interval() -> None:
    win = Window(start=0.0, step=10.0, count=2)
    got = buckets.buckets_of(
        win,
        [(1.0, "completed"), (2.0, "failed"), (15.0, "completed"), (25.0, "completed")],
        {"run": [(1.0, 5.0), (2.0, 7.0), (99.0, 1.0)]},
    )
    assert got[0] == Bucket({"completed": 1, "failed": 1}, {"run": Spread(2, (5.0, 7.0, 7.0))})
    assert got[1] == Bucket({"completed": 1}, {"run": Spread()})
    assert got[0].total == 2


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=50), st.integers(1, 100))
def test_percentile_is_a_member_with_enough_below(values: list[float], q: int) -> None:
    p = buckets.percentile(values, q)
    assert p in values
    below = sum(1 for v in values if v <= p)
    assert below >= q / 100 * len(values)
    # ... and it is the smallest such value: one rank lower would not be enough.
    assert sum(1 for v in values if v < p) < math.ceil(q / 100 * len(values))


STATUSES = ("ready", "running", "blocked", "done")


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from(("", *STATUSES)), st.sampled_from(STATUSES)),
        max_size=40,
    ),
    st.dictionaries(st.sampled_from(STATUSES), st.integers(0, 20)),
)
def test_depth_undoes_later_changes(
    changes: list[tuple[int, str, str]], start: dict[str, int]
) -> None:
    """Replaying the changes forward from any starting counts, the counts at each bucket's end
    are what :func:`buckets.depth` computes backward from the final counts."""
    flows: list[dict[tuple[str, str], int]] = [{} for _ in range(6)]
    levels = {s: start.get(s, 0) for s in STATUSES}
    forward: dict[str, list[int]] = {s: [] for s in STATUSES}
    for i in range(6):
        for bucket, before, after in changes:
            if bucket == i:
                flows[i][(before, after)] = flows[i].get((before, after), 0) + 1
                if before:
                    levels[before] -= 1
                levels[after] += 1
        for s in STATUSES:
            forward[s].append(levels[s])
    assert buckets.depth(levels, flows, STATUSES) == forward
