"""Jinja2 with autoescaping on everywhere, the formatting filters, and HTML responses.

Every value a template prints is escaped (titles, bodies, errors, worker output), so text can
never become markup; ``|safe`` is not used anywhere. Pages are encoded as UTF-8 with
replacement, so no stored string can make a page fail to render.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from starlette.responses import HTMLResponse

from dispatcher import __version__
from dispatcher.timefmt import TimeView, iso, span

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


def _zoned(at: float | None, zone: str | None = None) -> str:
    """A timestamp as ``2026-11-30 09:00:05 +01:00`` in ``zone`` (default: the host's)."""
    text = iso(at, zone)
    return "-" if text is None else f"{text[:10]} {text[11:19]} {text[19:]}"


def _ago(at: float | None, now: float) -> str:
    return "-" if at is None else span(now - at)


def _at(at: float | None, zone: str | None = None) -> str:
    """The one display rule for times (:class:`dispatcher.timefmt.TimeView`): the local time
    with its zone, the date when it is not today."""
    return TimeView.local().at(at, zone)


def _span(seconds: float | None) -> str:
    return "-" if seconds is None else span(seconds)


def environment() -> jinja2.Environment:
    """The template environment (autoescape on for every template, undefined names fail)."""
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
        at=_at,
        zoned=_zoned,
        span=_span,
    )
    env.globals.update(version=__version__, ago=_ago)
    return env


class Renderer:
    """Renders pages and fragments from the templates."""

    def __init__(self) -> None:
        self.env = environment()

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
