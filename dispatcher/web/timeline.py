"""The run timeline (``GET /timeline``): every run of a window as a bar from its claim to its
end, a row per host (cluster mode) or per assignee, cron fires as ticks on their job's row.

It shows at a glance what the charts add up: runs side by side (a row grows a lane per run that
overlaps another), gaps, a card's retries one after the other, a host that went quiet. A bar is
coloured by its outcome (an open run: ``running``, drawn to now) and links to its run; hovering
shows what it was. The window is in the URL: ``end`` (epoch seconds; none: now, and the page
follows the clock) and ``span`` (a duration, ``1h`` by default); the links zoom in and out
around the middle and move by half a window.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from dispatcher.cron.history import fire_time
from dispatcher.cron.records import FireRecord
from dispatcher.kanban.history import RunLine
from dispatcher.timefmt import viewer_zone
from dispatcher.web import svg
from dispatcher.web.charts import link
from dispatcher.web.errors import FormError
from dispatcher.web.pages import site_of
from dispatcher.web.site import Site
from scope.foundation.values import Invalid, parse_duration

SPANS = ("15m", "1h", "6h", "24h", "7d")
DEFAULT_SPAN = 3600.0
MIN_SPAN = 60.0
MAX_SPAN = 31 * 86400.0
BARS = 2000
"""Runs drawn at most (a wider window than that holds says so; zoom in)."""
LANES = 8
"""Lanes a row grows at most; runs beyond overlap in the last one."""


@dataclass(frozen=True)
class Bar:
    """One run on a row."""

    line: RunLine
    lane: int
    x: float
    width: float
    tip: str

    @property
    def outcome(self) -> str:
        """Its colour's name: the outcome, or ``running`` while open."""
        return self.line.run.outcome.value if self.line.run.outcome else "running"


@dataclass(frozen=True)
class Tick:
    """One cron fire on its job's row."""

    fire: FireRecord
    x: float
    tip: str

    @property
    def outcome(self) -> str:
        """Its colour's name."""
        return self.fire.shown_outcome


@dataclass
class Row:
    """A host's, an assignee's or a cron job's row."""

    name: str
    kind: str
    bars: list[Bar] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    lanes: int = 1


def lanes(spans: Sequence[tuple[float, float]]) -> list[int]:
    """The lane of each ``(left, right)`` span (in the order given, sorted by ``left``): the
    first lane whose last span ended before it starts, at most :data:`LANES`."""
    ends: list[float] = []
    chosen = []
    for left, right in spans:
        for lane, end in enumerate(ends):
            if end <= left:
                ends[lane] = right
                chosen.append(lane)
                break
        else:
            if len(ends) < LANES:
                ends.append(right)
                chosen.append(len(ends) - 1)
            else:
                chosen.append(LANES - 1)
    return chosen


def window_of(request: Request, now: float) -> tuple[float, float, bool]:
    """``(start, end, following)`` from the URL (``following``: no ``end``, so now)."""
    query = request.query_params
    try:
        span = parse_duration(query.get("span") or DEFAULT_SPAN)
    except Invalid:
        raise FormError("span", "give a duration: 15m, 1h, 6h, 24h, 7d") from None
    span = min(MAX_SPAN, max(MIN_SPAN, span))
    text = query.get("end")
    if not text:
        return now - span, now, True
    try:
        end = float(text)
    except ValueError:
        raise FormError("end", "give the window's end as epoch seconds") from None
    if not end < float("inf"):
        raise FormError("end", "give the window's end as epoch seconds")
    end = min(end, now)
    return end - span, end, end >= now


