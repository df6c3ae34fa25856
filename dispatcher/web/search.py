"""Card search (``GET /search``) and bulk actions on what it finds (``POST /search/act``).

One box takes the search syntax of :mod:`dispatcher.kanban.search` (words of the title, an id
prefix, ``assignee:``, ``status:``, ``group:``, ``changed:``, ``created:``); the query, the
sort, the page and the time range are in the URL, so a view can be shared and bookmarked. The
board store sorts and pages (:meth:`~dispatcher.kanban.abc.BoardStore.search_cards`).

A signed-in operator ticks cards, or takes the whole result, and retries, unblocks, moves or
archives them. Each card goes through the call the CLI makes (``dispatch kanban retry``,
``unblock``, ``move``, ``archive``: :class:`~dispatcher.kanban.board.Board`, in one workspace
opened like a CLI command's), so each writes its one event and a card that cannot take the
action is skipped with the CLI's reason. The confirmation names the count; for a whole result
it carries the count it named, and if the search finds another number of cards by the time the
operator confirms, nothing is done (409) and the page says to look again. A read-only view (not
signed in) shows no boxes and no actions.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from dispatcher.kanban.errors import BadQuery, KanbanError
from dispatcher.kanban.model import MOVE_TARGETS, Card
from dispatcher.kanban.rows import CARD_PREFIX
from dispatcher.kanban.search import PAGE, SORT_COLUMNS, CardPage, CardQuery, SortKey, parse
from dispatcher.web.charts import link
from dispatcher.web.errors import Conflict, FormError
from dispatcher.web.forms import Form, read_form
from dispatcher.web.guard import check_csrf, check_sender
from dispatcher.web.pages import site_of
from dispatcher.web.site import Site
from scope.foundation.errors import DispatchError

ACTIONS = {
    "retry": ("Retry", "retried"),
    "unblock": ("Unblock", "unblocked"),
    "move": ("Move", "moved"),
    "archive": ("Archive", "archived"),
}
"""Action → (button, past tense)."""
RANGES = ("1h", "24h", "7d", "30d")
MOST = 1000
"""Cards one bulk action takes at most (a bigger result: narrow the search)."""
CSRF_ACTION = "cards.bulk"


def query_of(request: Request, now: float) -> tuple[str, str, CardQuery]:
    """The search text, the time range and the query they make, from the URL."""
    params = request.query_params
    text = params.get("q", "")
    chosen = params.get("range", "")
    chosen = chosen if chosen in RANGES else ""
    full = text + (f" changed:{chosen}" if chosen and "changed:" not in text else "")
    try:
        offset = max(0, int(params.get("offset", "0")))
    except ValueError:
        offset = 0
    query = parse(
        full,
        now=now,
        sort=params.get("sort") or None,
        descending=params.get("desc", "1") != "0",
        offset=offset,
        limit=PAGE,
    )
    return text, chosen, query


def search_context(site: Site, request: Request, now: float | None = None) -> dict[str, Any]:
    """One page of results (or the reason the search cannot be read)."""
    now = time.time() if now is None else now
    text = request.query_params.get("q", "")
    chosen, problem = "", None
    page, query = CardPage(), CardQuery()
    try:
        text, chosen, query = query_of(request, now)
        page = site.source.store.search_cards(query)
    except BadQuery as err:
        problem = err.message

    def at(**change: Any) -> str:
        base = {
            "q": text,
            "range": chosen,
            "sort": query.sort.value,
            "desc": "1" if query.descending else "0",
            "offset": query.offset or None,
        }
        return link("/search", **{**base, **change})

    context = site.context(request, title="Search", nav="search")
    context.update(
        text=text,
        chosen=chosen,
        ranges=RANGES,
        problem=problem,
        cards=page.cards,
        total=page.total,
        query=query,
        sorts={
            key.value: at(sort=key.value, desc="0" if _toggles(query, key) else "1", offset=None)
            for key in SORT_COLUMNS
        },
        newer=at(offset=max(0, query.offset - query.limit) or None) if query.offset else None,
        older=at(offset=query.offset + query.limit)
        if query.offset + query.limit < page.total
        else None,
        here=at(),
        in_group=in_group,
        actions=ACTIONS,
        move_targets=[s.value for s in MOVE_TARGETS],
        most=MOST,
    )
    return context


def in_group(group: str) -> str:
    """The search for the cards of ``group`` (quoted when it has blanks)."""
    term = f'group:"{group}"' if any(c.isspace() for c in group) else f"group:{group}"
    return link("/search", q=term)


def _toggles(query: CardQuery, key: SortKey) -> bool:
    """Whether following the column's link turns the order around (it is the sort now, and
    descending)."""
    return query.sort is key and query.descending


async def search(request: Request) -> Response:
    """``GET /search``."""
    site = site_of(request)

    def build() -> dict[str, Any]:
        return search_context(site, request)

    context = await site.run(build)
    status = 400 if context["problem"] else 200
    return await site.run(lambda: site.page(request, "search.html", context, status=status))


# -- bulk actions -------------------------------------------------------------------------------


def _chosen(site: Site, form: Form, now: float) -> tuple[list[str], str]:
    """The card ids the form names (ticked, or the whole result) and how they were chosen."""
    if form.get("scope") == "all":
        text = form.get("q") or ""
        chosen = form.get("range") or ""
        full = text + (f" changed:{chosen}" if chosen in RANGES and "changed:" not in text else "")
        try:
            query = parse(full, now=now, limit=MOST)
        except BadQuery as err:
            raise FormError("q", err.message) from None
        found = site.source.store.search_cards(query.page(0, MOST))
        if found.total > MOST:
            raise Conflict(
                f"the search finds {found.total} cards; one action takes at most {MOST}",
                remedy="narrow the search",
            )
        named = form.integer("count")
        if named is not None and named != found.total:
            raise Conflict(
                f"the search now finds {found.total} cards, not the {named} you confirmed",
                remedy="look at the result again and confirm anew",
            )
        return [card.id for card in found.cards], f"every card the search finds ({text or 'all'})"
    ids = list(dict.fromkeys(form.values("card")))
    if not ids:
        raise FormError("card", "tick at least one card (or act on the whole result)")
    if len(ids) > MOST:
        raise FormError("card", f"at most {MOST} cards at once")
    for card_id in ids:
        if not card_id.startswith(CARD_PREFIX) or not card_id[2:].isalnum():
            raise FormError("card", f"not a card id: {card_id[:40]!r}")
    return ids, "the ticked cards"


def _act_on(site: Site, action: str, target: str | None, ids: list[str]) -> list[tuple[str, str]]:
    """Each card through the CLI's call, in one workspace; (card id, why) of those skipped."""
    skipped: list[tuple[str, str]] = []
    with site.source.action() as workspace:
        board = workspace.board
        for card_id in ids:
            now = workspace.now()
            try:
                if action == "retry":
                    board.retry(card_id, reason="retried in dispatch web", now=now)
                elif action == "unblock":
                    board.unblock(card_id, now=now)
                elif action == "move":
                    assert target is not None
                    board.move(card_id, target, now=now)
                else:
                    board.archive(card_id, now=now)
            except (KanbanError, DispatchError) as err:
                skipped.append((card_id, err.message))
    return skipped


