"""Jinja2 with autoescaping on everywhere, the formatting filters, and HTML responses.

Every value a template prints is escaped (titles, bodies, errors, worker output), so text can
never become markup; ``|safe`` is not used anywhere. Pages are encoded as UTF-8 with
replacement, so no stored string can make a page fail to render.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from starlette.responses import HTMLResponse

from dispatcher import __version__
from dispatcher.launch.resources import human_size, used_text
from dispatcher.timefmt import TimeView, iso, span, viewer_zone
from dispatcher.web.svg import duration

if TYPE_CHECKING:
    from registry.abc import Session

TEMPLATES = Path(__file__).with_name("templates")
STATIC = Path(__file__).with_name("static")


class Html(HTMLResponse):
    """An HTML response that never fails on a string UTF-8 cannot encode."""

    def render(self, content: Any) -> bytes:
        if isinstance(content, str):
            return content.encode("utf-8", "replace")
        return bytes(super().render(content))


def _segment(value: object) -> str:
    """``value`` quoted as one URL path segment."""
    return urllib.parse.quote(str(value), safe="")


def _ago(at: float | None, now: float) -> str:
    return "-" if at is None else span(now - at)


def _span(seconds: float | None) -> str:
    return "-" if seconds is None else span(seconds)


def environment(environ: Mapping[str, str] | None = None) -> jinja2.Environment:
    """The template environment (autoescape on for every template, undefined names fail).

    Times follow the CLI's one display rule (:class:`dispatcher.timefmt.TimeView`) in the zone
    ``environ``'s ``TZ`` names (else the system's): ``|at`` is ``09:00:05 CET (3h ago)``, the
    date added when it is not today; ``|clock`` is the same without the distance, for a place
    that shows a live-ticking distance beside it."""
    zone = viewer_zone(environ or {})

    def times() -> TimeView:
        return TimeView(now=time.time(), zone=zone)

    def at(when: float | None, at_zone: str | None = None) -> str:
        return times().both(when, at_zone)

    def clock(when: float | None, at_zone: str | None = None) -> str:
        return times().at(when, at_zone)

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters.update(
        seg=_segment,
        iso=iso,
        at=at,
        clock=clock,
        span=_span,
        duration=duration,
        class_of=_class_of,
        used=_used,
        bytes=human_size,
    )
    env.globals.update(version=__version__, ago=_ago)
    return env


def _class_of(session: Session | None) -> str:
    """A session's resource class in words, ``-`` without a scope of its own."""
    granted = session.resources if session is not None else None
    return "-" if granted is None else granted.describe()


def _used(session: Session | None) -> str:
    """An ended session's peak memory and CPU time, ``-`` while unknown."""
    return used_text(session) or "-"


class Renderer:
    """Renders pages and fragments from the templates."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.env = environment(environ)

    def text(self, template: str, context: Mapping[str, Any]) -> str:
        """A whole template rendered to text."""
        return self.env.get_template(template).render(context)

    def fragment(self, template: str, block: str, context: Mapping[str, Any]) -> str:
        """One block of a template rendered on its own (what a live update replaces)."""
        compiled = self.env.get_template(template)
        render = compiled.blocks[block]
        return "".join(render(compiled.new_context(dict(context))))

    def macro(self, template: str, name: str, *args: Any) -> str:
        """A context-free macro of a template called with ``args`` (a board tile)."""
        return str(getattr(self.env.get_template(template).module, name)(*args))

    def markup(self, template: str, name: str, *args: Any) -> Any:
        """A context-free macro's output kept as markup, to be placed in another page as it is
        (it is this module's own escaped rendering; a drawing kept for the next pages)."""
        made = getattr(self.env.get_template(template).module, name)(*args)
        # With autoescape on, a macro's output is already markup (it has __html__): escaped
        # as it was made, and placed in a page as it is.
        if not hasattr(made, "__html__"):
            raise TypeError(f"{template} {name}: not a macro's markup")
        return made

    def page(
        self,
        template: str,
        context: Mapping[str, Any],
        *,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> Html:
        """A page response."""
        return Html(self.text(template, context), status_code=status, headers=headers)
