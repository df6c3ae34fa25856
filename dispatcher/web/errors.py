"""The web's branch of the error tree, and how every error of the tree answers over HTTP.

::

    DispatcherError
    └── WebError                    dispatch web cannot start or serve
        ├── ListenRefused           a bad or non-loopback --listen (exit 2)
        ├── PortInUse               the address is taken (exit 1)
        ├── SecretUnusable          the secret file is unsafe or damaged (exit 1)
        └── Conflict                an action met a state it does not fit (HTTP 409)

    UsageError
    └── FormError                   a form field is missing or malformed (HTTP 400)

Over HTTP (:func:`http_status`): an unknown id is 404, a malformed form 400 (naming the
field), a card whose status forbids the action 409, an unusable state database 503.
"""

from __future__ import annotations

from typing import Any

from dispatcher.errors import DispatcherError
from dispatcher.kanban.errors import BadCard, StaleRun, WrongStatus
from registry.errors import StateError
from scope.foundation.errors import DispatchError, NotFoundError, UsageError
from scope.foundation.ids import AmbiguousId


class WebError(DispatcherError):
    """``dispatch web`` cannot start or serve."""


class ListenRefused(WebError):
    """``--listen`` names an address this command will not serve on."""

    exit_code = 2

    def __init__(self, listen: str, problem: str, *, remedy: str | None = None) -> None:
        super().__init__(remedy=remedy, listen=listen, problem=problem)

    def describe(self) -> str:
        return f"--listen {self.fields['listen']}: {self.fields['problem']}"


class PortInUse(WebError):
    """Another process listens on the address already."""

    def __init__(self, address: str, detail: str) -> None:
        super().__init__(
            remedy="stop the other server or pass --listen with another port",
            address=address,
            detail=detail,
        )

    def describe(self) -> str:
        return f"cannot listen on {self.fields['address']}: {self.fields['detail']}"


class SecretUnusable(WebError):
    """The secret file exists but cannot be trusted or read."""

    def __init__(self, path: str, problem: str, *, remedy: str) -> None:
        super().__init__(remedy=remedy, path=path, problem=problem)

    def describe(self) -> str:
        return f"web secret {self.fields['path']}: {self.fields['problem']}"


class Conflict(WebError):
    """The action does not fit the state it met (a run that already ended): HTTP 409."""

    exit_code = 2


class FormError(UsageError):
    """A submitted form lacks a field or has a malformed one (HTTP 400)."""

    def __init__(self, field: str, problem: str, **fields: Any) -> None:
        super().__init__(field=field, problem=problem, **fields)

    def describe(self) -> str:
        return f"form field {self.fields['field']!r}: {self.fields['problem']}"


def form_field(err: BadCard) -> str:
    """The form field a board validation error is about (``--failure-limit`` is the
    ``failure_limit`` field)."""
    return str(err.fields["field"]).lstrip("-").replace("-", "_").replace(" ", "_")


def http_status(err: DispatchError) -> int:
    """The HTTP status an error answers with (see the module docstring)."""
    if isinstance(err, NotFoundError | AmbiguousId):
        return 404
    if isinstance(err, WrongStatus | StaleRun | Conflict):
        return 409
    if isinstance(err, BadCard | UsageError):
        return 400
    if isinstance(err, StateError):
        return 503
    return 409 if err.exit_code == 2 else 500
