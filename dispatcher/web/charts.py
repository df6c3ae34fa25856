"""The charts page (``GET /charts``), the strip on the board, and the runs or fires behind a
bar (``GET /charts/runs``, ``GET /charts/fires``).

What each chart counts (docs/web.md, "Charts"):

* **Runs finished**, stacked by outcome: closed runs, in the interval they ended in;
* **Cron fires**, stacked by outcome: settled fires, when they settled (a decision that never
  became a worker, such as ``skipped_overlap``, when it was decided);
* **Queue depth**: cards ready, running and blocked at the end of each interval, counted back
  from the board's counts now by undoing each later status change its events record
  (:func:`dispatcher.buckets.depth`);
* **Wait** (ready → running) and **run time** of the runs that ended in each interval, and the
  **lag** (due → started) and run time of the fires, as p50, p90 and p99.

The URL holds the range (``1h``, ``24h``, ``7d``, ``30d``) and the filters (``assignee`` for
the runs' charts, ``job`` for the fires'), so a view can be shared. Every number comes from
the per-bucket cache (:mod:`dispatcher.web.history`).
"""

from __future__ import annotations

import math
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from dispatcher import buckets
from dispatcher.buckets import QUANTILES, Bucket, Window
from dispatcher.timefmt import viewer_zone
from dispatcher.web import history, svg
from dispatcher.web.errors import FormError
from dispatcher.web.pages import site_of
from dispatcher.web.site import Site

DEPTH = ("ready", "running", "blocked")
NOTES = {
    "runs": "closed runs by outcome, in the interval they ended",
    "wait": "from the card becoming ready to its worker running, runs that ended in the interval",
    "run": "from the worker starting to the run's end",
    "fires": "settled fires by outcome, when they settled",
    "lag": "from a scheduled fire's due time to its start",
    "firerun": "from a fire's start to its end",
}
STRIP_STEP = 3600.0
STRIP_BARS = 24
LISTED = 500
"""Runs or fires a bar's list shows at most."""


def link(path: str, **params: Any) -> str:
    """``path`` with the query of the ``params`` that are set."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return path + ("?" + urllib.parse.urlencode(kept) if kept else "")


def choices(request: Request) -> dict[str, Any]:
    """The range and filters in the URL (an unknown range is the default one)."""
    query = request.query_params
    chosen = query.get("range", buckets.DEFAULT_RANGE)
    return {
        "range": chosen if chosen in buckets.RANGES else buckets.DEFAULT_RANGE,
        "assignee": query.get("assignee") or None,
        "job": query.get("job") or None,
    }


class Painter:
    """Turns one window's buckets into :class:`~dispatcher.web.svg.Chart` records."""

    def __init__(self, win: Window, environ: Any) -> None:
        self.win = win
        self.zone = viewer_zone(environ)
        self._named: dict[float, str] = {}

    def when(self, start: float) -> str:
        """A bucket as people read it: ``09:05 to 09:10`` (named once per page: every chart,
        hover and table row of a bucket says the same)."""
        named = self._named.get(start)
        if named is None:
            step = self.win.step
            stamp = svg.stamp
            named = f"{stamp(start, self.zone, step)} to {stamp(start + step, self.zone, step)}"
            self._named[start] = named
        return named

    def stacked(
        self,
        ident: str,
        title: str,
        note: str,
        counts: Sequence[Bucket],
        href: Callable[[float], str],
    ) -> svg.Chart:
        """A stacked bar chart of each bucket's counts by label, a bar a link to all it
        counts (``href(start)``)."""
        columns, paths, labels, top = svg.bars(
            self.win, [b.counts for b in counts], href=href, when=self.when
        )
        chart = svg.Chart(ident, title, note, "bars", str(top), columns=columns, legend=labels)
        chart.paths = paths
        chart.ticks = svg.ticks(self.win.start, self.win.end, self.zone, self.win.step)
        chart.headers = ["interval", "total", *labels]
        chart.rows = [
            [self.when(c.start), str(sum(s.count for s in c.segments))]
            + [str(next((s.count for s in c.segments if s.label == label), 0)) for label in labels]
            for c in columns
        ]
        return chart

    def spread(
        self, ident: str, title: str, note: str, found: Sequence[Bucket], measure: str
    ) -> svg.Chart:
        """p50, p90 and p99 of one measure, a line each."""
        spreads = [b.spreads.get(measure) for b in found]
        series = {
            f"p{q}": [s.at(q) if s is not None and s.count else None for s in spreads]
            for q in QUANTILES
        }

        def tip(i: int) -> str | None:
            spread = spreads[i]
            if spread is None or not spread.count:
                return None
            parts = ", ".join(f"p{q} {svg.duration(spread.at(q))}" for q in QUANTILES)
            return f"{self.when(self.win.start + i * self.win.step)}: {parts} (of {spread.count})"

        lines, columns, top = svg.lines(self.win, series, tip=tip)
        chart = svg.Chart(ident, title, note, "lines", svg.duration(top), columns=columns)
        chart.lines, chart.legend = lines, list(series)
        chart.ticks = svg.ticks(self.win.start, self.win.end, self.zone, self.win.step)
        chart.headers = ["interval", "n", *series]
        chart.rows = [
            [self.when(self.win.start + i * self.win.step), str(s.count)]
            + [svg.duration(s.at(q)) for q in QUANTILES]
            for i, s in enumerate(spreads)
            if s is not None and s.count
        ]
        return chart

    def depth(self, series: dict[str, list[int]], now: float) -> svg.Chart:
        """Cards per status at the end of each bucket (the last one: now)."""
        step = self.win.step

        def end(i: int) -> str:
            at = min(now, self.win.start + (i + 1) * step)
            return svg.stamp(at, self.zone, min(step, 59.0))

        def tip(i: int) -> str:
            return f"at {end(i)}: " + ", ".join(f"{s} {series[s][i]}" for s in DEPTH)

        values = {s: [float(v) for v in series[s]] for s in DEPTH}
        lines, columns, top = svg.lines(self.win, values, tip=tip)
        chart = svg.Chart(
            "depth",
            "Queue depth",
            "cards ready, running and blocked at the end of each interval",
            "lines",
            str(int(top)),
            columns=columns,
        )
        chart.lines, chart.legend = lines, list(DEPTH)
        chart.ticks = svg.ticks(self.win.start, self.win.end, self.zone, self.win.step)
        chart.headers = ["at (when a count changed)", *DEPTH]
        last = self.win.count - 1
        changed = [
            i
            for i in range(self.win.count)
            if i in (0, last) or any(series[s][i] != series[s][i - 1] for s in DEPTH)
        ]
        chart.rows = [[end(i)] + [str(series[s][i]) for s in DEPTH] for i in changed]
        return chart


