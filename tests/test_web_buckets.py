"""The charts' pure bucketing: windows, counts per outcome, concurrency, percentiles."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.web import buckets
from dispatcher.web.buckets import Window


def test_windows_keep_a_few_hundred_aligned_buckets() -> None:
    for name, (span, step) in buckets.RANGES.items():
        win = buckets.window(name, 1_000_000.5)
        assert 30 <= win.count <= 400, name
        assert win.start % step == 0
        assert win.index(1_000_000.5) == win.count - 1
        assert win.end - win.start == span


def test_counts_by_outcome_take_any_outcome() -> None:
    win = Window(start=0.0, step=10.0, count=3)
    rows = [(0.0, "completed"), (9.9, "failed"), (10.0, "oom_killed"), (30.0, "completed")]
    assert buckets.count_by(win, rows) == [{"completed": 1, "failed": 1}, {"oom_killed": 1}, {}]
    assert buckets.order_outcomes(["zz", "failed", "completed", "deferred"]) == [
        "completed",
        "failed",
        "deferred",
        "zz",
    ]


def test_concurrency_counts_spans_open_at_each_bucket_end() -> None:
    win = Window(start=0.0, step=10.0, count=3)
    spans = [(0.0, 15.0), (5.0, None), (12.0, 20.0), (25.0, 26.0)]
    # at 10: both first spans; at 20: only the open one (end exclusive); at now=27: the open one
    assert buckets.concurrency(win, spans, now=27.0) == [2, 1, 1]


def test_percentile_is_nearest_rank() -> None:
    assert buckets.percentile([], 50) is None
    assert buckets.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert buckets.percentile([3.0, 1.0, 2.0, 4.0], 99) == 4.0
    win = Window(start=0.0, step=10.0, count=2)
    assert buckets.percentiles_by(win, [(1.0, 5.0), (2.0, 7.0)], (50,)) == [
        {50: 5.0},
        {50: None},
    ]


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 50)), max_size=30))
def test_concurrency_matches_a_direct_count(raw: list[tuple[float, float]]) -> None:
    win = Window(start=0.0, step=10.0, count=10)
    spans = [(b, b + d) for b, d in raw]
    got = buckets.concurrency(win, spans, now=1000.0)
    want = [sum(1 for b, e in spans if b <= p < e) for p in [10.0 * (i + 1) for i in range(10)]]
    assert got == want


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=50), st.sampled_from([50, 90, 99]))
def test_percentile_is_a_member_with_enough_below(values: list[float], q: int) -> None:
    p = buckets.percentile(values, q)
    assert p in values
    assert sum(1 for v in values if v <= p) >= q / 100 * len(values)
