"""The cron ledger's history as the history pages read it: fires per bucket, fires in a window.

A fire is counted when it was settled: at its end (``ended_at``) when a worker ran or was
refused, else, for a decision that never became a worker (``skipped_overlap``, ``missed``,
``coalesced``), when it was decided. Each measure is a spread per bucket
(:class:`~dispatcher.buckets.Spread`): ``lag``, from a scheduled fire's due time to its start
(as ``/metrics``' ``dispatch_cron_fire_lag_seconds``), and ``run``, from start to end.

:class:`SqlFireHistory` reads two index ranges (``cron_fires_ended`` on the end time;
``cron_fires_decided``, a partial index of the rows without one, on the decision time) and
streams them through :func:`fire_tally`, as the in-memory ledger streams its records
(:func:`fire_buckets`), for the buckets the rollup does not hold (:mod:`dispatcher.rollup`:
the stored answers of settled buckets, whole and per job); :func:`fires_in` is the same list
over records.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from dispatcher import rollup
from dispatcher.buckets import Bucket, Sample, Window, tally
from dispatcher.cron.records import FireRecord, Kind, Status

__all__ = ["FireRow", "SqlFireHistory", "fire_buckets", "fire_tally", "fire_time", "fires_in"]


def fire_time(fire: FireRecord) -> float | None:
    """When a fire counts (see the module docstring); None while it is not settled."""
    if fire.status is not Status.DONE:
        return None
    return fire.ended_at if fire.ended_at is not None else fire.decided_at


FireRow = tuple[float, str, str, float | None, float | None, float | None, float | None]
"""A settled fire as the charts read it: (its time, outcome, kind, due_at, actual, started_at,
ended_at)."""


MEASURES = ("lag", "run")
"""The spreads of a bucket of fires."""


def fire_samples(rows: Iterable[FireRow]) -> Iterator[Sample]:
    """Settled fires as samples counted at their time (:func:`fire_time`), by outcome: ``lag``
    (due → start, scheduled fires) and ``run`` (start → end) of those that ended. Every ledger
    reads its fires through this one rule."""
    for at, outcome, kind, due, actual, started, ended in rows:
        lag = run = None
        if ended is not None:
            if kind == Kind.SCHEDULE.value and actual is not None and due is not None:
                lag = max(0.0, actual - due)
            if started is not None:
                run = ended - started
        yield at, outcome, (lag, run)


def fire_tally(win: Window, rows: Iterable[FireRow]) -> list[Bucket]:
    """Per bucket, the settled fires counted at their time (:func:`fire_samples`)."""
    return tally(win, MEASURES, fire_samples(rows))


def fire_buckets(win: Window, fires: Iterable[FireRecord], job_id: str | None) -> list[Bucket]:
    """:meth:`~dispatcher.cron.abc.LedgerStore.fire_buckets` over records."""
    return fire_tally(
        win,
        (
            (at, f.outcome.value, f.kind.value, f.due_at, f.actual, f.started_at, f.ended_at)
            for f in fires
            if job_id in (None, f.job_id)
            and f.outcome is not None
            and (at := fire_time(f)) is not None
        ),
    )


def fires_in(
    fires: Iterable[FireRecord],
    start: float,
    end: float,
    *,
    job_id: str | None,
    outcome: str | None,
    limit: int,
) -> list[FireRecord]:
    """The settled fires whose time is in ``[start, end)``, by that time."""
    found = [
        f
        for f in fires
        if (t := fire_time(f)) is not None
        and start <= t < end
        and job_id in (None, f.job_id)
        and outcome in (None, f.outcome)
    ]
    found.sort(key=lambda f: (fire_time(f) or 0.0, f.id))
    return found[: max(0, limit)]


class SqlFireHistory:
    """The ledger's history reads in SQL (mixed into :class:`dispatcher.cron.ledger.Ledger`)."""

    db: Any
    rollup_steps: tuple[float, ...] = rollup.STEPS
    """The steps whose buckets :meth:`roll_up` stores (tests roll up shorter ones)."""

    def _ranges(self, job_id: str | None) -> list[tuple[str, str, list[Any]]]:
        """(time column, condition on it, extra parameters) of the two index ranges."""
        where, extra = (" AND job_id = ?", [job_id]) if job_id is not None else ("", [])
        return [
            ("ended_at", f"ended_at >= ? AND ended_at < ?{where}", extra),
            (
                "decided_at",
                f"ended_at IS NULL AND decided_at >= ? AND decided_at < ?"
                f" AND status = 'done'{where}",
                extra,
            ),
        ]

    def fire_buckets(self, window: Window, *, job_id: str | None = None) -> list[Bucket]:
        """See :meth:`dispatcher.cron.abc.LedgerStore.fire_buckets`."""
        with self.db.read() as conn:
            found = {}
            if rollup.rolled(window, self.rollup_steps):
                found = {
                    i: rollup.decode_split(text, job_id)
                    for i, text in rollup.stored(conn, "fires", window).items()
                }
            return rollup.assemble(
                window,
                found,
                lambda w: fire_tally(
                    w, (tuple(row[:7]) for row in self._fire_rows(conn, w, job_id))
                ),
            )

    def _fire_rows(self, conn: Any, window: Window, job_id: str | None) -> list[Any]:
        """The settled fires (of ``job_id``) whose time is in ``window``, as :data:`FireRow`
        followed by the job's id."""
        rows: list[Any] = []
        for column, inside, extra in self._ranges(job_id):
            rows += conn.execute(
                f"SELECT {column}, outcome, kind, due_at, actual, started_at, ended_at,"  # noqa: S608
                f" job_id FROM cron_fires WHERE {inside} AND status = 'done'"
                " AND outcome IS NOT NULL",
                [window.start, window.end, *extra],
            ).fetchall()
        return rows

    def roll_up(self, now: float, *, spans: int = 12) -> int:
        """See :meth:`dispatcher.cron.abc.LedgerStore.roll_up`."""
        with self.db.read() as conn:
            # The first row's decision, a span early: rows come roughly in decision order.
            first = conn.execute("SELECT decided_at FROM cron_fires ORDER BY id LIMIT 1").fetchone()
            oldest = None if first is None else float(first[0]) - rollup.span_of(self.rollup_steps)
            todo = rollup.todo(conn, ("fires",), now, self.rollup_steps, oldest)
        return rollup.roll(self.db, todo[: max(0, spans)], self._roll_span, ("fires",), now)

    def _roll_span(self, conn: Any, wanted: list[tuple[float, float]]) -> int:
        """Count and store the answers of ``wanted`` buckets (one span's) that are still
        missing, inside the caller's write transaction (see :mod:`dispatcher.rollup`)."""
        fine = rollup.fine_window(wanted, self.rollup_steps)
        have = rollup.present(conn, "fires", self.rollup_steps, fine.start, fine.end)
        missing = [bucket for bucket in wanted if bucket not in have]
        rows = self._fire_rows(conn, fine, None)
        keyed = zip(
            (str(row[7]) for row in rows),
            fire_samples(tuple(row[:7]) for row in rows),
            strict=True,
        )
        return rollup.store(conn, "fires", rollup.split_answers(fine, MEASURES, keyed, missing))

    def fires_in(
        self,
        start: float,
        end: float,
        *,
        job_id: str | None = None,
        outcome: str | None = None,
        limit: int = 500,
    ) -> list[FireRecord]:
        """See :meth:`dispatcher.cron.abc.LedgerStore.fires_in`."""
        found: list[FireRecord] = []
        limit = max(0, int(limit))
        with self.db.read() as conn:
            for column, inside, extra in self._ranges(job_id):
                more, params = "", [start, end, *extra]
                if outcome is not None:
                    more, params = " AND outcome = ?", [*params, outcome]
                rows = conn.execute(
                    f"SELECT * FROM cron_fires WHERE {inside}{more} AND status = 'done'"  # noqa: S608
                    f" ORDER BY {column}, id LIMIT ?",
                    [*params, limit],
                ).fetchall()
                found += [FireRecord.from_row(row) for row in rows]
        found.sort(key=lambda f: (fire_time(f) or 0.0, f.id))
        return found[:limit]
