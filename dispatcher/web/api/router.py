"""The API's Starlette routes, built from the route table, and a request's way through them.

For every request, in this order: the caller (:func:`~dispatcher.web.api.auth.authenticate`;
401, 429) and its scope (403); the parameters, each parsed by its table definition (400; an
unknown query parameter is refused too); the body of an operation that takes one: at most
:data:`MAX_BODY` bytes (413, checked on ``Content-Length`` before reading and again while
reading), ``application/json`` (415), valid JSON (400), an object with only the table's
fields (400). Only then does the operation run (in a worker thread; streams on the loop).
Whatever goes wrong answers with one problem document (:mod:`~dispatcher.web.api.problems`)
and changes nothing: the checks all come before the operation.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route

from dispatcher.web.api.auth import Caller, FailureLimit, authenticate
from dispatcher.web.api.openapi import PREFIX, document
from dispatcher.web.api.problems import ApiProblem, from_error, problem
from dispatcher.web.api.spec import ApiUsage, Body, Call, Operation, Reply
from dispatcher.web.site import Site
from scope.foundation.errors import DispatchError

MAX_BODY = 20 * 1024 * 1024
"""The largest request body (a card body may hold 16 MiB of text; JSON escapes add some)."""
_log = logging.getLogger("dispatch.web.api")
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def routes(site: Site, operations: tuple[Operation, ...] | None = None) -> list[BaseRoute]:
    """The API's routes (the table's, unless ``operations`` is given)."""
    if operations is None:
        from dispatcher.web.api.table import OPERATIONS

        operations = OPERATIONS
    limit = FailureLimit()
    found: list[BaseRoute] = [
        Route(PREFIX + op.path, _endpoint(site, op, limit), methods=[op.method])
        for op in operations
    ]

    described = document(operations)

    async def openapi(request: Request) -> Response:
        return JSONResponse(described)

    found.append(Route(PREFIX + "/openapi.json", openapi, methods=["GET"]))
    known = list(found)

    async def elsewhere(request: Request) -> Response:
        # Everything else under the prefix: a problem document, never the pages' redirect of
        # a trailing slash (an id with an encoded '/' lands here too).
        allowed = {
            method
            for route in known
            if isinstance(route, Route) and route.matches(request.scope)[0] is Match.PARTIAL
            for method in route.methods or ()
        }
        if allowed:
            return not_allowed(request, allowed)
        return not_found(request)

    found.append(Route(PREFIX + "/{rest:path}", elsewhere, methods=_METHODS))
    return found


def _endpoint(site: Site, op: Operation, limit: FailureLimit) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        try:
            return await _answer(site, op, limit, request)
        except DispatchError as err:
            return from_error(err)
        except sqlite3.DatabaseError as err:
            _log.error("dispatch web: state database: %s", err)
            return problem(503, f"state database: {err}", remedy="see 'dispatch state check'")
        except Exception:
            _log.exception("dispatch web: %s %s failed", request.method, request.url.path)
            return problem(500, "internal error", remedy="see the log of dispatch web")

    endpoint.__name__ = op.name
    return endpoint


async def _answer(site: Site, op: Operation, limit: FailureLimit, request: Request) -> Response:
    auth = getattr(request.state, "auth", None)
    address = request.client.host if request.client else "unknown"
    authorization = request.headers.get("authorization")
    session = bool(auth is not None and auth.nonce is not None)
    tokens = site.source.reader.cluster.token_store()

    def who() -> Caller:
        return authenticate(
            authorization,
            session,
            address=address,
            keys=site.keys,
            tokens=tokens,
            limit=limit,
            now=time.time(),
        )

    caller = await site.run(who)
    caller.require(op.scope)
    params = _params(op, request)
    body = await _body(op.body, request) if op.body is not None else {}
    query = request.url.query
    call = Call(
        site=site,
        params=params,
        body=body,
        caller=caller,
        headers=request.headers,
        path=request.url.path + (f"?{query}" if query else ""),
    )
    if op.streamer is not None:
        return await op.streamer(request, call)
    assert op.handler is not None
    handler = op.handler
    result = await site.run(lambda: handler(call))
    reply = result if isinstance(result, Reply) else Reply(document=result, status=op.status)
    return JSONResponse(reply.document, status_code=reply.status, headers=dict(reply.headers))


def _params(op: Operation, request: Request) -> dict[str, Any]:
    known = {p.name for p in op.params if p.where == "query"}
    for name in request.query_params:
        if name not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise ApiUsage(f"query parameter {name[:100]!r}", f"unknown (allowed: {allowed})")
    out: dict[str, Any] = {}
    for param in op.params:
        if param.where == "path":
            out[param.name] = param.parse([request.path_params[param.name]])
        else:
            out[param.name] = param.parse(request.query_params.getlist(param.name))
    return out


async def _body(spec: Body, request: Request) -> dict[str, Any]:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise _too_large()
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return spec.parse({})
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise ApiProblem(
            415,
            f"the body is {media or 'untyped'}, not application/json",
            remedy="send a JSON object with 'Content-Type: application/json'",
        )
    try:
        doc = json.loads(raw)
    except UnicodeDecodeError:
        raise ApiUsage("body", "not UTF-8") from None
    except RecursionError:
        raise ApiUsage("body", "nested too deeply") from None
    except json.JSONDecodeError as err:
        raise ApiUsage("body", f"not valid JSON (line {err.lineno}, column {err.colno})") from None
    except ValueError:
        raise ApiUsage("body", "not valid JSON") from None
    if not isinstance(doc, dict):
        raise ApiUsage("body", "give a JSON object")
    return spec.parse(doc)


def _too_large() -> ApiProblem:
    return ApiProblem(
        413,
        f"the body is larger than {MAX_BODY // (1024 * 1024)} MiB",
        remedy="send a smaller body (a card body holds at most 16 MiB)",
    )


def not_found(request: Request) -> Response:
    """The answer to a path under ``/api/`` that names no operation."""
    return problem(
        404, f"no API path {request.url.path[:200]}", remedy=f"see {PREFIX}/openapi.json"
    )


def not_allowed(request: Request, allowed: Iterable[str] = ()) -> Response:
    """The answer to a known path with a method it does not take (``Allow`` names the ones
    it does, as HTTP asks of every 405)."""
    return problem(
        405,
        f"{request.method} is not an operation of {request.url.path[:200]}",
        remedy=f"see {PREFIX}/openapi.json",
        headers={"allow": ", ".join(sorted(allowed))} if allowed else None,
    )
