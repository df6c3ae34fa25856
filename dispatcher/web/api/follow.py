"""The board's event stream and a session's output: by cursor, by byte range, and followed as
Server-Sent Events.

**Events** are the board's append-only events (what ``kanban show --json`` lists per card),
board-wide, in order. An event's ``id`` is its sequence number, and that is the cursor:
``GET /events?after=ID`` returns the next ones (``Link`` names the next page);
``GET /events/stream`` sends each as an SSE message whose ``id:`` is the same number, so a
client that reconnects with ``Last-Event-ID`` gets exactly what it missed. The stream wakes
when the dashboard's board watcher sees a change (:class:`~dispatcher.web.live.Hub`).

**Output** is read through the registry only (``read_log``, ``log_size``, ``follow_log``):
``GET /sessions/{id}/output`` is ``dispatch logs --json`` (``start``/``end`` a byte range,
``tail`` the last lines, ``redact`` the output hooks); ``.../output/stream`` follows it as
``logs -f --json`` does: a message per chunk (``id``, ``offset``, ``output``; the SSE ``id:``
is the offset after it, the resume point for ``Last-Event-ID``), then an ``end`` message
carrying the finished session. A run's output is its session's.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from dispatcher.app.documents import output_document, session_json
from dispatcher.kanban.views import event_json
from dispatcher.web.api.cards import next_link
from dispatcher.web.api.spec import ApiUsage, Call, Reply
from dispatcher.web.errors import Conflict
from registry.abc import Registry
from scope.foundation.errors import NotFoundError

PING = 15.0
"""Seconds of quiet before a keep-alive comment."""
BATCH = 500
OUTPUT_POLL = 0.25
"""Seconds between looks at a followed log (another process writes it)."""
CHUNK = 256 * 1024


def sse(data: Any, *, id: str | None = None, event: str | None = None) -> str:
    """One SSE message, ``data`` as one line of JSON."""
    head = (f"id: {id}\n" if id is not None else "") + (f"event: {event}\n" if event else "")
    return head + "data: " + json.dumps(data, separators=(",", ":")) + "\n\n"


def _respond(messages: AsyncIterator[str]) -> Response:
    return StreamingResponse(
        messages,
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


def _resume(call: Call, name: str) -> int:
    """``Last-Event-ID`` when the client reconnects, else the query parameter."""
    last = call.headers.get("last-event-id")
    if last is None:
        return int(call.params[name] or 0)
    if not last.strip().isdigit() or len(last) > 19:
        raise ApiUsage("header 'Last-Event-ID'", "give the id of the last message received")
    return int(last)


# -- events ---------------------------------------------------------------------------------


def list_events(call: Call) -> Reply:
    """``GET /events``: board events after the cursor, oldest first."""
    limit = call.params["limit"]
    call.site.source.refresh()  # runs that ended unseen close first, as kanban show does
    events = call.site.source.store.events_after(call.params["after"], limit=limit)
    docs = [event_json(e) for e in events]
    headers = next_link(call, after=docs[-1]["id"]) if len(docs) == limit else {}
    return Reply(document=docs, headers=headers)


async def event_stream(request: Request, call: Call) -> Response:
    """``GET /events/stream``: every board event from the cursor on, as it happens."""
    return _respond(_events(call, _resume(call, "after")))


async def _events(call: Call, after: int) -> AsyncIterator[str]:
    site = call.site
    hub = site.hub
    store = site.source.store
    async with hub.stream() as gen:
        yield "retry: 2000\n\n"
        while not hub.closing:
            events = await site.run(functools.partial(store.events_after, after, limit=BATCH))
            for event in events:
                after = event.seq
                yield sse(event_json(event), id=str(event.seq))
            if len(events) == BATCH:
                continue
            newer = await hub.next(gen, PING)
            if newer == gen:
                yield ": ping\n\n"
            gen = newer


# -- output ---------------------------------------------------------------------------------


def _session_of_run(call: Call) -> str:
    source = call.site.source
    run = source.store.resolve_run(call.params["run_id"])
    if run.session_id is None:
        raise Conflict(
            f"run {run.run_id} has not started its worker yet", remedy="ask again in a moment"
        )
    return run.session_id


def _session_id(call: Call) -> str:
    if "run_id" in call.params:
        return _session_of_run(call)
    return call.site.source.registry().resolve(call.params["session_id"]).id


def output(call: Call) -> dict[str, Any]:
    """``GET /sessions/{id}/output`` (and a run's): ``logs --json`` with a byte range."""
    registry = call.site.source.registry()
    session = registry.get(_session_id(call))
    size = _size(registry, session.id)
    params = call.params
    start = min(params["start"], size)
    end = size if params["end"] is None else min(params["end"], size)
    if end < start:
        raise ApiUsage("query parameter 'end'", f"must not be below start ({start})")
    data = registry.read_log(
        session.id, byte_range=(start, end), tail_lines=params["tail"], hooks=params["redact"]
    )
    return output_document(session, data)


def _size(registry: Registry, session_id: str) -> int:
    size = registry.log_size(session_id)
    if size is None:
        raise NotFoundError(
            "output log of session", session_id, remedy="it was pruned or never written"
        )
    return size


async def output_stream(request: Request, call: Call) -> Response:
    """``GET /sessions/{id}/output/stream``: ``logs -f --json`` as SSE."""
    site = call.site
    registry = site.source.registry()
    offset = _resume(call, "start")
    tail = call.params["tail"]

    def open_follow() -> tuple[str, Any, int]:
        session_id = _session_id(call)
        size = _size(registry, session_id)
        start = min(offset, size)
        if tail is not None and "last-event-id" not in call.headers:
            kept = registry.read_log(session_id, byte_range=(start, size), tail_lines=tail)
            start = size - len(kept)
        return (
            session_id,
            registry.follow_log(session_id, start, hooks=call.params["redact"]),
            start,
        )

    session_id, follow, start = await site.run(open_follow)
    return _respond(_output(call, registry, session_id, follow, start))


async def _output(
    call: Call, registry: Registry, session_id: str, follow: Any, start: int
) -> AsyncIterator[str]:
    site = call.site
    yield "retry: 2000\n\n"
    quiet = 0.0
    while not site.hub.closing:
        data = await site.run(lambda: follow.read_new(CHUNK))
        if data:
            text = data.decode("utf-8", "replace")
            yield sse({"id": session_id, "offset": start, "output": text}, id=str(follow.offset))
            start = follow.offset
            quiet = 0.0
            continue
        session = await site.run(lambda: registry.get(session_id))
        if session.finished:
            rest = await site.run(lambda: follow.read_new(CHUNK))
            if rest:
                yield sse(
                    {"id": session_id, "offset": start, "output": rest.decode("utf-8", "replace")},
                    id=str(follow.offset),
                )
                start = follow.offset
                continue
            yield sse(session_json(session), id=str(follow.offset), event="end")
            return
        await anyio.sleep(OUTPUT_POLL)
        quiet += OUTPUT_POLL
        if quiet >= PING:
            quiet = 0.0
            yield ": ping\n\n"
