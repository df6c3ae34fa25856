"""Finding cards: the search syntax, the query it becomes, and one page of the answer.

One search box takes words and terms (docs/web.md, "Search")::

    deploy "db migration"      the title holds every word and phrase (ASCII case ignored)
    c_3f9a  id:3f9a            the id starts with this (the c_ is optional)
    assignee:build  a:build    the card's assignee
    status:blocked,ready       one of these statuses (archived cards only when asked for)
    group:nightly              the card's group (group:"night shift" when it has blanks)
    changed:24h  created:7d    last changed / created within this long before now

:func:`parse` turns the text into a :class:`CardQuery` (a term it cannot read is
:class:`~dispatcher.kanban.errors.BadQuery`, naming the term and what it accepts); every board
store answers it with :meth:`~dispatcher.kanban.abc.BoardStore.search_cards`, sorted and paged
by the store. :func:`matches` and :func:`order` are the rule itself, which the in-memory store
applies and the SQL stores write as a ``WHERE`` and an ``ORDER BY``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from dispatcher.kanban.errors import BadQuery
from dispatcher.kanban.model import Card, CardStatus
from dispatcher.kanban.rows import CARD_PREFIX
from scope.foundation.values import Invalid, parse_duration

PAGE = 50
MAX_PAGE = 500
MAX_TERMS = 20
_TOKEN = re.compile(r'(?:(\w+):)?"([^"]*)"?|(\S+)')
"""A phrase in quotes (a term's value in quotes: ``group:"night shift"``), or a word."""
_HEX = re.compile(r"[0-9a-f]{1,10}")


class SortKey(enum.StrEnum):
    """What a result is sorted by (then by id, so pages never overlap)."""

    CHANGED = "changed"
    CREATED = "created"
    PRIORITY = "priority"
    TITLE = "title"
    STATUS = "status"
    ASSIGNEE = "assignee"


SORT_COLUMNS = {
    SortKey.CHANGED: "updated_at",
    SortKey.CREATED: "created_at",
    SortKey.PRIORITY: "priority",
    SortKey.TITLE: "title",
    SortKey.STATUS: "status",
    SortKey.ASSIGNEE: "assignee",
}
"""The card column each sort key orders by."""


@dataclass(frozen=True, kw_only=True)
class CardQuery:
    """Which cards, in which order, which page (see the module docstring)."""

    words: tuple[str, ...] = ()
    """The title holds each (ASCII letters compared without case)."""
    id_prefix: str | None = None
    """Lower-case hex digits the id starts with after ``c_``."""
    assignee: str | None = None
    statuses: tuple[CardStatus, ...] = ()
    """Empty: every status but ``archived``."""
    group: str | None = None
    changed_after: float | None = None
    created_after: float | None = None
    sort: SortKey = SortKey.CHANGED
    descending: bool = True
    offset: int = 0
    limit: int = PAGE

    def page(self, offset: int, limit: int | None = None) -> CardQuery:
        """The same query at another page."""
        return replace(self, offset=max(0, offset), limit=limit or self.limit)


@dataclass(frozen=True)
class CardPage:
    """One page of a search: the cards, and how many match in all."""

    cards: list[Card] = field(default_factory=list)
    total: int = 0


def parse(
    text: str,
    *,
    now: float,
    sort: str | None = None,
    descending: bool = True,
    offset: int = 0,
    limit: int = PAGE,
) -> CardQuery:
    """The query ``text`` asks for (BadQuery names the first term that cannot be read)."""
    words: list[str] = []
    found: dict[str, object] = {}
    tokens = list(_TOKEN.finditer(text or ""))
    if len(tokens) > MAX_TERMS:
        raise BadQuery(text[:60], f"at most {MAX_TERMS} words and terms")
    for match in tokens:
        named, phrase, token = match.groups()
        if named is not None and named.lower() in _TERMS:
            key, parsed = _TERMS[named.lower()](match.group(0), phrase.strip(), now)
            found[key] = parsed
            continue
        if named is not None:
            token = match.group(0)  # an unknown name: the whole of it is a word
        elif phrase is not None:
            if phrase.strip():
                words.append(phrase.strip())
            continue
        name, colon, value = token.partition(":")
        if colon and name.lower() in _TERMS:
            key, parsed = _TERMS[name.lower()](token, value, now)
            found[key] = parsed
        elif token.lower().startswith(CARD_PREFIX) and _HEX.fullmatch(token[2:].lower()):
            found["id_prefix"] = token[2:].lower()
        else:
            words.append(token)
    try:
        key = SortKey(sort) if sort else SortKey.CHANGED
    except ValueError:
        raise BadQuery(f"sort={sort}", "sort by " + ", ".join(k.value for k in SortKey)) from None
    return CardQuery(
        words=tuple(words),
        sort=key,
        descending=descending,
        offset=max(0, offset),
        limit=max(1, min(limit, MAX_PAGE)),
        **found,  # type: ignore[arg-type]
    )


_Term = Callable[[str, str, float], tuple[str, object]]
"""Reads one ``name:value`` term: (the query field, its value)."""


def _id(token: str, value: str, now: float) -> tuple[str, object]:
    digits = value.lower().removeprefix(CARD_PREFIX)
    if not _HEX.fullmatch(digits):
        raise BadQuery(token, "give the start of a card id: c_ and up to 10 hex digits")
    return "id_prefix", digits


def _assignee(token: str, value: str, now: float) -> tuple[str, object]:
    if not value:
        raise BadQuery(token, "name an assignee")
    return "assignee", value


def _group(token: str, value: str, now: float) -> tuple[str, object]:
    if not value:
        raise BadQuery(token, "name a group")
    return "group", value


def _statuses(token: str, value: str, now: float) -> tuple[str, object]:
    names = [v for v in value.lower().split(",") if v]
    try:
        chosen = tuple(dict.fromkeys(CardStatus(v) for v in names))
    except ValueError:
        known = ", ".join(s.value for s in CardStatus)
        raise BadQuery(token, f"statuses are {known} (several: status:ready,blocked)") from None
    if not chosen:
        raise BadQuery(token, "name a status")
    return "statuses", chosen


def _within(key: str) -> _Term:
    def term(token: str, value: str, now: float) -> tuple[str, object]:
        try:
            seconds = parse_duration(value)
        except Invalid:
            raise BadQuery(token, "give how long before now: 30m, 24h, 7d") from None
        return key, now - seconds

    return term


_TERMS: dict[str, _Term] = {
    "id": _id,
    "assignee": _assignee,
    "a": _assignee,
    "status": _statuses,
    "group": _group,
    "changed": _within("changed_after"),
    "created": _within("created_after"),
}


def fold(text: str) -> str:
    """``text`` with ASCII letters lowered (what both SQL backends' ``lower()`` agree on)."""
    return text.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def matches(card: Card, query: CardQuery) -> bool:
    """Whether ``card`` is one the query finds."""
    if query.statuses:
        if card.status not in query.statuses:
            return False
    elif card.status is CardStatus.ARCHIVED:
        return False
    if query.id_prefix and not card.id[len(CARD_PREFIX) :].startswith(query.id_prefix):
        return False
    if query.assignee is not None and card.assignee != query.assignee:
        return False
    if query.group is not None and card.group != query.group:
        return False
    if query.changed_after is not None and card.updated_at < query.changed_after:
        return False
    if query.created_after is not None and card.created_at < query.created_after:
        return False
    title = fold(card.title)
    return all(fold(word) in title for word in query.words)


def order(cards: Sequence[Card], query: CardQuery) -> list[Card]:
    """``cards`` in the query's order (its sort key, then the id, both the same direction)."""
    column = SORT_COLUMNS[query.sort]

    def key(card: Card) -> tuple[object, str]:
        value = getattr(card, column)
        return (value.value if isinstance(value, enum.Enum) else value), card.id

    return sorted(cards, key=key, reverse=query.descending)
