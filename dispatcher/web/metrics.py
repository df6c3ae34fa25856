"""``/metrics``: Prometheus exposition from a collector that reads the state at scrape time.

Nothing is counted in this process's memory on the side: every figure is read from the board,
the ledger, the registry and the doctor's report when Prometheus asks, so two ``dispatch web``
on one state dir report the same numbers and a restart loses nothing. The one exception is the
ready -> running histogram, which folds the board's append-only event sequence from where the
last scrape stopped (from the beginning after a start).

Families (``dispatch_`` prefix; counters end in ``_total``, times in ``_seconds``):

=========================================== ========= =========================================
``dispatch_cards{status}``                  gauge     cards by status (archived included)
``dispatch_kanban_paused``                  gauge     1 while claiming is paused
``dispatch_kanban_runs_open``               gauge     runs without an outcome
``dispatch_kanban_runs_total``              counter   closed runs by ``outcome`` and
                                                      ``infrastructure`` (true: never counted
                                                      against the card)
``dispatch_kanban_ready_to_running_seconds`` histogram from a card's last change before its
                                                      claim (it became ready) to its worker
                                                      spawned
``dispatch_kanban_retries_total{reason}``   counter   retries scheduled by the retry policy:
                                                      ``backoff`` (counted), ``uncounted``
                                                      (exit 75, ``counted: false``) and
                                                      ``deferred`` (the worker's ``defer``;
                                                      deferred runs end with the outcome
                                                      ``deferred`` in ``_runs_total``)
``dispatch_cron_fire_lag_seconds``          histogram due -> started of scheduled fires
``dispatch_cron_fires_total{job,outcome}``  counter   decided fires (retained ledger rows)
``dispatch_cron_retries_total{job,reason}`` counter   tries followed by another try of their
                                                      fire: ``backoff``, ``uncounted`` (also
                                                      infrastructure), ``deferred`` (retained
                                                      rows)
``dispatch_cron_fires_retried_total{job}``  counter   fires that had more than one try
``dispatch_cron_job_paused{job}``           gauge     1 for a paused job
``dispatch_sessions_running{placement}``    gauge     live registry sessions
``dispatch_scope_probe_ok``                 gauge     1 when the probe placed a no-op in a scope
``dispatch_scope_placement{caller,placement}`` gauge  1 for the placement each caller gets now
``dispatch_serve_up``                       gauge     1 while a gateway holds the state dir
``dispatch_keeper_fork_server_up``          gauge     1 while the gateway's keeper fork
                                                      server runs
``dispatch_keepers_forked_total``           counter   keepers the gateway's fork server started
``dispatch_keeper_fallbacks_total{reason}`` counter   keepers started the usual way instead
                                                      (``missing``, ``dead``, ``busy``,
                                                      ``timeout``, ``refused``, ``other``)
``dispatch_relay_answered_total``           counter   short write commands (``kanban add``, the
                                                      worker reports) the gateway answered
``dispatch_relay_declined_total{reason}``   counter   short write commands it left to run on
                                                      their own (``config``, ``command line``,
                                                      ``state dir``, ``busy``, ...)
``dispatch_cluster_host_lease_live{host}``  gauge     cluster mode: 1 while the host's lease is
                                                      live (database clock)
``dispatch_cluster_host_epoch{host}``       gauge     cluster mode: the host's lease epoch
``dispatch_admission_held{reason}``         gauge     1 for each reading that holds new work
                                                      now (memory_pressure, memory_available,
                                                      cpu_pressure)
``dispatch_admission_memory_pressure_percent`` gauge PSI memory ``some avg10`` (absent
                                                      without PSI)
``dispatch_admission_cpu_pressure_percent``  gauge    PSI cpu ``some avg10``
``dispatch_admission_memory_available_bytes`` gauge   ``MemAvailable``
``dispatch_limit_in_use{limit}``            gauge     runs and cron fires holding a named limit
``dispatch_limit_capacity{limit}``          gauge     its concurrency cap (limits that have one)
``dispatch_limit_waiting{limit}``           gauge     ready cards and cron fires it holds back
``dispatch_limit_window_starts{limit}``     gauge     starts its rate window counts now
``dispatch_limit_window_capacity{limit}``   gauge     starts the rate window allows
``dispatch_state_readable``                 gauge     0 when the state could not be read
=========================================== ========= =========================================

The keeper families count from the gateway's start (its status file, refreshed every 5 s);
Prometheus' ``rate()`` treats a restart as a counter reset. The cron families cover the ledger
rows still kept (``cron`` prunes old ones), so they can
drop; Prometheus' ``rate()`` treats that as a counter reset.
"""

