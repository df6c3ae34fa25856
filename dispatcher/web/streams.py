"""The Server-Sent Events streams, one per open page, all fed by the :class:`~dispatcher.web.
live.Hub`.

Messages (``data`` is JSON; the script in static/dispatch.js applies them):

* ``cards`` (board): tiles of the cards the new events touched, rendered by the server with
  the page's own template, the cards that left the board, the counts and the pause flag. Its
  ``id`` is the newest event's sequence number: a browser that reconnects sends it back as
  ``Last-Event-ID`` and gets exactly what it missed (tiles show a card's current state, so
  sending a card twice is harmless). Far behind, it is told to ``reload``.
* ``regions``: parts of a page re-rendered from the page's own context builder (a card's
  fields, runs and events; the cron, sessions, status and hosts tables).
* ``log``: text appended to the followed worker log (``reset`` when a new run took over) and
  ``logend`` when the worker's log is complete. The ``id`` carries the log offset too, so a
  reconnect resumes the tail where it stopped.
* ``problem``: the state could not be read (the page says so and keeps trying).

A comment line every :data:`PING` seconds keeps proxies from closing a quiet stream and lets
the server notice a browser that went away.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from dispatcher.kanban.model import CardStatus, Event
from dispatcher.kanban.views import deferred_cards
from dispatcher.web import pages, views
from dispatcher.web.live import Change, Hub, LogFollower
from dispatcher.web.site import Site
from scope.foundation.errors import DispatchError, NotFoundError

PING = 15.0
PING_LINE = ": ping\n\n"
"""An SSE comment: keeps a quiet stream open and shows whether the browser is still there."""
CATCH_UP = 2000
"""A browser further behind than this many events reloads the page instead."""
RETRY_MS = 2000


def sse(data: Any, *, event: str | None = None, id: str | None = None) -> str:
    """One SSE message (``data`` as one line of JSON)."""
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.append("data: " + json.dumps(data, separators=(",", ":")))
    return "\n".join(lines) + "\n\n"


async def _news(hub: Hub, gen: int) -> tuple[int, list[Change] | None] | None:
    """Wait up to :data:`PING` for anything newer than ``gen``: None when nothing came (time
    for a keep-alive), else the new generation and the board's changes since ``gen`` (None
    when some were already dropped: read the store instead)."""
    newer = await hub.next(gen, PING)
    if newer == gen:
        return None
    return newer, hub.changes_since(gen)


def _respond(events: AsyncIterator[str]) -> Response:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


def _last_id(request: Request) -> str | None:
    """What the browser saw last: ``Last-Event-ID`` on a reconnect, ``last`` after a pause."""
    return request.headers.get("last-event-id") or request.query_params.get("last")


def _number(text: str | None, default: int = 0) -> int:
    try:
        return max(0, int(text or default))
    except ValueError:
        return default


# -- the board --------------------------------------------------------------------------------


def board_payload(site: Site, events: tuple[Event, ...] | list[Event], seq: int) -> dict[str, Any]:
    """The ``cards`` message for ``events``: current tiles of the cards they touched."""
    source = site.source
    store = source.store
    wanted = views.affected_cards(events)
    if len(wanted) > 200:
        known = {c.id: c for c in store.list_cards(include_archived=True)}
        found = [known[i] for i in wanted if i in known]
    else:
        found = []
        for card_id in wanted:
            try:
                found.append(store.get_card(card_id))
            except NotFoundError:
                continue
    shown = [c for c in found if c.status is not CardStatus.ARCHIVED]
    running = [c.id for c in shown if c.current_run_id]
    tiles = views.tiles(
        shown,
        store.open_runs(),
        local_host=source.host_id,
        limit_for=source.settings.kanban.limit_for,
        hosts=source.run_hosts(running) if source.cluster_configured else None,
        assignees=frozenset(source.settings.kanban.assignees),
        waits=source.limit_waits(shown),
        deferred=deferred_cards(shown, store.runs_of, time.time()),
    )
    now = time.time()
    return {
        "seq": seq,
        "cards": [
            {
                "id": t.id,
                "status": t.status,
                "rank": t.rank,
                "html": site.renderer.macro("_tile.html", "tile", t, now),
            }
            for t in tiles
        ],
        "gone": [c.id for c in found if c.status is CardStatus.ARCHIVED],
        "counts": {s.value: n for s, n in store.status_counts().items()},
        "paused": store.paused(),
    }


def _board_since(site: Site, after: int) -> dict[str, Any] | None:
    """The catch-up message after ``after``; ``{"reload": True}`` when too far behind."""
    events = site.source.store.events_after(after, limit=CATCH_UP)
    if len(events) >= CATCH_UP:
        return {"reload": True}
    if not events:
        return None
    return board_payload(site, events, events[-1].seq)


def _change_message(site: Site, change: Change) -> str:
    """The ``cards`` message of one change, whole, as every board stream sends it."""
    payload = board_payload(site, change.events, change.seq)
    payload.update(counts=change.counts, paused=change.paused)
    return sse(payload, event="cards", id=str(change.seq))


async def _shared_message(site: Site, change: Change) -> str:
    """:func:`_change_message`, built once for all streams (the others wait for it: no thread,
    no JSON of their own, only their socket write)."""
    built = await site.hub.shared(("board", change.version), lambda: _change_message(site, change))
    return str(built)


async def board(request: Request) -> Response:
    """``GET /live/board?after=SEQ``."""
    site = pages.site_of(request)
    last = _last_id(request)
    after = _number(last if last is not None else request.query_params.get("after"))
    return _respond(_board_events(site, after))


async def _board_events(site: Site, after: int) -> AsyncIterator[str]:
    hub = site.hub
    async with hub.stream() as gen:
        yield f"retry: {RETRY_MS}\n\n"
        sent = after
        catch_up: dict[str, Any] | None = await site.run(lambda: _board_since(site, sent))
        while not hub.closing:
            if catch_up is not None:
                if catch_up.get("reload"):
                    yield sse({}, event="reload")
                    return
                sent = max(sent, int(catch_up["seq"]))
                yield sse(catch_up, event="cards", id=str(sent))
                catch_up = None
            news = await _news(hub, gen)
            if news is None:
                yield PING_LINE
                continue
            gen, changes = news
            if changes is None:
                catch_up = await site.run(functools.partial(_board_since, site, sent))
                continue
            for change in changes:
                if change.seq < sent:
                    continue  # already covered by a catch-up read after it
                sent = max(sent, change.seq)
                yield await _shared_message(site, change)
            if hub.problem:
                yield sse({"problem": hub.problem}, event="problem")


# -- a card -----------------------------------------------------------------------------------


async def card(request: Request) -> Response:
    """``GET /live/cards/{card_id}?after=SEQ&session=S&offset=N`` (or ``Last-Event-ID``)."""
    site = pages.site_of(request)
    card_id = request.path_params["card_id"]
    after = _number(request.query_params.get("after"))
    session = request.query_params.get("session") or None
    offset = _number(request.query_params.get("offset"))
    last = _last_id(request)
    if last:
        seq, _, rest = last.partition(":")
        after = _number(seq, after)
        given, _, at = rest.partition(":")
        if given and given != "-":
            session, offset = given, _number(at)
    await site.run(lambda: site.source.store.get_card(card_id))  # unknown: 404
    return _respond(_card_events(site, request, card_id, after, session, offset))


def _card_regions(site: Site, request: Request, card_id: str) -> dict[str, str]:
    context = pages.card_context(site, request, card_id, with_log=False)
    return {
        name: site.renderer.fragment("card.html", name.replace("-", "_"), context)
        for name in ("card-head", "card-runs", "card-events")
    }


def _follow(site: Site, session_id: str | None, offset: int) -> LogFollower | None:
    if not session_id:
        return None
    try:
        return LogFollower(site.source, session_id, offset)
    except DispatchError:
        return None


async def _card_events(
    site: Site, request: Request, card_id: str, after: int, session: str | None, offset: int
) -> AsyncIterator[str]:
    hub = site.hub
    follower = await site.run(lambda: _follow(site, session, offset))
    if follower is not None:
        hub.follow(follower)
    ended = False
    try:
        async with hub.stream() as gen:
            yield f"retry: {RETRY_MS}\n\n"
            sent = after
            mine = await site.run(lambda: site.source.store.events_of(card_id))
            touched = [e for e in mine if e.seq > after]
            while not hub.closing:
                if touched:
                    sent = max(sent, touched[-1].seq)
                    regions = await site.run(lambda: _card_regions(site, request, card_id))
                    yield sse(regions, event="regions", id=_card_id(sent, follower))
                    new_session = _spawned(touched)
                    if new_session and (follower is None or follower.session_id != new_session):
                        if follower is not None:
                            hub.unfollow(follower)
                        follower = await site.run(functools.partial(_follow, site, new_session, 0))
                        ended = False
                        if follower is not None:
                            hub.follow(follower)
                            yield sse(
                                {"reset": True, "session": follower.session_id, "text": ""},
                                event="log",
                                id=_card_id(sent, follower),
                            )
                    touched = []
                if follower is not None and not ended:
                    text = follower.take()
                    if text:
                        yield sse({"text": text}, event="log", id=_card_id(sent, follower))
                    if follower.ended and not follower.take():
                        ended = True
                        yield sse({}, event="logend", id=_card_id(sent, follower))
                news = await _news(hub, gen)
                if news is None:
                    yield PING_LINE
                    continue
                gen, changes = news
                if changes is None:
                    mine = await site.run(lambda: site.source.store.events_of(card_id))
                    touched = [e for e in mine if e.seq > sent]
                else:
                    touched = [e for c in changes for e in c.events if e.card_id == card_id]
    finally:
        if follower is not None:
            hub.unfollow(follower)


def _spawned(events: list[Event]) -> str | None:
    """The session of the newest ``spawned`` event among ``events``, if any."""
    for event in reversed(events):
        if event.kind == "spawned" and event.data.get("session_id"):
            return str(event.data["session_id"])
    return None


def _card_id(seq: int, follower: LogFollower | None) -> str:
    if follower is None:
        return f"{seq}:-:0"
    return f"{seq}:{follower.session_id}:{follower.offset}"


# -- a session --------------------------------------------------------------------------------


async def session(request: Request) -> Response:
    """``GET /live/sessions/{session_id}?offset=N`` (or ``Last-Event-ID: N``)."""
    site = pages.site_of(request)
    session_id = request.path_params["session_id"]
    last = _last_id(request)
    offset = _number(last if last else request.query_params.get("offset"))
    follower = await site.run(lambda: LogFollower(site.source, session_id, offset))
    return _respond(_session_events(site, request, follower))


async def _session_events(
    site: Site, request: Request, follower: LogFollower
) -> AsyncIterator[str]:
    hub = site.hub
    hub.follow(follower)
    try:
        async with hub.stream() as gen:
            yield f"retry: {RETRY_MS}\n\n"
            while not hub.closing:
                text = follower.take()
                if text:
                    yield sse({"text": text}, event="log", id=str(follower.offset))
                if follower.ended:
                    context = await site.run(
                        lambda: pages.session_context(site, request, follower.session_id)
                    )
                    head = site.renderer.fragment("session.html", "session_head", context)
                    yield sse({"session-head": head}, event="regions", id=str(follower.offset))
                    yield sse({}, event="logend", id=str(follower.offset))
                    return
                newer = await hub.next(gen, PING)
                if newer == gen:
                    yield PING_LINE
                gen = newer
    finally:
        hub.unfollow(follower)


# -- pages that re-render a region when their fingerprint changes --------------------------------

Builder = Callable[[Site, Request], dict[str, Any]]
Fingerprint = Callable[[Site], Hashable]


async def region(
    request: Request,
    key: str,
    template: str,
    build: Builder,
    fingerprint: Fingerprint,
    interval: float,
    check: Callable[[Site], object] | None = None,
) -> Response:
    """A stream that re-renders the page's ``live`` block whenever ``fingerprint`` changes
    (``check`` raises for a page that does not exist: 404 before the stream starts)."""
    site = pages.site_of(request)
    if check is not None:
        await site.run(lambda: check(site))
    return _respond(_region_events(site, request, key, template, build, fingerprint, interval))


async def _region_events(
    site: Site,
    request: Request,
    key: str,
    template: str,
    build: Builder,
    fingerprint: Fingerprint,
    interval: float,
) -> AsyncIterator[str]:
    hub = site.hub
    async with hub.stream() as gen:
        with hub.watching(key, lambda: fingerprint(site), interval) as watch:
            yield f"retry: {RETRY_MS}\n\n"
            # The page was rendered just now: the first fingerprint is its baseline.
            seen = watch.version or 1
            while not hub.closing:
                newer = await hub.next(gen, PING)
                if newer == gen:
                    yield PING_LINE
                    continue
                gen = newer
                if watch.version > seen:
                    seen = watch.version
                    context = await site.run(lambda: build(site, request))
                    html = site.renderer.fragment(template, "live", context)
                    yield sse({"live": html}, event="regions", id=str(seen))
                if hub.problem:
                    yield sse({"problem": hub.problem}, event="problem")
