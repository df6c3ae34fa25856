"""Errors as ``application/problem+json`` (RFC 9457): one document, the CLI's one-line message.

``detail`` is exactly the line ``dispatch`` prints after ``dispatch: error:`` for the same
error (the problem, then ``; `` and the fix); ``remedy`` repeats the fix alone, and ``error``
carries the error's class and structured fields (``to_dict``). The status says what kind of
problem it is: 400 a bad parameter or body, 401 no or a bad credential, 403 not allowed, 404
an unknown id, 409 a state the operation does not fit (a stale run id, a wrong status), 413 a
body over the limit, 415 a body that is not JSON, 429 too many failed sign-ins, 503 the state
database unusable.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from starlette.responses import JSONResponse

from dispatcher.kanban.errors import BadCard, StaleRun, WrongStatus
from dispatcher.tokens.store import TokenRefused
from dispatcher.web.errors import Conflict
from registry.errors import StateError
from scope.foundation.errors import DispatchError, NotFoundError, UsageError
from scope.foundation.ids import AmbiguousId
from scope.foundation.text import one_line

MEDIA_TYPE = "application/problem+json"
_BODY_NAMES = ("assignee", "parent card", "channel")
"""Things a request body names: unknown, they are a bad body (400), not a missing page."""


class ApiProblem(DispatchError):
    """A refusal of the API itself (authentication, scope, body size or type), with its
    status."""

    def __init__(
        self, status: int, message: str, *, remedy: str | None = None, **headers: str
    ) -> None:
        super().__init__(message, remedy=remedy)
        self.status = status
        self.headers = headers


def status_of(err: DispatchError) -> int:
    """The HTTP status of one of our errors (see the module docstring)."""
    if isinstance(err, ApiProblem):
        return err.status
    if isinstance(err, TokenRefused):
        return 401
    if isinstance(err, NotFoundError) and str(err.fields.get("kind")) in _BODY_NAMES:
        return 400
    if isinstance(err, NotFoundError | AmbiguousId):
        return 404
    if isinstance(err, WrongStatus | StaleRun | Conflict):
        return 409
    if isinstance(err, BadCard | UsageError):
        return 400
    if isinstance(err, StateError) or err.restart_helps:
        return 503
    # Any other refusal of ours is the state not allowing the operation now (exit 1 in the
    # CLI: "the operation failed"); a bug is not one of ours and answers 500 elsewhere.
    return 409


def problem(
    status: int,
    detail: str,
    *,
    remedy: str | None = None,
    error: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A problem document response."""
    doc: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": one_line(detail),
        "remedy": remedy,
    }
    if error is not None:
        doc["error"] = dict(error)
    return JSONResponse(doc, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def from_error(err: DispatchError) -> JSONResponse:
    """The problem document of one of our errors."""
    headers = err.headers if isinstance(err, ApiProblem) else None
    if isinstance(err, TokenRefused):
        headers = {"www-authenticate": 'Bearer realm="dispatch", error="invalid_token"'}
    return problem(
        status_of(err), err.message, remedy=err.remedy, error=err.to_dict(), headers=headers
    )
