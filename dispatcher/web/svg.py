"""The geometry of the history pages' drawings: stacked bars, lines, a time axis, bars on a
timeline. Plain numbers in, plain records out; the templates turn them into SVG elements.

Nothing here is script or style: shapes carry a class (their colour is the stylesheet's, so the
dark theme and the strict Content-Security-Policy both hold); each interval's numbers are text
on the transparent column over it (``data-tip``, which the page's script shows on hover).
Coordinates are in the drawing's own units (:data:`WIDTH` wide); the stylesheet scales the
drawing to the page.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dispatcher.buckets import Window, order_outcomes

WIDTH = 960.0
HEIGHT = 150.0
AXIS = 18.0
"""Room under the plot for the time labels."""
TICKS = 6


@dataclass(frozen=True)
class Segment:
    """One label's part of a stacked bar."""

    label: str
    count: int
    y: float
    height: float


@dataclass(frozen=True)
class Column:
    """One bucket of a chart: where it is, what it holds, its numbers as text (the hover's)
    and, for a bar, the link to what it counts."""

    start: float
    x: float
    width: float
    tip: str
    segments: tuple[Segment, ...] = ()
    href: str = ""


@dataclass(frozen=True)
class Path:
    """Every bar segment of one label, as one outline (one element per label, not per bar:
    a day of five-minute bars stays a few dozen kilobytes)."""

    label: str
    d: str


@dataclass(frozen=True)
class Line:
    """One series of a line chart: its stretches without a gap (each a ``points`` list) and
    its lone points (a bucket between two empty ones)."""

    label: str
    stretches: tuple[str, ...]
    dots: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Tick:
    """A time label on the axis."""

    x: float
    label: str


@dataclass
class Chart:
    """A drawing and the table of the same numbers."""

    id: str
    title: str
    note: str
    kind: str
    """``bars`` or ``lines``."""
    top: str
    """The value at the top of the plot, as text."""
    columns: list[Column] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    legend: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    width: float = WIDTH
    height: float = HEIGHT

    @property
    def empty(self) -> bool:
        """Nothing to draw in the whole window."""
        return not self.rows


def nice(top: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``top`` (1 for nothing)."""
    if top <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(top))
    for step in (1, 2, 5, 10):
        if step * power >= top:
            return float(step * power)
    return float(10 * power)  # unreachable


def duration(seconds: float | None) -> str:
    """A duration for people: ``850 ms``, ``4.2 s``, ``3m12s``, ``2h5m``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def stamp(at: float, zone: dt.tzinfo | None, step: float) -> str:
    """A bucket's start as people read it at this step: the date only for day-long steps."""
    moment = dt.datetime.fromtimestamp(at, tz=dt.UTC).astimezone(zone)
    if step >= 3600:
        return moment.strftime("%m-%d %H:%M")
    return moment.strftime("%H:%M:%S" if step < 60 else "%H:%M")


def ticks(start: float, end: float, zone: dt.tzinfo | None, step: float) -> list[Tick]:
    """:data:`TICKS` + 1 time labels from ``start`` to ``end``, evenly spaced (the page lays
    them out as text under the drawing, so they are never stretched with it)."""
    return [
        Tick(x=i * WIDTH / TICKS, label=stamp(start + i * (end - start) / TICKS, zone, step))
        for i in range(TICKS + 1)
    ]


def bars(
    win: Window,
    counts: Sequence[Mapping[str, int]],
    *,
    href: Callable[[float], str],
    when: Callable[[float], str],
) -> tuple[list[Column], list[Path], list[str], int]:
    """Stacked bars of each bucket's counts (labels in the vocabulary's order): the columns
    (``href(start)`` links a bar to what it counts, ``when(start)`` names its bucket), the
    drawn segments as one :class:`Path` per label, the labels, and the scale's top."""
    labels = order_outcomes(label for bucket in counts for label in bucket)
    top = int(nice(max((sum(b.values()) for b in counts), default=0)))
    slot = WIDTH / win.count
    columns = []
    outlines: dict[str, list[str]] = {label: [] for label in labels}
    for start, bucket in zip(win.edges(), counts, strict=True):
        total = sum(bucket.values())
        if not total:
            continue
        x = round((start - win.start) / win.step * slot, 2)
        base = HEIGHT
        segments = []
        for label in labels:
            n = bucket.get(label, 0)
            if n:
                height = n / top * HEIGHT
                base -= height
                segment = Segment(label, n, round(base, 2), round(height, 2))
                segments.append(segment)
                outlines[label].append(
                    f"M{_num(x)} {_num(segment.y)}h{_num(round(slot, 2))}"
                    f"v{_num(segment.height)}h-{_num(round(slot, 2))}z"
                )
        parts = ", ".join(f"{s.label} {s.count}" for s in segments)
        tip = f"{when(start)}: {total} ({parts})"
        columns.append(Column(start, x, round(slot, 2), tip, tuple(segments), href(start)))
    paths = [Path(label, "".join(outlines[label])) for label in labels]
    return columns, paths, labels, top


def _num(value: float) -> str:
    """A coordinate as short as it reads (``3.3``, ``150``)."""
    return f"{value:g}"


def lines(
    win: Window,
    series: Mapping[str, Sequence[float | None]],
    *,
    tip: Callable[[int], str | None],
) -> tuple[list[Line], list[Column], float]:
    """Line series scaled together, a hover column per bucket that has a value (``tip(i)``
    says what it shows; None: no column), and the scale's top."""
    top = nice(max((v for vs in series.values() for v in vs if v is not None), default=0.0))
    slot = WIDTH / win.count
    drawn = []
    for label, values in series.items():
        points: list[list[tuple[float, float]]] = [[]]
        for i, value in enumerate(values):
            if value is None:
                points.append([])
                continue
            points[-1].append((round((i + 0.5) * slot, 2), round(HEIGHT - value / top * HEIGHT, 2)))
        stretches = tuple(" ".join(f"{x},{y}" for x, y in run) for run in points if len(run) > 1)
        dots = tuple(run[0] for run in points if len(run) == 1)
        drawn.append(Line(label, stretches, dots))
    columns = []
    for i, start in enumerate(win.edges()):
        text = tip(i)
        if text is not None:
            columns.append(Column(start, round(i * slot, 2), round(slot, 2), text))
    return drawn, columns, top


@dataclass(frozen=True)
class Span:
    """A bar on a timeline: from ``x`` for ``width``, clipped to the window."""

    x: float
    width: float


def span_of(
    start: float, end: float, begin: float, finish: float | None, now: float
) -> Span | None:
    """Where something that lasted from ``begin`` to ``finish`` (None: still going, so until
    ``now``) is drawn in the window ``[start, end)``; None when it lies outside. A bar is at
    least one unit wide, so the shortest run can still be seen and clicked."""
    until = now if finish is None else finish
    if until < start or begin >= end:
        return None
    scale = WIDTH / (end - start)
    left = (max(begin, start) - start) * scale
    right = (min(until, end) - start) * scale
    return Span(round(left, 2), round(max(1.0, right - left), 2))