from __future__ import annotations

import bisect
import collections
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dispatcher.gateway.admission import admission_status
from dispatcher.kanban.model import Event
from dispatcher.launch.admission import SIGNALS
from dispatcher.web.source import Source
from scope.foundation.errors import DispatchError

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
_BATCH = 5000
_DONE_KINDS = frozenset({"completed", "archived"})

_log = logging.getLogger("dispatch.web")


class Histogram:
    """Observations in fixed buckets, as a Prometheus histogram family."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        """The cumulative buckets (``le``), ``+Inf``, count and sum."""
        cumulative, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            cumulative.append((bound, float(running)))
        return HistogramMetricFamily(name, documentation, buckets=cumulative, sum_value=self.total)


class ReadyToRunning:
    """Folds the board's events into the ready -> running histogram (see the module
    docstring): a claim remembers when its card last changed before it, the run's ``spawned``
    event observes the difference."""

    def __init__(self) -> None:
        self.seq = 0
        self.histogram = Histogram(LATENCY_BUCKETS)
        self._last: dict[str, float] = {}
        self._claimed: collections.OrderedDict[str, float] = collections.OrderedDict()

    def fold(self, event: Event) -> None:
        """Take one event (in sequence order)."""
        run = event.run_id or ""
        if event.kind == "claimed":
            self._claimed[run] = self._last.get(event.card_id, event.at)
            while len(self._claimed) > 10_000:
                self._claimed.popitem(last=False)
        elif event.kind == "spawned":
            since = self._claimed.pop(run, None)
            if since is not None:
                self.histogram.observe(max(0.0, event.at - since))
        elif run in self._claimed:
            self._claimed.pop(run)  # refused or closed before a worker ran
        done = event.kind in _DONE_KINDS or event.data.get("to") == "done"
        if done:
            self._last.pop(event.card_id, None)  # a done card's next change starts afresh
        else:
            self._last[event.card_id] = event.at
        self.seq = event.seq


RETRY_REASONS = ("backoff", "uncounted", "deferred")


class RetryTally:
    """Folds the board's events into retries scheduled by reason (see the module docstring):
    a failure event that set ``retry_at`` is a retry behind the back-off, counted unless it
    says ``counted: false`` (or was an exit 75); a ``deferred`` event is the worker's own."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(RETRY_REASONS, 0)

    def fold(self, event: Event) -> None:
        """Take one event (in sequence order)."""
        if event.kind == "deferred":
            self.counts["deferred"] += 1
        elif event.kind in ("failed", "tempfail") and event.data.get("retry_at") is not None:
            counted = event.kind == "failed" and event.data.get("counted", True)
            self.counts["backoff" if counted else "uncounted"] += 1

    def family(self) -> CounterMetricFamily:
        """``dispatch_kanban_retries_total`` by reason."""
        family = CounterMetricFamily(
            "dispatch_kanban_retries",
            "Kanban retries scheduled by the retry policy, by reason",
            labels=["reason"],
        )
        for reason in RETRY_REASONS:
            family.add_metric([reason], self.counts[reason])
        return family


