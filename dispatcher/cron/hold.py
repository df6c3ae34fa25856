"""Holding cron fires back: a fire that may not start now waits, ``queued``, until its start
deadline, then is recorded ``missed`` with the reason it was held.

Whatever keeps this host from starting new work (memory pressure today, a named limit
tomorrow) plugs in as a :data:`Hold`: called with ``now``, it answers the reason in words
(``memory pressure 34 %``) or None. The scheduler asks it before starting claimed fires
(:meth:`dispatcher.cron.scheduler.CronScheduler.set_hold`); a held fire stays claimed (shown
``queued``) and starts as soon as the hold lifts, unless :func:`start_deadline` passed first.

A fire's start deadline is its nominal time plus its job's ``catch_up_window``: a fire later
than that would have been recorded ``missed`` had no scheduler been running at all, so a held
host records it the same way instead of running it hours late. Manual fires (``dispatch cron
run``) are the operator's request and are never held. :func:`split_held` is pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from dispatcher.cron.records import FireRecord, Kind

__all__ = ["Hold", "split_held", "start_deadline"]

Hold = Callable[[float], "str | None"]
"""Why new fires may not start at ``now`` (None: they may)."""


def start_deadline(row: FireRecord, window: float) -> float:
    """The latest instant ``row`` may start: its nominal time plus ``window`` (its job's
    ``catch_up_window``)."""
    return row.nominal + window


def split_held(
    rows: Sequence[FireRecord], now: float, windows: Mapping[str, float]
) -> tuple[list[FireRecord], list[FireRecord]]:
    """Split fires ready to start while held into (waiting, overdue): overdue ones reached their
    start deadline (``windows``: each job's ``catch_up_window``; a job no longer configured has
    none left) and are recorded ``missed``; manual fires are never held, so they are in
    neither list."""
    waiting: list[FireRecord] = []
    overdue: list[FireRecord] = []
    for row in rows:
        if row.kind is Kind.MANUAL:
            continue
        window = windows.get(row.job_id, 0.0)
        (overdue if now >= start_deadline(row, window) else waiting).append(row)
    return waiting, overdue
