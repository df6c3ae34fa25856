"""Ids as users type them: the one id-prefix lookup, and the error an ambiguous prefix raises.

Everything a user names by id (sessions ``s_…``, kanban cards ``c_…`` and runs ``r_…``) has an
:class:`IdKind`: its word, its prefix and how many hex digits follow. :func:`lookup` turns what
a user typed into the one id it names, with one behaviour for every kind and every store (the
real and the fake registry, the memory, SQLite and PostgreSQL boards):

* blanks around the text are ignored, the kind's prefix may be left out, and the hex digits
  may be typed in either case;
* text that cannot be an id of the kind (no hex digits after the prefix, or other characters)
  names nothing: :class:`~scope.foundation.errors.NotFoundError`, naming the shape (exit 2);
* a whole id that exists is found whatever its length;
* otherwise fewer than :data:`MIN_PREFIX` characters as typed (``s_3f`` and ``3f9`` both
  count as too short; ``s_3f9a`` and ``3f9a`` both qualify) is :class:`IdTooShort`, a
  :class:`~scope.foundation.errors.UsageError` naming the minimum (exit 2);
* a prefix no id starts with is :class:`~scope.foundation.errors.NotFoundError` (exit 2); one
  that several ids start with is :class:`AmbiguousId`, listing them (exit 2).

A store answers two questions only (:func:`lookup`'s ``exists`` and ``starting``), so the rule
is written once here and nowhere else.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from scope.foundation.errors import NotFoundError, UsageError
from scope.foundation.text import quote, strip_blanks

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs the CLI's start-up; the annotations are strings anyway
    from collections.abc import Callable, Sequence

__all__ = ["MAX_CANDIDATES", "MIN_PREFIX", "AmbiguousId", "IdKind", "IdTooShort", "lookup"]

MIN_PREFIX = 4
"""Characters of an id (as typed, prefix included) a prefix lookup needs at least."""

MAX_CANDIDATES = 50
"""How many matching ids a store hands back at most (an ambiguous prefix lists them)."""

_HEX = re.compile(r"[0-9a-f]+")


@dataclass(frozen=True, kw_only=True)
class IdKind:
    """One kind of id."""

    name: str
    """The word for it in messages (``"session"``)."""
    prefix: str
    """What every id of the kind starts with (``"s_"``)."""
    digits: int
    """Hex digits after the prefix."""
    listing: str
    """The command that shows such ids (``"dispatch ps --all"``)."""

    @property
    def example(self) -> str:
        """What an id of this kind looks like (``s_1a2b3c4d5e6f``)."""
        return self.prefix + ("1a2b3c4d5e6f" * 4)[: self.digits]

    def new(self) -> str:
        """A fresh random id of this kind."""
        # os.urandom is what secrets.token_hex reads; the secrets module itself pulls in hmac
        # and hashlib, which a short-lived command would pay for at start-up.
        return self.prefix + os.urandom((self.digits + 1) // 2).hex()[: self.digits]


class IdTooShort(UsageError):
    """An id prefix shorter than :data:`MIN_PREFIX` characters (exit 2)."""

    def __init__(self, kind: str, prefix: str, *, remedy: str | None = None) -> None:
        super().__init__(remedy=remedy, kind=kind, prefix=prefix, minimum=MIN_PREFIX)

    def describe(self) -> str:
        return (
            f"{self.fields['kind']} id {quote(self.fields['prefix'])} is too short: give at "
            f"least {self.fields['minimum']} characters of the id"
        )


class AmbiguousId(UsageError):
    """An id prefix matches more than one object; lists the candidates (exit 2)."""

    def __init__(self, kind: str, prefix: str, candidates: Sequence[str]) -> None:
        super().__init__(kind=kind, prefix=prefix, candidates=list(candidates))

    def describe(self) -> str:
        shown = ", ".join(self.fields["candidates"][:10])
        more = len(self.fields["candidates"]) - 10
        tail = f" and {more} more" if more > 0 else ""
        return (
            f"ambiguous {self.fields['kind']} id {quote(self.fields['prefix'])}: matches "
            f"{shown}{tail}; give more characters"
        )


def lookup(
    text: str,
    kind: IdKind,
    *,
    starting: Callable[[str], Sequence[str]],
    exists: Callable[[str], bool] | None = None,
) -> str:
    """The one id of ``kind`` that ``text`` names (see the module docstring for the rule).

    ``starting(prefix)`` returns the ids that start with ``prefix`` (a whole prefix such as
    ``c_1a2b``), sorted, at most :data:`MAX_CANDIDATES`; ``exists(id)`` (optional) answers
    whether a whole id exists, for stores where that is cheaper than a prefix search."""
    given = strip_blanks(text)
    body = (given[len(kind.prefix) :] if given.startswith(kind.prefix) else given).lower()
    where = f"see '{kind.listing}' for ids"
    if not _HEX.fullmatch(body):
        raise NotFoundError(kind.name, text, remedy=f"{kind.name} ids look like {kind.example}")
    wanted = kind.prefix + body
    if exists is not None and exists(wanted):
        return wanted
    if len(given) < MIN_PREFIX:
        raise IdTooShort(kind.name, text, remedy=where)
    found = list(starting(wanted))
    if wanted in found:
        return wanted
    if not found:
        raise NotFoundError(kind.name, text, remedy=where)
    if len(found) > 1:
        raise AmbiguousId(kind.name, text, found)
    return found[0]
