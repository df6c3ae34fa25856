"""Cards and runs: what ``dispatch kanban`` does, through the same calls, with its ``--json``.

Reads go through the web's shared reader after the same reconcile ``kanban list`` does
(:meth:`~dispatcher.web.source.Source.refresh`); every change opens its own workspace as a
``dispatch kanban`` command does (:meth:`~dispatcher.web.source.Source.action`), so the board's
validation, its events, the notification outbox and the gateway's wake-up are the CLI's own.

The card list pages by a cursor: the sort key (priority, then age, then id: the order of
``kanban list``) of the last card of a page, so a card that changes between two pages is
neither skipped nor shown twice for a reason of ours. The next page's address is in the
``Link`` header (``rel="next"``); the body stays exactly ``kanban list --json``.
"""

from __future__ import annotations

import base64
import binascii
import json
import urllib.parse
from collections.abc import Mapping
from typing import Any

from dispatcher.app.documents import card_document, card_waits_of, listed_card_json
from dispatcher.kanban.model import Card, CardEdit, CardStatus
from dispatcher.kanban.views import SORT_KEYS, card_json, run_json
from dispatcher.launch.resources import resources_json, sessions_of
from dispatcher.web.api.spec import ApiUsage, Call, Reply

ORDER = SORT_KEYS["priority"]


def next_link(call: Call, **changes: str) -> dict[str, str]:
    """A ``Link`` header to the same address with ``changes`` in its query."""
    path, _, query = call.path.partition("?")
    pairs = [(k, v) for k, v in urllib.parse.parse_qsl(query) if k not in changes]
    pairs += list(changes.items())
    return {"link": f'<{path}?{urllib.parse.urlencode(pairs)}>; rel="next"'}


def _cursor(card: Card) -> str:
    key = list(ORDER(card))
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def _after(text: str | None) -> tuple[Any, ...] | None:
    if text is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        key = json.loads(raw)
        if (
            isinstance(key, list)
            and len(key) == 3
            and all(isinstance(k, int | float) and not isinstance(k, bool) for k in key[:2])
            and isinstance(key[2], str)
        ):
            return tuple(key)
    except (binascii.Error, ValueError):
        pass
    raise ApiUsage("query parameter 'cursor'", "not a cursor this API gave (see the Link header)")


def _group_of(card: Card) -> str | None:
    """The card's group (None: it has none): what the ``group`` filter compares."""
    return card.group


def list_cards(call: Call) -> Reply:
    """``GET /cards``: ``kanban list --json`` (``--status``, ``--assignee``, ``--all``),
    paged."""
    source = call.site.source
    params = call.params
    source.refresh()
    cards = source.store.list_cards(
        statuses=[CardStatus(params["status"])] if params["status"] else None,
        assignee=params["assignee"],
        include_archived=params["all"],
    )
    if params["group"] is not None:
        cards = [c for c in cards if _group_of(c) == params["group"]]
    ordered = sorted(cards, key=ORDER)
    after = _after(params["cursor"])
    if after is not None:
        ordered = [c for c in ordered if tuple(ORDER(c)) > after]
    page = ordered[: params["limit"]]
    assignees = frozenset(source.settings.kanban.assignees)
    headers = next_link(call, cursor=_cursor(page[-1])) if len(ordered) > len(page) else {}
    waits = card_waits_of(source.reader, page)
    return Reply(document=[listed_card_json(c, assignees, waits) for c in page], headers=headers)


def add_card(call: Call) -> Reply:
    """``POST /cards``: ``kanban add --json``; 201 when made now, 200 for a repeated
    idempotency key (the body's ``idempotency_key`` or the ``Idempotency-Key`` header)."""
    body = call.body
    key = _idempotency_key(body, call.headers)
    with call.site.source.action() as workspace:
        card, created = workspace.board.add(
            body["title"],
            assignee=body["assignee"],
            now=workspace.now(),
            body=body.get("body", ""),
            priority=body.get("priority", 0),
            parents=body.get("parents", ()),
            idempotency_key=key,
            failure_limit=body.get("failure_limit"),
            group=body.get("group"),
        )
    return Reply(
        document={"id": card.id},
        status=201 if created else 200,
        headers={"location": f"/api/v1/cards/{card.id}"},
    )


