"""The history's rollup: the answers of settled buckets, kept in the database beside the rows
they count.

Counting a month of a busy board (a million runs, three million events) takes seconds however
the counting is done; a month of answers is a few hundred rows. So the answer of every bucket
of the rollup's steps (:data:`~dispatcher.rolluptables.STEPS`: those of the 24 h, 7 d and 30 d
charts and of the board's strip) is stored once the bucket has settled, and a read takes the
stored answers and counts only the buckets that have none (:func:`assemble`): the newest ones,
and any a write touched since.

**Exact.** A stored answer is never stale. Every write that could change one deletes it in the
same transaction: triggers on the rows it counts (:mod:`dispatcher.rolluptables`) forget the
buckets holding an appended or deleted event, a run closed, changed or deleted, the runs of a
card whose assignee changed, a fire written or pruned. A roll-up reads the rows and stores the
answers inside one write transaction that excludes every such write (SQLite's single writer;
the board's or the ledger's advisory lock on PostgreSQL), so no write can land between the
counting and the storing. A read therefore answers what counting the rows answers, whatever
has been rolled up; the contract suites, and a Hypothesis test that rolls up at random moments
of random boards, hold the stores to that.

**Rebuilt on demand.** A missing answer is the normal case, not an error: a read counts those
buckets itself. ``roll_up`` (board store and ledger; ``dispatch web`` calls it every minute)
stores the answers of the settled buckets of the last :data:`HORIZON` that have none, newest
first, in write transactions that take two-hour spans (:data:`SPAN`) for :data:`BUSY` seconds
at most, and forgets older ones. The table holds nothing else, so it may be emptied at any
time (a change of its format is a migration that drops it) and fills again.

Sources: ``runs`` (the board's closed runs, all and per assignee), ``flows`` (the board's
status changes) and ``fires`` (the cron ledger's settled fires, all and per job).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from dispatcher.buckets import Bucket, Flows, Sample, Spread, Window, bucket_of
from dispatcher.rolluptables import STEPS as STEPS  # the steps are read from here too

T = TypeVar("T")


def span_of(steps: Sequence[float]) -> float:
    """What one roll-up transaction covers at most: the least common multiple of ``steps``
    (whole seconds, each a multiple of the finest), so the buckets of every step lie inside one
    span or another."""
    if any(s != int(s) or s % min(steps) for s in steps):
        raise ValueError(f"rollup steps must be whole multiples of the finest: {steps}")
    return float(math.lcm(*(int(s) for s in steps)))


SPAN = span_of(STEPS)
"""Two hours."""
SETTLE = 300.0
"""Seconds after its end before a bucket is rolled up: a bucket still filling would be
forgotten again at its next write, and a writer's clock may run this far behind the others'
(:data:`dispatcher.kanban.sqlhistory.SKEW`)."""
HORIZON = 31 * 86400.0
"""How far back answers are kept: the longest chart's range and a day."""
BUSY = 0.05
"""Seconds one roll-up transaction goes on taking spans for (at least one): a sparse month
costs a few transactions, a busy one a span each, so the write lock is never held long."""

# -- which buckets -----------------------------------------------------------------------------


def rolled(window: Window, steps: Sequence[float]) -> bool:
    """Whether ``window``'s buckets are among those rolled up (one of ``steps``, aligned)."""
    return window.step in steps and window.start % window.step == 0