def rows_of(
    runs: Iterable[RunLine],
    fires: Iterable[FireRecord],
    start: float,
    end: float,
    now: float,
    *,
    by_host: bool,
    when: Any,
) -> list[Row]:
    """The rows of the window: one per host or assignee (by name), then one per cron job."""
    rows: dict[str, Row] = {}
    placed: dict[str, list[tuple[RunLine, svg.Span]]] = {}
    for line in runs:
        span = svg.span_of(start, end, line.run.claimed_at, line.run.ended_at, now)
        if span is None:
            continue
        name = (line.host or "?") if by_host else line.assignee
        placed.setdefault(name, []).append((line, span))
    for name in sorted(placed):
        row = rows[name] = Row(name, "host" if by_host else "assignee")
        items = sorted(placed[name], key=lambda item: (item[1].x, item[0].run.run_id))
        chosen = lanes([(s.x, s.x + s.width) for _, s in items])
        for (line, span), lane in zip(items, chosen, strict=True):
            row.bars.append(Bar(line, lane, span.x, span.width, _run_tip(line, when)))
        row.lanes = max(chosen, default=0) + 1
    jobs: dict[str, Row] = {}
    for fire in fires:
        at = fire.actual or fire.started_at or fire_time(fire) or fire.decided_at
        if not start <= at < end:
            continue
        row = jobs.setdefault(fire.job_id, Row(fire.job_id, "cron"))
        x = round((at - start) * svg.WIDTH / (end - start), 2)
        tip = f"cron {fire.job_id}: {fire.shown_outcome} at {when(at)} ({fire.fire_key})"
        row.ticks.append(Tick(fire, x, tip))
    return list(rows.values()) + [jobs[name] for name in sorted(jobs)]


def _run_tip(line: RunLine, when: Any) -> str:
    run = line.run
    outcome = run.outcome.value if run.outcome else "running"
    ended = f"ended {when(run.ended_at)}" if run.ended_at is not None else "still running"
    return (
        f"{line.title} ({run.card_id}): run {run.run_id}, attempt {run.attempt}, {outcome};"
        f" claimed {when(run.claimed_at)}, {ended}"
    )


def timeline_context(site: Site, request: Request, now: float | None = None) -> dict[str, Any]:
    """The window in the URL, its rows, and the links that move and zoom it."""
    now = time.time() if now is None else now
    start, end, following = window_of(request, now)
    span = end - start
    source = site.source
    zone = viewer_zone(source.environ)
    fine = min(span / 20, 59.0)

    def when(at: float) -> str:
        return svg.stamp(at, zone, fine)

    runs = source.store.runs_in(start, end, limit=BARS + 1)
    fires = [*source.ledger().fires_in(start, end, limit=BARS), *source.ledger().open_rows()]
    rows = rows_of(
        runs[:BARS], fires, start, end, now, by_host=source.cluster_configured, when=when
    )
    middle = start + span / 2

    def at(new_end: float, new_span: float) -> str:
        new_end = min(new_end, now)
        keep = None if new_end >= now else f"{new_end:.0f}"
        return link("/timeline", end=keep, span=f"{new_span:.0f}s")

    kept_end = None if following else f"{end:.0f}"
    moves = {
        "earlier": at(end - span / 2, span),
        "later": at(end + span / 2, span),
        "zoom_in": at(middle + span / 4, span / 2),
        "zoom_out": at(middle + span, span * 2),
        "now": link("/timeline", span=f"{span:.0f}s"),
    }
    context = site.context(request, title="Timeline", nav="timeline")
    context.update(
        rows=rows,
        start=start,
        end=end,
        span=svg.duration(span),
        spans=[(s, link("/timeline", end=kept_end, span=s)) for s in SPANS],
        following=following,
        moves=moves,
        ticks=svg.ticks(start, end, zone, span / svg.TICKS),
        truncated=len(runs) > BARS,
        bars=BARS,
        by_host=source.cluster_configured,
        width=svg.WIDTH,
        lane_height=12,
    )
    return context


async def timeline(request: Request) -> Response:
    """``GET /timeline``."""
    site = site_of(request)
    return await site.render("timeline.html", lambda: timeline_context(site, request))
