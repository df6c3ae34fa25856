"""The history pages' reads, cached per bucket and shared by every open dashboard.

A chart is a window of aligned buckets (:func:`dispatcher.buckets.window`). A bucket that ended
more than :data:`SETTLE` seconds ago no longer changes (a write's clock reading and its commit
are moments apart, never a minute), so it is read from the store once and kept; the buckets
after it are read again at most every :data:`TTL` seconds, and only they. Fifty dashboards
open on one chart therefore cost one small range read per ``TTL`` between them, and a chart
over a month costs one read of the whole month once per process, then a read of its newest
buckets.

A page drawn from those answers is kept as long (:meth:`HistoryCache.memo`). Each (chart,
filter, step) has its own lock: a burst of page loads waits for the one read
in flight instead of repeating it. :attr:`HistoryCache.reads` counts the store reads (the
tests and the benchmark check the sharing with it). Time is the injected clock's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dispatcher.buckets import Bucket, Flows, Window
from scope.foundation.clock import Clock, SystemClock

V = TypeVar("V")

TTL = 5.0
SETTLE = 60.0
KEYS = 64
"""How many (chart, filter, step) series are kept (least recently used ones go first)."""


@dataclass
class _Series:
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: dict[float, Any] = field(default_factory=dict)
    """Bucket start → its settled answer."""
    live: tuple[float, float, list[Any], Any] | None = None
    """(read at, first live bucket's start, the live buckets' answers, the read's extra)."""


Read = Callable[[Window], tuple[list[V], Any]]
"""Reads the answers of a window's buckets (and anything read with them, in one snapshot)."""


class HistoryCache:
    """Per-bucket answers (see the module docstring)."""

    def __init__(self, clock: Clock | None = None, *, ttl: float = TTL, settle: float = SETTLE):
        self.clock = clock or SystemClock()
        self.ttl = ttl
        self.settle = settle
        self.reads = 0
        self._series: OrderedDict[Hashable, _Series] = OrderedDict()
        self._lock = threading.Lock()

    def _of(self, key: Hashable) -> _Series:
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series()
                while len(self._series) > KEYS:
                    self._series.popitem(last=False)
            self._series.move_to_end(key)
            return series

    def get(self, key: Hashable, window: Window, read: Read[V]) -> tuple[list[V], Any]:
        """Every bucket's answer of ``window`` (and the extra of the newest read), reading only
        what is not kept (see the module docstring)."""
        now = self.clock.time()
        edges = window.edges()
        settled = sum(1 for start in edges if start + window.step <= now - self.settle)
        series = self._of((key, window.step))
        with series.lock:
            missing = [i for i in range(settled) if edges[i] not in series.closed]
            if missing:
                first = missing[0]
                answers, _ = self._read(read, window.part(first, settled - first))
                for i, answer in enumerate(answers, start=first):
                    series.closed[edges[i]] = answer
            live_start = window.start + settled * window.step
            kept = series.live
            if (
                kept is None
                or kept[1] != live_start
                or now - kept[0] >= self.ttl
                or len(kept[2]) != window.count - settled
            ):
                answers, extra = self._read(read, window.part(settled, window.count - settled))
                kept = series.live = (now, live_start, answers, extra)
            # Buckets older than any window asks for are dropped.
            horizon = window.start - 31 * 86400.0
            for start in [s for s in series.closed if s < horizon]:
                del series.closed[start]
            closed = [series.closed[edges[i]] for i in range(settled)]
            return closed + kept[2], kept[3]

    def memo(self, key: Hashable, build: Callable[[], V]) -> V:
        """``build()``'s answer, kept for the TTL (a page drawn from the cached buckets: fifty
        dashboards on it cost one drawing per TTL too)."""
        now = self.clock.time()
        series = self._of(("memo", key))
        with series.lock:
            kept = series.live
            if kept is None or now - kept[0] >= self.ttl:
                kept = series.live = (now, 0.0, [], build())
            value: V = kept[3]
            return value

    def _read(self, read: Read[V], window: Window) -> tuple[list[V], Any]:
        self.reads += 1
        return read(window)


# -- what the charts read -------------------------------------------------------------------------


def run_buckets(
    cache: HistoryCache, store: Any, window: Window, assignee: str | None
) -> list[Bucket]:
    """The board's runs per bucket (:meth:`~dispatcher.kanban.abc.BoardStore.run_buckets`)."""
    answers, _ = cache.get(
        ("runs", assignee), window, lambda w: (store.run_buckets(w, assignee=assignee), None)
    )
    return answers


def fire_buckets(
    cache: HistoryCache, ledger: Any, window: Window, job_id: str | None
) -> list[Bucket]:
    """The ledger's fires per bucket (:meth:`~dispatcher.cron.abc.LedgerStore.fire_buckets`)."""
    answers, _ = cache.get(
        ("fires", job_id), window, lambda w: (ledger.fire_buckets(w, job_id=job_id), None)
    )
    return answers


def status_flows(
    cache: HistoryCache, store: Any, window: Window
) -> tuple[dict[str, int], list[Flows]]:
    """The cards per status now and the status changes per bucket
    (:meth:`~dispatcher.kanban.abc.BoardStore.status_flows`); the counts come from the same
    read as the newest buckets' changes, so counting back from them is exact."""

    def read(w: Window) -> tuple[list[Flows], Any]:
        counts, flows = store.status_flows(w)
        return flows, counts

    flows, counts = cache.get(("flows",), window, read)
    return counts, flows
