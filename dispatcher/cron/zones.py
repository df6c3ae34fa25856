"""Time zones for cron: loading IANA names with clear errors and finding the host's zone.

The host zone is resolved at call time from the environment handed in (``TZ``), then the
system's ``/etc/localtime`` link or ``/etc/timezone``; nothing is cached, so a scheduler that runs
for months follows a changed host zone at its next reload.
"""

from __future__ import annotations

import functools
import os
import zoneinfo
from collections.abc import Callable, Mapping
from pathlib import Path

from dispatcher.cron.errors import ZoneError
from scope.foundation.errors import Invalid
from scope.foundation.text import strip_blanks
from scope.foundation.values import load_zone_info

ZoneResolver = Callable[[], str]
"""Returns the host's zone name; injected into the scheduler so tests can fix it."""

_LOCALTIME = Path("/etc/localtime")
_TIMEZONE_FILE = Path("/etc/timezone")


@functools.lru_cache(maxsize=256)
def _cached_zone(name: str) -> zoneinfo.ZoneInfo:
    return load_zone_info(name)


def load_zone(name: str) -> zoneinfo.ZoneInfo:
    """The zone called ``name``; raises :class:`ZoneError` (exit 2, one line) when it is not an
    IANA name (ASCII letters, digits, ``_+-`` and ``/``) or this host does not have it."""
    if not isinstance(name, str):
        raise ZoneError(repr(name))
    try:
        return _cached_zone(name)
    except Invalid:
        raise ZoneError(name) from None


def host_zone_name(environ: Mapping[str, str] | None = None) -> str:
    """The host's IANA zone name: ``TZ`` from ``environ`` when it names a zone, else the
    target of ``/etc/localtime``, else ``/etc/timezone``, else ``UTC``."""
    env = os.environ if environ is None else environ
    tz = strip_blanks(env.get("TZ", "")).removeprefix(":")
    if tz:
        name = _name_from_path(tz) if tz.startswith("/") else tz
        if name and _loads(name):
            return name
    try:
        target = os.readlink(_LOCALTIME)
    except OSError:
        target = ""
    name = _name_from_path(target) if target else None
    if name and _loads(name):
        return name
    try:
        text = strip_blanks(_TIMEZONE_FILE.read_text(encoding="utf-8").rstrip("\r\n"))
    except (OSError, UnicodeDecodeError):
        text = ""
    if text and _loads(text):
        return text
    return "UTC"


def resolver_for(environ: Mapping[str, str] | None = None) -> ZoneResolver:
    """A :data:`ZoneResolver` reading ``environ`` (a copy) each time it is called."""
    frozen = None if environ is None else dict(environ)
    return lambda: host_zone_name(frozen)


def fixed_zone(name: str) -> ZoneResolver:
    """A resolver that always answers ``name`` (tests, or an operator-pinned zone)."""
    load_zone(name)
    return lambda: name


def _name_from_path(path: str) -> str | None:
    marker = "zoneinfo/"
    index = path.find(marker)
    if index < 0:
        return None
    name = path[index + len(marker) :]
    for prefix in ("posix/", "right/"):
        name = name.removeprefix(prefix)
    return name or None


def _loads(name: str) -> bool:
    try:
        load_zone(name)
    except ZoneError:
        return False
    return True