def drawn(site: Site, chosen: dict[str, Any], now: float) -> tuple[Window, Any]:
    """The window and every chart of it, drawn (kept per window and filters for the cache's
    TTL: the drawing is most of a page's time, and fifty dashboards share it)."""
    win = buckets.window(chosen["range"], now)
    key = ("charts", chosen["range"], chosen["assignee"], chosen["job"], win.start)
    return win, site.history.memo(key, lambda: _draw(site, chosen, win, now))


def _draw(site: Site, chosen: dict[str, Any], win: Window, now: float) -> Any:
    source, cache = site.source, site.history
    runs = history.run_buckets(cache, source.store, win, chosen["assignee"])
    fires = history.fire_buckets(cache, source.ledger(), win, chosen["job"])
    counts, flows = history.status_flows(cache, source.store, win)
    paint = Painter(win, source.environ)

    def runs_href(start: float) -> str:
        end = f"{start + win.step:.0f}"
        return link("/charts/runs", start=f"{start:.0f}", end=end, assignee=chosen["assignee"])

    def fires_href(start: float) -> str:
        end = f"{start + win.step:.0f}"
        return link("/charts/fires", start=f"{start:.0f}", end=end, job=chosen["job"])

    who = f" of {chosen['assignee']}" if chosen["assignee"] else ""
    job = f" of {chosen['job']}" if chosen["job"] else ""
    charts = [
        paint.stacked("runs", f"Runs finished{who}", NOTES["runs"], runs, runs_href),
        paint.depth(buckets.depth(counts, flows, DEPTH), now),
        paint.spread("wait", f"Wait{who}", NOTES["wait"], runs, "wait"),
        paint.spread("run", f"Run time{who}", NOTES["run"], runs, "run"),
        paint.stacked("fires", f"Cron fires{job}", NOTES["fires"], fires, fires_href),
        paint.spread("lag", f"Cron lag{job}", NOTES["lag"], fires, "lag"),
        paint.spread("firerun", f"Cron run time{job}", NOTES["firerun"], fires, "run"),
    ]
    return site.renderer.markup("_chart.html", "charts", charts)


