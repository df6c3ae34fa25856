"""Names of the transient scopes we create: ``dispatch-<caller>-<parts...>-<suffix>.scope``.

A name carries the caller kind and the caller's ids so an operator reading ``systemctl --user
list-units`` sees what each scope is for, and a random suffix so two launches never collide (a
failed scope keeps its name loaded until collected). Everything is sanitised to the characters
systemd accepts in unit names (``[A-Za-z0-9:_.-]``; ``@`` and ``\\`` are legal but mean template
instances and escapes, so we avoid them) and the whole name stays within systemd's 255 bytes.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence

__all__ = ["MAX_UNIT_NAME", "PREFIX", "is_ours", "sanitise", "scope_name"]

PREFIX = "dispatch"
MAX_UNIT_NAME = 255
_SUFFIX = ".scope"
_INVALID = re.compile(r"[^A-Za-z0-9:_.-]+")


def sanitise(part: str) -> str:
    """One name component: runs of invalid characters become ``_``; dots at the ends go too
    (a leading dot is not a valid unit name start, and ``..`` reads like a path)."""
    text = _INVALID.sub("_", part).strip(".")
    return text or "_"


def scope_name(caller: str, parts: Sequence[str] = (), *, unique: str | None = None) -> str:
    """The unit name for a new scope, e.g. ``dispatch-kanban-c1-run-r7-3f9a01c2.scope``.

    ``unique`` replaces the random suffix (tests, or a caller with its own unique id). When the
    parts are too long, they are cut from the right so prefix, caller and suffix always survive.
    """
    tail = sanitise(unique) if unique is not None else secrets.token_hex(4)
    head = "-".join([PREFIX, sanitise(caller)])
    middle = "-".join(sanitise(p) for p in parts if p != "")
    room = MAX_UNIT_NAME - len(head) - len(tail) - len(_SUFFIX) - 2
    if len(middle) > room:
        middle = middle[: max(room, 0)].rstrip("-.")
    pieces = [head, middle, tail] if middle else [head, tail]
    return "-".join(pieces) + _SUFFIX


def is_ours(unit: str) -> bool:
    """Whether a unit name looks like one :func:`scope_name` made."""
    return unit.startswith(PREFIX + "-") and unit.endswith(_SUFFIX)
