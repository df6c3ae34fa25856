"""Parameters, bodies and operations: each defined once, and both parsed and described from
that definition (the router parses requests with :meth:`Param.parse` and :meth:`Body.parse`,
the OpenAPI generator describes them with :meth:`Param.schema` and :meth:`Body.schema`).

Values are checked the way the CLI checks its options: an integer in its range, a choice from
its list, text without control characters and within its length. A bad one is a
:class:`ApiUsage` naming the parameter or field and what it accepts (HTTP 400).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scope.foundation.errors import UsageError
from scope.foundation.text import is_digits, quote, unsafe_char

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from dispatcher.web.api.auth import Caller
    from dispatcher.web.site import Site


class ApiUsage(UsageError):
    """A request parameter or body field is missing, unknown or malformed (HTTP 400)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(where=where, problem=problem)

    def describe(self) -> str:
        return f"{self.fields['where']}: {self.fields['problem']}"


class Kind(enum.StrEnum):
    """What a parameter or field holds."""

    STRING = "string"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    STRINGS = "strings"
    """A list of strings (a JSON array in a body; a repeated query parameter)."""


MAX_TEXT = 1000
"""Longest query or path value accepted (ids, names, cursors)."""


@dataclass(frozen=True, kw_only=True)
class Param:
    """A query or path parameter."""

    name: str
    description: str
    kind: Kind = Kind.STRING
    where: str = "query"
    required: bool = False
    default: Any = None
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    max_length: int = MAX_TEXT

    @property
    def label(self) -> str:
        """How messages name it."""
        return f"{'path' if self.where == 'path' else 'query'} parameter {self.name!r}"

    def schema(self) -> dict[str, Any]:
        """The parameter's JSON schema (a path segment is never empty)."""
        schema = _schema(self.kind, self.minimum, self.maximum, self.choices, self.max_length)
        if self.where == "path" and schema["type"] == "string":
            schema["minLength"] = 1
        return schema

    def parse(self, values: Sequence[str]) -> Any:
        """The value of the given texts (the last one wins unless it is a list)."""
        if not values:
            if self.required:
                raise ApiUsage(self.label, "missing")
            return self.default
        if self.kind is Kind.STRINGS:
            return [_text(self.label, v, self.choices, self.max_length) for v in values]
        text = values[-1]
        if self.kind is Kind.INTEGER:
            return _integer(self.label, text, self.minimum, self.maximum)
        if self.kind is Kind.BOOLEAN:
            if text not in ("true", "false", "1", "0"):
                raise ApiUsage(self.label, "give true or false")
            return text in ("true", "1")
        return _text(self.label, text, self.choices, self.max_length)


@dataclass(frozen=True, kw_only=True)
class Field:
    """A field of a JSON request body."""

    name: str
    description: str
    kind: Kind = Kind.STRING
    required: bool = False
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    max_length: int | None = None

    def schema(self) -> dict[str, Any]:
        """The field's JSON schema."""
        return _schema(self.kind, self.minimum, self.maximum, self.choices, self.max_length)

    def parse(self, value: Any) -> Any:
        """The checked value (JSON types as the schema says; text as the CLI accepts it)."""
        label = f"body field {self.name!r}"
        if self.kind is Kind.INTEGER:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ApiUsage(label, "give a whole number")
            return _integer(label, str(value), self.minimum, self.maximum)
        if self.kind is Kind.BOOLEAN:
            if not isinstance(value, bool):
                raise ApiUsage(label, "give true or false")
            return value
        if self.kind is Kind.STRINGS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ApiUsage(label, "give a list of strings")
            return [_text(label, v, self.choices, MAX_TEXT) for v in value]
        if not isinstance(value, str):
            raise ApiUsage(label, "give a string")
        if self.choices and value not in self.choices:
            raise ApiUsage(label, "use one of " + ", ".join(self.choices))
        if self.max_length is not None and len(value) > self.max_length:
            raise ApiUsage(label, f"longer than {self.max_length} characters")
        # The text rules themselves (NUL, control characters) are the board's, applied by
        # the same call the CLI makes; only what could not reach it as text is refused here.
        return value