def charts_context(site: Site, request: Request, now: float | None = None) -> dict[str, Any]:
    """Every chart for the range and filters in the URL."""
    now = time.time() if now is None else now
    chosen = choices(request)
    win, charts = drawn(site, chosen, now)
    source = site.source
    context = site.context(request, title="Charts", nav="charts")
    context.update(
        charts=charts,
        chosen=chosen,
        ranges=list(buckets.RANGES),
        assignees=sorted(source.settings.kanban.assignees),
        jobs=[j.id for j in source.settings.cron.jobs],
        link=link,
        win=win,
        step=svg.duration(win.step),
    )
    return context


async def charts(request: Request) -> Response:
    """``GET /charts``."""
    site = site_of(request)
    return await site.render("charts.html", lambda: charts_context(site, request))


def strip(site: Site, now: float | None = None) -> Any:
    """The board's strip, drawn: runs finished in each of the last 24 hours (a glance: the
    charts page has the detail); None while there are none."""
    now = time.time() if now is None else now
    last = math.floor(now / STRIP_STEP) * STRIP_STEP
    win = Window(start=last - STRIP_STEP * (STRIP_BARS - 1), step=STRIP_STEP, count=STRIP_BARS)

    def draw() -> Any:
        runs = history.run_buckets(site.history, site.source.store, win, None)
        if not any(b.total for b in runs):
            return None
        paint = Painter(win, site.source.environ)

        def href(start: float) -> str:
            return link("/charts/runs", start=f"{start:.0f}", end=f"{start + win.step:.0f}")

        title = "Runs finished per hour, last 24 h"
        chart = paint.stacked("strip", title, "", runs, href)
        return site.renderer.markup("_chart.html", "chart", chart, False)

    return site.history.memo(("strip", win.start), draw)


# -- the runs and fires behind a bar ------------------------------------------------------------


def _number(request: Request, name: str) -> float:
    text = request.query_params.get(name, "")
    try:
        value = float(text)
    except ValueError:
        raise FormError(name, "give a time as epoch seconds") from None
    if not math.isfinite(value):
        raise FormError(name, "give a time as epoch seconds")
    return value


def bar_context(site: Site, request: Request, what: str) -> dict[str, Any]:
    """The runs (``what="runs"``) or fires that ended in ``[start, end)`` with ``outcome``."""
    start, end = _number(request, "start"), _number(request, "end")
    query = request.query_params
    outcome = query.get("outcome") or None
    source = site.source
    if what == "runs":
        assignee = query.get("assignee") or None
        found: list[Any] = source.store.runs_in(
            start, end, ended=True, outcome=outcome, assignee=assignee, limit=LISTED + 1
        )
        scope = f" of {assignee}" if assignee else ""
    else:
        job = query.get("job") or None
        found = source.ledger().fires_in(start, end, job_id=job, outcome=outcome, limit=LISTED + 1)
        scope = f" of {job}" if job else ""
    zone = viewer_zone(source.environ)
    span = f"{svg.stamp(start, zone, 3600)} to {svg.stamp(end, zone, 3600)}"
    title = f"{'Runs' if what == 'runs' else 'Cron fires'}{scope}, {outcome or 'any outcome'}"
    context = site.context(request, title=title, nav="charts")
    items = found[:LISTED]
    kept = {k: v for k, v in query.items() if k != "outcome"}
    seen = (line.run.outcome for line in items) if what == "runs" else (f.outcome for f in items)
    context.update(
        what=what,
        heading=title,
        span=span,
        items=items,
        more=len(found) > LISTED,
        shown=LISTED,
        # Narrow the bar's list to one of its outcomes (a bar is one link to all of them).
        outcomes=[
            (label, link(request.url.path, **kept, outcome=label))
            for label in buckets.order_outcomes(str(getattr(o, "value", o)) for o in seen if o)
        ]
        if outcome is None
        else [("any outcome", link(request.url.path, **kept))],
    )
    return context


async def bar_runs(request: Request) -> Response:
    """``GET /charts/runs?start=&end=&outcome=&assignee=``."""
    site = site_of(request)
    return await site.render("chart_list.html", lambda: bar_context(site, request, "runs"))


async def bar_fires(request: Request) -> Response:
    """``GET /charts/fires?start=&end=&outcome=&job=``."""
    site = site_of(request)
    return await site.render("chart_list.html", lambda: bar_context(site, request, "fires"))