class DispatchCollector(Collector):
    """The collector (see the module docstring); register it on a private registry."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._latency = ReadyToRunning()
        self._retries = RetryTally()
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        """Nothing up front: the families are only known by reading the state."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Read everything now; a part that cannot be read is left out and
        ``dispatch_state_readable`` says so."""
        readable = 1.0
        for part in (self._board, self._cron, self._host, self._admission, self._limits):
            try:
                yield from list(part())
            except (DispatchError, OSError, ValueError) as err:
                _log.warning("dispatch web: /metrics: %s", getattr(err, "message", err))
                readable = 0.0
        if self.source.cluster_configured:
            try:
                yield from list(self._cluster())
            except Exception as err:  # the cluster database may be away: say so, keep serving
                _log.warning("dispatch web: /metrics: cluster: %s", err)
                readable = 0.0
        yield GaugeMetricFamily(
            "dispatch_state_readable", "0 when part of the state could not be read", readable
        )

    def _board(self) -> Iterator[Metric]:
        store = self.source.store
        cards = GaugeMetricFamily("dispatch_cards", "Cards by status", labels=["status"])
        for status, count in store.status_counts().items():
            cards.add_metric([status.value], count)
        yield cards
        yield GaugeMetricFamily(
            "dispatch_kanban_paused", "1 while claiming is paused", float(store.paused())
        )
        yield GaugeMetricFamily(
            "dispatch_kanban_runs_open", "Runs without an outcome", len(store.open_runs())
        )
        runs = CounterMetricFamily(
            "dispatch_kanban_runs",
            "Closed kanban runs by outcome; infrastructure=true ones never count against a card",
            labels=["outcome", "infrastructure"],
        )
        for (outcome, infrastructure), count in sorted(store.outcome_counts().items()):
            runs.add_metric([outcome.value, str(infrastructure).lower()], count)
        yield runs
        with self._lock:
            while True:
                batch = store.events_after(self._latency.seq, limit=_BATCH)
                for event in batch:
                    self._latency.fold(event)
                    self._retries.fold(event)
                if len(batch) < _BATCH:
                    break
            yield self._latency.histogram.family(
                "dispatch_kanban_ready_to_running_seconds",
                "From a card becoming ready to its worker spawned",
            )
            yield self._retries.family()

    def _cron(self) -> Iterator[Metric]:
        ledger = self.source.ledger()
        lag = Histogram(LAG_BUCKETS)
        for value in ledger.fire_lags():
            lag.observe(value)
        yield lag.family("dispatch_cron_fire_lag_seconds", "Due to started, scheduled fires")
        fires = CounterMetricFamily(
            "dispatch_cron_fires", "Decided cron fires (kept rows)", labels=["job", "outcome"]
        )
        for (job_id, outcome), count in sorted(ledger.outcome_counts().items()):
            fires.add_metric([job_id, outcome], count)
        yield fires
        counts = ledger.retry_counts()
        retries = CounterMetricFamily(
            "dispatch_cron_retries",
            "Tries followed by another try of their fire, by reason (kept rows)",
            labels=["job", "reason"],
        )
        for (job_id, reason), count in sorted(counts.retries.items()):
            retries.add_metric([job_id, reason], count)
        yield retries
        retried = CounterMetricFamily(
            "dispatch_cron_fires_retried",
            "Fires with more than one try (kept rows)",
            labels=["job"],
        )
        for job_id, count in sorted(counts.fires.items()):
            retried.add_metric([job_id], count)
        yield retried
        paused = GaugeMetricFamily("dispatch_cron_job_paused", "1 for a paused job", labels=["job"])
        states = ledger.job_states()
        for job in self.source.settings.cron.jobs:
            state = states.get(job.id)
            paused.add_metric([job.id], float(bool(state and state.paused)))
        yield paused

    def _host(self) -> Iterator[Metric]:
        source = self.source
        sessions = GaugeMetricFamily(
            "dispatch_sessions_running", "Live registry sessions", labels=["placement"]
        )
        placed = collections.Counter(s.placement.value for s in source.registry().list_sessions())
        for placement in ("in_process", "scoped", "degraded"):
            sessions.add_metric([placement], placed.get(placement, 0))
        yield sessions
        yield GaugeMetricFamily(
            "dispatch_serve_up", "1 while a gateway holds the state dir", source.gateway_running()
        )
        yield from _keepers(source.keepers())
        yield from _relay(source.relay())
        report = source.doctor()
        yield GaugeMetricFamily(
            "dispatch_scope_probe_ok",
            "1 when the probe placed a no-op in a systemd scope",
            float(bool(report["probe"]["ok"])),
        )
        verdicts = GaugeMetricFamily(
            "dispatch_scope_placement",
            "1 for the placement each caller gets now (refused: none)",
            labels=["caller", "placement"],
        )
        for caller, placement in sorted(report["placement"].items()):
            verdicts.add_metric([caller, str(placement)], 1)
        yield verdicts

    def _admission(self) -> Iterator[Metric]:
        source = self.source
        status = admission_status(source.state_dir, source.environ, source.settings.admission)
        held = GaugeMetricFamily(
            "dispatch_admission_held",
            "1 for each reading that holds new claims and cron starts now",
            labels=["reason"],
        )
        for signal in SIGNALS:
            held.add_metric([signal], float(signal in status["reasons"]))
        yield held
        readings = status["readings"]
        for key, name, text in (
            ("memory_pressure", "memory_pressure_percent", "PSI memory some avg10"),
            ("cpu_pressure", "cpu_pressure_percent", "PSI cpu some avg10"),
            ("memory_available", "memory_available_bytes", "MemAvailable"),
        ):
            if readings[key] is not None:
                yield GaugeMetricFamily(f"dispatch_admission_{name}", text, readings[key])

    def _limits(self) -> Iterator[Metric]:
        """The named limits, from ``dispatch limits``'s own document."""
        doc = self.source.limits()
        families = {
            "in_use": GaugeMetricFamily(
                "dispatch_limit_in_use", "Runs and cron fires holding the limit", labels=["limit"]
            ),
            "capacity": GaugeMetricFamily(
                "dispatch_limit_capacity", "The limit's concurrency cap", labels=["limit"]
            ),
            "waiting": GaugeMetricFamily(
                "dispatch_limit_waiting",
                "Ready cards and cron fires the limit holds back",
                labels=["limit"],
            ),
            "window_starts": GaugeMetricFamily(
                "dispatch_limit_window_starts",
                "Starts the limit's rate window counts now",
                labels=["limit"],
            ),
            "window_capacity": GaugeMetricFamily(
                "dispatch_limit_window_capacity",
                "Starts the limit's rate window allows",
                labels=["limit"],
            ),
        }
        for entry in doc:
            label = [entry["name"]]
            families["in_use"].add_metric(label, entry["in_use"])
            waiting = entry["waiting_cards"] + len(entry["waiting_fires"])
            families["waiting"].add_metric(label, waiting)
            for key in ("capacity", "window_starts", "window_capacity"):
                if entry[key] is not None:
                    families[key].add_metric(label, entry[key])
        yield from families.values()

    def _cluster(self) -> Iterator[Metric]:
        live = GaugeMetricFamily(
            "dispatch_cluster_host_lease_live", "1 while the host's lease is live", labels=["host"]
        )
        epoch = GaugeMetricFamily(
            "dispatch_cluster_host_epoch", "The host's lease epoch", labels=["host"]
        )
        for row in self.source.hosts():
            live.add_metric([row.host_id], float(row.live))
            epoch.add_metric([row.host_id], row.epoch)
        yield live
        yield epoch