@dataclass(frozen=True, kw_only=True)
class Body:
    """A JSON object body: its fields; anything else in it is refused."""

    fields: tuple[Field, ...]
    description: str = ""

    def schema(self) -> dict[str, Any]:
        """The body's JSON schema."""
        return {
            "type": "object",
            "properties": {
                f.name: {**f.schema(), "description": f.description} for f in self.fields
            },
            "required": [f.name for f in self.fields if f.required],
            "additionalProperties": False,
        }

    def parse(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """The checked fields present in ``doc`` (missing optional ones are left out)."""
        known = {f.name: f for f in self.fields}
        for name in doc:
            if name not in known:
                allowed = ", ".join(known) or "none"
                raise ApiUsage(f"body field {quote(name)}", f"unknown (allowed: {allowed})")
        out: dict[str, Any] = {}
        for f in self.fields:
            if f.name in doc and doc[f.name] is not None:
                out[f.name] = f.parse(doc[f.name])
            elif f.required:
                raise ApiUsage(f"body field {f.name!r}", "missing")
        return out


@dataclass(frozen=True, kw_only=True)
class Reply:
    """A handler's answer: the document and, when not 200, its status; extra headers."""

    document: Any
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Call:
    """One request as a handler sees it: parsed parameters and body, who asks, and the site."""

    site: Site
    params: dict[str, Any]
    body: dict[str, Any]
    caller: Caller
    headers: Mapping[str, str]
    path: str
    """The request's path and query (for the ``Link`` of the next page)."""


Handler = Callable[[Call], Any]
"""Does the operation (in a worker thread); returns the document or a :class:`Reply`."""
Streamer = Callable[["Request", Call], Awaitable["Response"]]
"""Answers with a stream (Server-Sent Events); runs on the event loop."""


@dataclass(frozen=True, kw_only=True)
class Operation:
    """One entry of the route table."""

    method: str
    path: str
    """Below ``/api/v1``, Starlette's syntax (``/cards/{card_id}``)."""
    name: str
    """The OpenAPI ``operationId``."""
    summary: str
    cli: str
    """The command whose ``--json`` the answer equals (empty: none)."""
    scope: str
    """``read``, ``operate`` or ``public`` (no credentials)."""
    response: Mapping[str, Any]
    """The JSON schema of the answer (for a stream: of each message's data)."""
    handler: Handler | None = None
    streamer: Streamer | None = None
    params: tuple[Param, ...] = ()
    body: Body | None = None
    status: int = 200
    statuses: tuple[int, ...] = ()
    """Other success statuses (201 for a card made now, 200 for an idempotent repeat)."""
    errors: tuple[int, ...] = (400, 401, 403)
    tag: str = "cards"

    @property
    def stream(self) -> bool:
        """Whether the answer is a Server-Sent Events stream."""
        return self.streamer is not None


def _schema(
    kind: Kind,
    minimum: int | None,
    maximum: int | None,
    choices: tuple[str, ...],
    max_length: int | None,
) -> dict[str, Any]:
    if kind is Kind.INTEGER:
        out: dict[str, Any] = {"type": "integer"}
        if minimum is not None:
            out["minimum"] = minimum
        if maximum is not None:
            out["maximum"] = maximum
        return out
    if kind is Kind.BOOLEAN:
        return {"type": "boolean"}
    text: dict[str, Any] = {"type": "string"}
    if choices:
        text["enum"] = list(choices)
    elif max_length is not None:
        text["maxLength"] = max_length
    if kind is Kind.STRINGS:
        return {"type": "array", "items": text}
    return text


def _integer(label: str, text: str, low: int | None, high: int | None) -> int:
    body = text[1:] if text.startswith("-") else text
    if not is_digits(body, 19):
        raise ApiUsage(label, _range_hint(low, high))
    value = int(text)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ApiUsage(label, _range_hint(low, high))
    return value


def _range_hint(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"give a whole number from {low} to {high}"
    if low is not None:
        return f"give a whole number of at least {low}"
    return "give a whole number"


def _text(label: str, text: str, choices: tuple[str, ...], max_length: int) -> str:
    if choices and text not in choices:
        raise ApiUsage(label, "use one of " + ", ".join(choices))
    if len(text) > max_length:
        raise ApiUsage(label, f"longer than {max_length} characters")
    bad = unsafe_char(text, newlines=False)
    if bad is not None:
        raise ApiUsage(label, f"contains {bad}")
    return text