def _idempotency_key(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    given = body.get("idempotency_key")
    header = headers.get("idempotency-key")
    if given is not None and header is not None and given != header:
        raise ApiUsage(
            "header 'Idempotency-Key'", "differs from the body's idempotency_key; send one"
        )
    return given if given is not None else header


def show_card(call: Call) -> dict[str, Any]:
    """``GET /cards/{card_id}``: ``kanban show --json`` (runs with their host, events)."""
    source = call.site.source
    card_id = source.store.resolve_card(call.params["card_id"]).id
    source.refresh()
    return card_document(source.reader, card_id)


def edit_card(call: Call) -> dict[str, Any]:
    """``PATCH /cards/{card_id}``: ``kanban edit --json``."""
    body = call.body
    edit = CardEdit(
        title=body.get("title"),
        body=body.get("body"),
        priority=body.get("priority"),
        assignee=body.get("assignee"),
        failure_limit=body.get("failure_limit"),
        group=body.get("group"),
    )
    if not edit.changed():
        raise ApiUsage(
            "body",
            "nothing to change: give title, body, priority, assignee, failure_limit or group",
        )
    with call.site.source.action() as workspace:
        card = workspace.board.edit(call.params["card_id"], edit, now=workspace.now())
    return card_json(card)


def move_card(call: Call) -> dict[str, Any]:
    """``POST /cards/{card_id}/move``: ``kanban move --json`` (a live worker is stopped)."""
    with call.site.source.action() as workspace:
        card = workspace.board.move(
            call.params["card_id"], call.body["status"], now=workspace.now()
        )
    return card_json(card)


def retry_card(call: Call) -> dict[str, Any]:
    """``POST /cards/{card_id}/retry``: ``kanban retry --json``."""
    with call.site.source.action() as workspace:
        card = workspace.board.retry(
            call.params["card_id"], reason=call.body.get("reason"), now=workspace.now()
        )
    return card_json(card)


def archive_card(call: Call) -> dict[str, Any]:
    """``POST /cards/{card_id}/archive``: ``kanban archive --json`` (a live worker is
    stopped)."""
    with call.site.source.action() as workspace:
        card = workspace.board.archive(call.params["card_id"], now=workspace.now())
    return card_json(card)


def unblock_card(call: Call) -> dict[str, Any]:
    """``POST /cards/{card_id}/unblock``: ``kanban unblock --json``."""
    with call.site.source.action() as workspace:
        card = workspace.board.unblock(call.params["card_id"], now=workspace.now())
    return card_json(card)


def block_card(call: Call) -> dict[str, Any]:
    """``POST /cards/{card_id}/block``: ``kanban block --json``, fenced by the run id as the
    worker's own command is (a stale run: 409, nothing changed)."""
    body = call.body
    with call.site.source.action() as workspace:
        card = workspace.board.block(
            call.params["card_id"],
            body["run"],
            kind=body["kind"],
            reason=body["reason"],
            now=workspace.now(),
        )
    return card_json(card)


def show_run(call: Call) -> dict[str, Any]:
    """``GET /runs/{run_id}``: the run as ``kanban show --json`` lists it (with its host)."""
    source = call.site.source
    run = source.store.resolve_run(call.params["run_id"])
    doc = run_json(source.store.get_run(run.run_id))
    doc["host"] = source.run_hosts([run.card_id]).get(run.run_id)
    ran = sessions_of(source.registry(), [run.session_id])
    doc.update(resources_json(ran.get(run.session_id or "")))
    return doc
