"""The ``kanban`` group's arguments that several of its commands share: a card's body, the
worker commands' card and run, ``add``'s and ``list``'s options (kept apart from the handlers in
:mod:`dispatcher.cli.kanban_cmd`)."""

from __future__ import annotations

from dispatcher.cli.options import positive_int, watch_options
from dispatcher.cli.parser import Parser, int_arg, path_arg
from dispatcher.kanban.board import FAILURE_LIMIT_RANGE, PRIORITY_RANGE
from dispatcher.kanban.model import CardStatus
from dispatcher.kanban.views import SORT_KEYS

PRIORITY = int_arg(*PRIORITY_RANGE)
FAILURE_LIMIT = int_arg(*FAILURE_LIMIT_RANGE)
CARD_HELP = "card id or a unique prefix (at least 4 characters)"
GROUP_HELP = "the card's group (a customer, a tenant): claims take turns between groups"


def add_options(add: Parser) -> None:
    """``kanban add``'s title and options."""
    add.add_argument("title", metavar="TITLE", help="the card's title")
    add.add_argument("--assignee", required=True, metavar="NAME", help="a kanban.assignees name")
    body_options(add)
    add.add_argument("--priority", type=PRIORITY, default=0, metavar="N", help="higher = sooner")
    add.add_argument(
        "--parent",
        action="append",
        default=[],
        metavar="ID",
        help="a card that must be done first (repeatable)",
    )
    add.add_argument("--idempotency-key", metavar="K", help="adding the same key again is a no-op")
    add.add_argument(
        "--failure-limit", type=FAILURE_LIMIT, metavar="N", help="override kanban.failure_limit"
    )
    # Not dest "group": that names the command group (`kanban`) on the namespace.
    add.add_argument("--group", dest="card_group", metavar="G", help=GROUP_HELP)


def list_options(ls: Parser) -> None:
    """``kanban list``'s filters, order, limit and --watch."""
    ls.add_argument(
        "--status",
        choices=[s.value for s in CardStatus],
        metavar="S",
        help="only cards in status S (" + ", ".join(s.value for s in CardStatus) + ")",
    )
    ls.add_argument("--assignee", metavar="A", help="only cards of assignee A")
    ls.add_argument("--group", dest="card_group", metavar="G", help="only cards of group G")
    ls.add_argument("--all", action="store_true", help="include archived cards")
    ls.add_argument(
        "--sort",
        choices=sorted(SORT_KEYS),
        default="priority",
        help="order: priority (highest first, the default), created (oldest first), "
        "updated (newest first), status (board order) or id",
    )
    ls.add_argument("--limit", type=positive_int, metavar="N", help="at most N cards")
    watch_options(ls)


def body_options(parser: Parser) -> None:
    """``--body`` or ``--body-file``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--body", metavar="TEXT", help="the card's body (the worker's brief)")
    group.add_argument(
        "--body-file", type=path_arg, metavar="F", help="read the body from F ('-': stdin)"
    )


def worker_options(parser: Parser) -> None:
    """A worker command's card and run (from its environment by default)."""
    parser.add_argument("id", nargs="?", metavar="ID", help="the card (default: $DISPATCH_CARD_ID)")
    parser.add_argument("--run", metavar="RUN", help="the run id (default: $DISPATCH_RUN_ID)")