def plan(
    present: Iterable[tuple[float, float]],
    now: float,
    steps: Sequence[float] = STEPS,
    *,
    oldest: float,
    settle: float = SETTLE,
    horizon: float = HORIZON,
) -> list[list[tuple[float, float]]]:
    """Per span (:func:`span_of`), newest first, the ``(step, start)`` of its settled buckets
    (ended ``settle`` seconds before ``now``; from the span holding ``oldest``, the time of the
    oldest row, or ``horizon`` before ``now`` if that is later) that are not ``present``."""
    span = span_of(steps)
    have = set(present)
    cut = now - settle
    first = math.floor(max(now - horizon, oldest) / span) * span
    todo = []
    lo = math.floor(cut / span) * span
    while lo >= first:
        wanted = [
            (step, start)
            for step in steps
            for start in (lo + step * k for k in range(int(span // step)))
            if start + step <= cut and (step, start) not in have
        ]
        if wanted:
            todo.append(wanted)
        lo -= span
    return todo


def assemble(window: Window, found: Mapping[int, T], count: Callable[[Window], list[T]]) -> list[T]:
    """Every bucket's answer: the ``found`` ones (by bucket number), the others counted by
    ``count`` one run of consecutive buckets at a time."""
    answers: list[T] = []
    i = 0
    while i < window.count:
        if i in found:
            answers.append(found[i])
            i += 1
            continue
        j = i
        while j < window.count and j not in found:
            j += 1
        answers += count(window.part(i, j - i))
        i = j
    return answers


# -- reading and writing the table -------------------------------------------------------------


def stored(conn: Any, source: str, window: Window) -> dict[int, str]:
    """The stored answers of ``window``'s buckets, by bucket number."""
    rows = conn.execute(
        "SELECT bucket_start, answer FROM history_rollup WHERE source = ? AND step = ?"
        " AND bucket_start >= ? AND bucket_start < ?",
        [source, window.step, window.start, window.end],
    ).fetchall()
    edges = {start: i for i, start in enumerate(window.edges())}
    return {edges[row[0]]: str(row[1]) for row in rows if row[0] in edges}


def present(
    conn: Any, source: str, steps: Sequence[float], since: float, until: float
) -> set[tuple[float, float]]:
    """``(step, start)`` of the stored answers of buckets of ``steps`` starting in
    ``[since, until)`` (a range of the primary key per step)."""
    found: set[tuple[float, float]] = set()
    for step in steps:
        rows = conn.execute(
            "SELECT bucket_start FROM history_rollup WHERE source = ? AND step = ?"
            " AND bucket_start >= ? AND bucket_start < ?",
            [source, step, since, until],
        ).fetchall()
        found.update((step, float(row[0])) for row in rows)
    return found


def store(conn: Any, source: str, answers: Iterable[tuple[float, float, str]]) -> int:
    """Store ``(step, start, answer)`` rows (one already there is kept); how many."""
    count = 0
    for step, start, answer in answers:
        conn.execute(
            "INSERT INTO history_rollup (source, step, bucket_start, bucket_end, answer)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [source, step, start, start + step, answer],
        )
        count += 1
    return count


def forget_before(conn: Any, sources: Sequence[str], at: float) -> None:
    """Forget the ``sources``' answers of buckets that ended before ``at`` (past the horizon)."""
    for source in sources:
        conn.execute("DELETE FROM history_rollup WHERE source = ? AND bucket_end < ?", [source, at])


def todo(
    conn: Any, sources: Sequence[str], now: float, steps: Sequence[float], oldest: float | None
) -> list[list[tuple[float, float]]]:
    """:func:`plan` for the buckets any of ``sources`` lacks, a list per span (none when there
    are no rows: ``oldest`` None)."""
    if oldest is None:
        return []
    span = span_of(steps)
    since = now - HORIZON - span
    missing: dict[tuple[float, float], None] = {}
    for source in sources:
        have = present(conn, source, steps, since, now)
        for buckets in plan(have, now, steps, oldest=oldest):
            missing.update(dict.fromkeys(buckets))
    spans: dict[float, list[tuple[float, float]]] = {}
    for step, start in missing:
        spans.setdefault(math.floor(start / span) * span, []).append((step, start))
    return [spans[lo] for lo in sorted(spans, reverse=True)]


def roll(
    db: Any,
    todo: Sequence[list[tuple[float, float]]],
    one: Callable[[Any, list[tuple[float, float]]], int],
    sources: Sequence[str],
    now: float,
) -> int:
    """Store the answers of the ``todo`` spans, ``one(conn, wanted)`` a span, in write
    transactions of ``db`` that take spans for :data:`BUSY` seconds each and forget the
    ``sources``' answers past the horizon; how many were stored."""
    stored = 0
    left = list(todo)
    while left:
        with db.write() as conn:
            begun, taken = time.perf_counter(), 0
            while left and (not taken or time.perf_counter() - begun < BUSY):
                stored += one(conn, left.pop(0))
                taken += 1
            forget_before(conn, sources, now - HORIZON)
    return stored


def fine_window(wanted: Sequence[tuple[float, float]], steps: Sequence[float]) -> Window:
    """The buckets of the finest of ``steps`` that tile every ``wanted`` ``(step, start)``
    bucket: each of the rolled-up steps is a multiple of the finest one."""
    fine = min(steps)
    first = min(start for _, start in wanted)
    last = max(start + step for step, start in wanted)
    return Window(start=first, step=fine, count=round((last - first) / fine))


def _tiles(fine: Window, step: float, start: float) -> range:
    """The numbers of ``fine``'s buckets that make up the bucket ``(step, start)``."""
    first = round((start - fine.start) / fine.step)
    return range(first, first + round(step / fine.step))


def split_answers(
    fine: Window,
    measures: Sequence[str],
    keyed: Iterable[tuple[str, Sample]],
    wanted: Iterable[tuple[float, float]],
) -> list[tuple[float, float, str]]:
    """The ``wanted`` buckets' answers (:func:`encode_split`) of ``(key, sample)`` rows: each
    sample is placed once in its bucket of ``fine``, and a coarser bucket takes the samples of
    the fine ones it is made of (a time lies in the same bucket either way: the difference to
    an aligned start is exact, and so is its division into whole buckets)."""
    tiles: dict[int, dict[str, list[Sample]]] = {}
    for key, sample in keyed:
        i = fine.index(sample[0])
        if i is not None:
            tiles.setdefault(i, {}).setdefault(key, []).append(sample)
    answers = []
    for step, start in wanted:
        mine: dict[str, list[Sample]] = {}
        for i in _tiles(fine, step, start):
            for key, samples in tiles.get(i, {}).items():
                mine.setdefault(key, []).extend(samples)
        whole = bucket_of(measures, (s for samples in mine.values() for s in samples))
        parts = {key: bucket_of(measures, samples) for key, samples in mine.items()}
        answers.append((step, start, encode_split(whole, parts)))
    return answers


def flow_answers(
    fine: Window, flows: Sequence[Flows], wanted: Iterable[tuple[float, float]]
) -> list[tuple[float, float, str]]:
    """The ``wanted`` buckets' status changes (:func:`encode_flows`), summed from ``fine``'s."""
    answers = []
    for step, start in wanted:
        total: dict[tuple[str, str], int] = {}
        for i in _tiles(fine, step, start):
            for change, n in flows[i].items():
                total[change] = total.get(change, 0) + n
        answers.append((step, start, encode_flows(total)))
    return answers


# -- answers as text ---------------------------------------------------------------------------


def _spread(spread: Spread) -> list[Any]:
    return [spread.count, *spread.values]


def _bucket(bucket: Bucket) -> list[Any]:
    return [dict(bucket.counts), {name: _spread(s) for name, s in bucket.spreads.items()}]


def _unbucket(data: list[Any]) -> Bucket:
    counts, spreads = data
    return Bucket(
        {str(k): int(v) for k, v in counts.items()},
        {name: Spread(int(s[0]), tuple(s[1:])) for name, s in spreads.items()},
    )


def encode_split(whole: Bucket, parts: Mapping[str, Bucket]) -> str:
    """One bucket's answer, whole and split by a key (assignee, job): parts that counted
    nothing are left out."""
    return json.dumps(
        {"all": _bucket(whole), "by": {k: _bucket(b) for k, b in parts.items() if b.counts}},
        separators=(",", ":"),
    )


def decode_split(text: str, key: str | None) -> Bucket:
    """The bucket :func:`encode_split` stored, whole (``key`` None) or of one ``key`` (an
    empty bucket when that key counted nothing)."""
    data = json.loads(text)
    if key is None:
        return _unbucket(data["all"])
    if key in data["by"]:
        return _unbucket(data["by"][key])
    return Bucket({}, {name: Spread() for name in data["all"][1]})


def encode_flows(flows: Flows) -> str:
    """One bucket's status changes."""
    return json.dumps([[a, b, n] for (a, b), n in flows.items()], separators=(",", ":"))


def decode_flows(text: str) -> Flows:
    """The status changes :func:`encode_flows` stored."""
    return {(str(a), str(b)): int(n) for a, b, n in json.loads(text)}
