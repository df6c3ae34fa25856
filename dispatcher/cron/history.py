"""The cron ledger's history as the history pages read it: fires per bucket, fires in a window.

A fire is counted when it was settled: at its end (``ended_at``) when a worker ran or was
refused, else, for a decision that never became a worker (``skipped_overlap``, ``missed``,
``coalesced``), when it was decided. Each measure is a spread per bucket
(:class:`~dispatcher.buckets.Spread`): ``lag``, from a scheduled fire's due time to its start
(as ``/metrics``' ``dispatch_cron_fire_lag_seconds``), and ``run``, from start to end.

:class:`SqlFireHistory` answers in SQL with two index ranges (``cron_fires_ended`` on the end
time; ``cron_fires_decided``, a partial index of the rows without one, on the decision time);
:func:`fire_buckets` and :func:`fires_in` are the same answers over records, for the in-memory
ledger.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dispatcher.buckets import Bucket, Spread, Window, buckets_of, clamp, ranked_sql, spreads_from
from dispatcher.cron.records import FireRecord, Kind, Status

__all__ = ["SqlFireHistory", "fire_buckets", "fire_time", "fires_in"]


def fire_time(fire: FireRecord) -> float | None:
    """When a fire counts (see the module docstring); None while it is not settled."""
    if fire.status is not Status.DONE:
        return None
    return fire.ended_at if fire.ended_at is not None else fire.decided_at


def fire_buckets(win: Window, fires: Iterable[FireRecord], job_id: str | None) -> list[Bucket]:
    """Per bucket, the settled fires (of ``job_id``): counts by outcome, ``lag`` and ``run``."""
    chosen = [f for f in fires if job_id in (None, f.job_id) and f.outcome is not None]
    labelled = [(t, str(f.outcome)) for f in chosen if (t := fire_time(f)) is not None]
    lags: list[tuple[float, float]] = []
    runs: list[tuple[float, float]] = []
    for f in chosen:
        if f.status is not Status.DONE or f.ended_at is None:
            continue
        if f.kind is Kind.SCHEDULE and f.actual is not None and f.due_at is not None:
            lags.append((f.ended_at, max(0.0, f.actual - f.due_at)))
        if f.started_at is not None:
            runs.append((f.ended_at, f.ended_at - f.started_at))
    return buckets_of(win, labelled, {"lag": lags, "run": runs})


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
    GREATEST: str
    BUCKET = "CAST(({column} - ?) / ? AS INTEGER)"
    """The bucket of ``{column}`` given the window's start and step (PostgreSQL: ``floor``)."""

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
        counts: list[dict[str, int]] = [{} for _ in range(window.count)]
        spreads: dict[str, list[Spread]] = {}
        frame = [window.start, window.end]
        with self.db.read() as conn:
            for column, inside, extra in self._ranges(job_id):
                b = self.BUCKET.format(column=column)
                for row in conn.execute(
                    f"SELECT {b}, outcome, count(*) FROM cron_fires"  # noqa: S608
                    f" WHERE {inside} AND outcome IS NOT NULL GROUP BY 1, 2",
                    [window.start, window.step, *frame, *extra],
                ):
                    at = counts[clamp(row[0], window)]
                    at[str(row[1])] = at.get(str(row[1]), 0) + int(row[2])
            column, inside, extra = self._ranges(job_id)[0]
            b = self.BUCKET.format(column=column)
            measures = {
                "lag": f"{self.GREATEST}(0, actual - due_at)",
                "run": "ended_at - started_at",
            }
            needs = {
                "lag": "kind = 'schedule' AND actual IS NOT NULL AND due_at IS NOT NULL",
                "run": "started_at IS NOT NULL",
            }
            for name, value in measures.items():
                values = (
                    f"SELECT {b} AS b, {value} AS x FROM cron_fires"  # noqa: S608
                    f" WHERE {inside} AND status = 'done' AND {needs[name]}"
                )
                rows = conn.execute(ranked_sql(values), [window.start, window.step, *frame, *extra])
                spreads[name] = spreads_from(rows, window)
        return [
            Bucket(counts[i], {name: per[i] for name, per in spreads.items()})
            for i in range(window.count)
        ]

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