def _keepers(keepers: dict[str, Any] | None) -> Iterator[Metric]:
    """The gateway's keeper fork server: up, keepers forked, fallbacks by reason."""
    found = keepers or {}
    yield GaugeMetricFamily(
        "dispatch_keeper_fork_server_up",
        "1 while the gateway's keeper fork server runs",
        float(bool(found.get("running"))),
    )
    yield CounterMetricFamily(
        "dispatch_keepers_forked",
        "Keepers the gateway's fork server started",
        int(found.get("forked") or 0),
    )
    yield _by_reason(
        "dispatch_keeper_fallbacks",
        "Keepers started the usual way although the gateway has a fork server",
        found.get("fallbacks"),
    )


def _relay(relay: dict[str, Any] | None) -> Iterator[Metric]:
    """The gateway's short-write relay: commands answered, and declined by reason."""
    found = relay or {}
    yield CounterMetricFamily(
        "dispatch_relay_answered",
        "Short write commands (kanban add and the worker reports) the gateway answered",
        int(found.get("answered") or 0),
    )
    yield _by_reason(
        "dispatch_relay_declined",
        "Short write commands the gateway left to run on their own",
        found.get("declined"),
    )


def _by_reason(name: str, documentation: str, counts: dict[str, int] | None) -> Metric:
    """A counter labelled ``reason``, one sample per reason of ``counts`` (a status file's)."""
    family = CounterMetricFamily(name, documentation, labels=["reason"])
    for reason, count in sorted((counts or {}).items()):
        family.add_metric([str(reason)], int(count))
    return family


def metrics_registry(source: Source) -> CollectorRegistry:
    """A private registry holding only the collector (no process or platform metrics of the
    web process itself: they describe the dashboard, not the dispatcher)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DispatchCollector(source))
    return registry