async def act(request: Request) -> Response:
    """``POST /search/act``: retry, unblock, move or archive the ticked cards, or every card
    the search finds; asks first, naming the count."""
    site = site_of(request)
    check_sender(request)
    form = await read_form(request, max_fields=MOST + 20)
    check_csrf(request, site.keys, CSRF_ACTION, form.fields)
    action = form.choice("action", tuple(ACTIONS))
    target = (
        form.choice("status", tuple(s.value for s in MOVE_TARGETS)) if action == "move" else None
    )
    back = form.get("next") or "/search"
    now = time.time()
    ids, how = await site.run(lambda: _chosen(site, form, now))
    verb = ACTIONS[action][0] + (f" to {target}" if target else "")
    if not form.confirmed:
        cards = await site.run(lambda: _titles(site, ids[:20]))
        context = site.context(request, title="Confirm", nav="search")
        context.update(
            question=f"{verb}: {len(ids)} card{'s' if len(ids) != 1 else ''} ({how})?",
            cards=cards,
            more=len(ids) - len(cards),
            action=request.url.path,
            fields=[(k, v) for k, v in form.pairs if k not in ("confirm", "count")]
            + [("count", str(len(ids)))],
            back=back if back.startswith("/search") else "/search",
        )
        return site.page(request, "bulk_confirm.html", context)
    skipped = await site.run(lambda: _act_on(site, action, target, ids))
    context = site.context(request, title="Done", nav="search")
    context.update(
        done=len(ids) - len(skipped),
        asked=len(ids),
        verb=ACTIONS[action][1],
        target=target,
        skipped=skipped,
        back=back if back.startswith("/search") else "/search",
    )
    return site.page(request, "bulk_done.html", context)


def _titles(site: Site, ids: list[str]) -> list[Card]:
    found = []
    for card_id in ids:
        try:
            found.append(site.source.store.get_card(card_id))
        except DispatchError:
            continue
    return found
