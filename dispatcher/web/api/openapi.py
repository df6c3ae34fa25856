"""The OpenAPI 3.1 document of ``/api/v1/``, generated from the route table.

Nothing here describes an operation by hand: paths, methods, parameters, bodies, answers,
errors and the scope each needs come from :data:`~dispatcher.web.api.table.OPERATIONS` and the
schemas the router checks requests with, so the document is the server's own description.
"""

from __future__ import annotations

from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from dispatcher import __version__
from dispatcher.web.api.schemas import COMPONENTS, ref
from dispatcher.web.api.spec import Operation

PREFIX = "/api/v1"
PROBLEM = "application/problem+json"
_ERRORS = {
    400: "a parameter or body field is missing or malformed",
    401: "no credential, or one that is unknown, revoked or expired",
    403: "the credential's scope does not allow this",
    404: "an unknown id",
    409: "a state the operation does not fit (a stale run id, a wrong status)",
    413: "the body is over the limit",
    415: "the body is not application/json",
    429: "too many failed authentications from this address",
}


def document(operations: Sequence[Operation] | None = None) -> dict[str, Any]:
    """The OpenAPI document (the table's, unless ``operations`` is given)."""
    if operations is None:
        from dispatcher.web.api.table import OPERATIONS

        operations = OPERATIONS
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(PREFIX + op.path, {})[op.method.lower()] = _operation(op)
    paths[PREFIX + "/openapi.json"] = {
        "get": {
            "operationId": "openapi",
            "summary": "This document",
            "tags": ["meta"],
            "security": [],
            "responses": {"200": {"description": "OpenAPI 3.1", "content": _json({})}},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dispatch",
            "version": __version__,
            "description": "The HTTP API of dispatch web: the CLI's --json documents over "
            "HTTP, behind bearer tokens (docs/api.md).",
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": COMPONENTS,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a token from 'dispatch web token create', or the "
                    "installation secret",
                }
            },
        },
        "security": [{"bearer": []}],
    }


def _json(schema: dict[str, Any], media: str = "application/json") -> dict[str, Any]:
    return {media: {"schema": schema}}


def _operation(op: Operation) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "operationId": op.name,
        "summary": op.summary,
        "tags": [op.tag],
        "x-dispatch-scope": op.scope,
        "parameters": [
            {
                "name": p.name,
                "in": p.where,
                "required": p.required or p.where == "path",
                "description": p.description,
                "schema": p.schema(),
                **({"style": "form", "explode": True} if p.schema()["type"] == "array" else {}),
            }
            for p in op.params
        ],
        "responses": _responses(op),
    }
    if op.cli:
        doc["x-dispatch-cli"] = op.cli
    if op.stream:
        doc["parameters"].append(
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "description": "resume after this message id",
                "schema": {"type": "string", "pattern": r"^[0-9]{1,18}$"},
            }
        )
    if op.body is not None:
        if op.name == "addCard":
            doc["parameters"].append(
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "description": "the same as the body's idempotency_key",
                    "schema": {"type": "string", "maxLength": 200},
                }
            )
        required = any(f.required for f in op.body.fields)
        doc["requestBody"] = {
            "required": required,
            "description": op.body.description or "a JSON object",
            "content": _json(op.body.schema()),
        }
    return doc


def _responses(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status in (op.status, *op.statuses):
        if op.stream:
            out[str(status)] = {
                "description": "Server-Sent Events; each message's data is this JSON",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
                "x-dispatch-message": op.response,
            }
        else:
            out[str(status)] = {
                "description": HTTPStatus(status).phrase,
                "content": _json(dict(op.response)),
            }
    for status in op.errors:
        out[str(status)] = {
            "description": _ERRORS[status],
            "content": _json(ref("Problem"), PROBLEM),
        }
    return out
