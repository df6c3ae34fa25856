"""`dispatch kanban`: the board (add, list, show, edit, board), the dispatcher (tick, pause,
resume), worker reports (complete, block, review, defer) and operator overrides (unblock,
retry, move, archive). ``add`` and the worker reports are handled in
:mod:`~dispatcher.cli.kanban_writes`, which the command-line fast path calls too.

Bad input (an unknown assignee or card, a malformed id, a stale run id) exits 2 with one line
and changes nothing. ``tick`` exits 0 even when spawns were refused: refusals are recorded on
the board; only usage, config or store errors make it fail.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from dispatcher.app.documents import (
    board_document,
    card_document,
    card_waits_of,
    listed_card_json,
)
from dispatcher.app.workspace import Workspace
from dispatcher.cli import fastpath
from dispatcher.cli.context import Context
from dispatcher.cli.kanban_args import (
    CARD_HELP,
    FAILURE_LIMIT,
    GROUP_HELP,
    PRIORITY,
    add_options,
    body_options,
    list_options,
    worker_options,
)
from dispatcher.cli.kanban_writes import (
    handle_add,
    handle_block,
    handle_complete,
    handle_defer,
    handle_review,
    print_card,
    read_body,
)
from dispatcher.cli.options import watch_options, watched
from dispatcher.cli.parser import (
    Parser,
    Subparsers,
    add_group,
    add_subgroups,
    int_arg,
)
from dispatcher.kanban.board import Board
from dispatcher.kanban.model import MOVE_TARGETS, Card, CardEdit, CardStatus
from dispatcher.kanban.views import (
    board_text,
    card_table,
    deferred_cards,
    show_text,
    sorted_cards,
    tick_json,
    tick_text,
)
from dispatcher.launch.resources import resources_text, sessions_of
from scope.abc import CallerKind
from scope.foundation.errors import UsageError

if TYPE_CHECKING:
    from dispatcher.app.limitview import Waits


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `kanban` group."""
    parser = add_group(subparsers, "kanban", common)
    subs = add_subgroups(parser, "kanban_command")

    def sub(name: str, help: str, handler: object) -> Parser:
        command = subs.add_parser(name, help=help, description=help, parents=[common])
        command.set_defaults(handler=handler)
        return command

    add_options(sub("add", "Add a card; prints its id.", handle_add))

    list_options(sub("list", "List cards (archived ones only with --all).", handle_list))

    show = sub("show", "Show a card with its runs and events.", handle_show)
    show.add_argument("id", metavar="ID", help=CARD_HELP)

    edit = sub("edit", "Change a card's title, body, priority, assignee or group.", handle_edit)
    edit.add_argument("id", metavar="ID", help=CARD_HELP)
    edit.add_argument("--title", help="a new title")
    body_options(edit)
    edit.add_argument(
        "--priority", type=PRIORITY, metavar="N", help="a new priority (higher = sooner)"
    )
    edit.add_argument("--assignee", metavar="NAME", help="another kanban.assignees name")
    edit.add_argument(
        "--failure-limit",
        type=FAILURE_LIMIT,
        metavar="N",
        help="override kanban.failure_limit for it",
    )
    edit.add_argument("--group", dest="card_group", metavar="G", help=GROUP_HELP + " ('' for none)")

    tick = sub("tick", "Run one dispatcher pass (for a Type=oneshot unit or cron).", handle_tick)
    tick.add_argument("--max", type=int_arg(0, 10**6), metavar="N", help="claim at most N cards")
    tick.add_argument(
        "--dry-run", action="store_true", help="show what would start; change nothing"
    )

    _worker_commands(sub)

    unblock = sub("unblock", "Unblock a card (resets its failure count).", handle_unblock)
    unblock.add_argument("id", metavar="ID", help=CARD_HELP)

    retry = sub(
        "retry",
        "Run a done, blocked or review card again (a new run; counts reset).",
        handle_retry,
    )
    retry.add_argument("id", metavar="ID", help=CARD_HELP)
    retry.add_argument(
        "--reason", metavar="TEXT", help="why, recorded in the card's events (default: retry)"
    )

    move = sub("move", "Operator override of a card's status.", handle_move)
    move.add_argument("id", metavar="ID", help=CARD_HELP)
    move.add_argument("status", metavar="STATUS", help="/".join(s.value for s in MOVE_TARGETS))

    archive = sub("archive", "Archive a card (stops a running worker first).", handle_archive)
    archive.add_argument("id", metavar="ID", help=CARD_HELP)

    board = sub("board", "A compact view of the board by status.", handle_board)
    watch_options(board)
    sub("pause", "Stop claiming cards (stored; survives restarts).", handle_pause)
    sub("resume", "Resume claiming cards.", handle_resume)


def _worker_commands(sub: Callable[[str, str, object], Parser]) -> None:
    """``complete``, ``block`` and ``review``: what a worker reports about its own card."""
    complete = sub("complete", "Worker: report the card done.", handle_complete)
    worker_options(complete)
    complete.add_argument("--result", metavar="TEXT", help="a short result to store")

    block = sub("block", "Worker: block the card.", handle_block)
    worker_options(block)
    block.add_argument(
        "--kind",
        required=True,
        choices=list(fastpath.BLOCK_KINDS),
        help="needs_input: waits for a person (unblock); transient: retried after a while",
    )
    block.add_argument("--reason", required=True, metavar="TEXT", help="why, for the operator")

    review = sub("review", "Worker: hand the card to review.", handle_review)
    worker_options(review)

    defer = sub(
        "defer",
        "Worker: try the card (in a cron worker: the fire) again later (not counted).",
        handle_defer,
    )
    worker_options(defer)
    when = defer.add_argument_group("when").add_mutually_exclusive_group(required=True)
    when.add_argument("--for", dest="for_", metavar="DURATION", help="from now (5m, 1h30m)")
    when.add_argument("--until", metavar="TIME", help="an ISO-8601 time (local without offset)")
    defer.add_argument("--reason", default="", metavar="TEXT", help="why, for the operator")


# -- helpers ----------------------------------------------------------------------------------


def _workspace(ctx: Context) -> Workspace:
    workspace = Workspace(
        ctx.settings,
        ctx.state_dir,
        environ=ctx.environ,
        config_path=ctx.config_path,
        caller=CallerKind.ONESHOT,
    )
    ctx.on_close(workspace)
    return workspace


def _refresh(ctx: Context, workspace: Workspace) -> None:
    """Reconcile finished runs before a board read, unless the config is broken: closing a
    run applies the configured failure taxonomy, which built-in defaults would get wrong."""
    if ctx.config_problem is None:
        workspace.refresh()


# -- operator commands ------------------------------------------------------------------------


def handle_list(args: argparse.Namespace, ctx: Context) -> int:
    """List cards after reconciling finished runs (``--watch``: again and again)."""
    return watched(args, ctx, lambda: _list_once(args, ctx))


def _list_once(args: argparse.Namespace, ctx: Context) -> int:
    # The group rule of `kanban add`, checked before the board is touched: a control
    # character is refused (exit 2, nothing changed), not matched.
    group = None if args.card_group is None else Board.check_group(args.card_group)
    workspace = _workspace(ctx)
    _refresh(ctx, workspace)
    cards = workspace.store.list_cards(
        statuses=[CardStatus(args.status)] if args.status else None,
        assignee=args.assignee,
        include_archived=args.all,
    )
    if group is not None:
        cards = [c for c in cards if c.group == group]
    cards = sorted_cards(cards, args.sort, args.limit)
    assignees = _assignees(ctx)
    waits = _waits(ctx, workspace, cards)
    if ctx.json:
        ctx.emit_json([listed_card_json(c, assignees, waits) for c in cards])
    else:
        times = ctx.times()
        deferred = deferred_cards(cards, workspace.store.runs_of, times.now)
        for line in card_table(
            cards, times=times, assignees=assignees, waits=waits.texts(), deferred=deferred
        ):
            ctx.out(line)
    return 0


def _waits(ctx: Context, workspace: Workspace, cards: list[Card]) -> Waits:
    """Which full limit each card waits for (nothing while the config is not loaded)."""
    from dispatcher.app.limitview import Waits

    if ctx.config_problem is not None:
        return Waits()
    return card_waits_of(workspace, cards)


def _assignees(ctx: Context) -> frozenset[str] | None:
    """The configured assignee names; None while the config is not loaded (unknowable)."""
    if ctx.config_problem is not None:
        return None
    return frozenset(ctx.settings.kanban.assignees)


def handle_show(args: argparse.Namespace, ctx: Context) -> int:
    """One card with runs and events."""
    workspace = _workspace(ctx)
    card_id = workspace.store.resolve_card(args.id).id
    _refresh(ctx, workspace)
    if ctx.json:
        ctx.emit_json(card_document(workspace, card_id))
        return 0
    card = workspace.store.get_card(card_id)
    runs = workspace.store.runs_of(card_id)
    events = workspace.store.events_of(card_id)
    hosts = workspace.run_hosts(card_id)
    # Each run's class, peak memory and CPU time come with its session (this host's).
    sessions = sessions_of(workspace.registry(), (run.session_id for run in runs))
    used = {run.run_id: resources_text(sessions.get(run.session_id or "")) for run in runs}
    shown = hosts if workspace.cluster.clustered else None
    wait = _waits(ctx, workspace, [card]).text(card.id)
    limit = workspace.settings.kanban.limit_for(card.assignee)
    for line in show_text(
        card, runs, events, times=ctx.times(), hosts=shown, used=used, wait=wait, limit=limit
    ):
        ctx.out(line)
    return 0


def handle_edit(args: argparse.Namespace, ctx: Context) -> int:
    """Change fields of a card."""
    edit = CardEdit(
        title=args.title,
        body=read_body(args),
        priority=args.priority,
        assignee=args.assignee,
        failure_limit=args.failure_limit,
        group=args.card_group,
    )
    if not edit.changed():
        raise UsageError(
            "nothing to change",
            remedy="give --title, --body, --body-file, --priority, --assignee, --failure-limit "
            "or --group",
        )
    workspace = _workspace(ctx)
    card = workspace.board.edit(args.id, edit, now=workspace.now())
    print_card(ctx, card, f"{card.id} edited")
    return 0


def handle_unblock(args: argparse.Namespace, ctx: Context) -> int:
    """Blocked → ready, counts reset."""
    workspace = _workspace(ctx)
    card = workspace.board.unblock(args.id, now=workspace.now())
    print_card(ctx, card, f"{card.id} {card.status.value}")
    return 0


def handle_retry(args: argparse.Namespace, ctx: Context) -> int:
    """A new run of a finished card (the gateway is poked and claims it at once)."""
    workspace = _workspace(ctx)
    card = workspace.board.retry(args.id, reason=args.reason, now=workspace.now())
    print_card(ctx, card, f"{card.id} {card.status.value} (retry)")
    return 0


def handle_move(args: argparse.Namespace, ctx: Context) -> int:
    """Operator override of the status."""
    workspace = _workspace(ctx)
    card = workspace.board.move(args.id, args.status, now=workspace.now())
    print_card(ctx, card, f"{card.id} {card.status.value}")
    return 0


def handle_archive(args: argparse.Namespace, ctx: Context) -> int:
    """Archive (stopping a running worker first)."""
    workspace = _workspace(ctx)
    card = workspace.board.archive(args.id, now=workspace.now())
    print_card(ctx, card, f"{card.id} archived")
    return 0


def handle_board(args: argparse.Namespace, ctx: Context) -> int:
    """Cards grouped by status (``--watch``: again and again)."""
    return watched(args, ctx, lambda: _board_once(ctx))


def _board_once(ctx: Context) -> int:
    workspace = _workspace(ctx)
    _refresh(ctx, workspace)
    cards = workspace.store.list_cards()
    paused = workspace.store.paused()
    assignees = _assignees(ctx)
    waits = _waits(ctx, workspace, cards)
    if ctx.json:
        ctx.emit_json(board_document(cards, paused=paused, assignees=assignees, waits=waits))
    else:
        times = ctx.times()
        deferred = deferred_cards(cards, workspace.store.runs_of, times.now)
        for line in board_text(
            cards,
            paused=paused,
            times=times,
            assignees=assignees,
            waits=waits.texts(),
            deferred=deferred,
        ):
            ctx.out(line)
    return 0


def handle_pause(args: argparse.Namespace, ctx: Context) -> int:
    """Stop claiming."""
    return _set_paused(ctx, True)


def handle_resume(args: argparse.Namespace, ctx: Context) -> int:
    """Resume claiming."""
    return _set_paused(ctx, False)


def _set_paused(ctx: Context, paused: bool) -> int:
    workspace = _workspace(ctx)
    changed = workspace.store.set_paused(paused)
    if ctx.json:
        ctx.emit_json({"paused": paused, "changed": changed})
    else:
        state = "paused" if paused else "resumed"
        ctx.out(f"claiming {state}" + ("" if changed else " (already)"))
    return 0


# -- the dispatcher ---------------------------------------------------------------------------


def handle_tick(args: argparse.Namespace, ctx: Context) -> int:
    """One dispatcher pass as a oneshot caller."""
    if args.max is not None and args.max < 0:
        raise UsageError(f"--max {args.max}: must not be negative")
    workspace = _workspace(ctx)
    held = _admission(ctx, dry_run=args.dry_run)
    report = workspace.tick(max_claims=0 if held else args.max, dry_run=args.dry_run)
    for warning in report.warnings:
        ctx.warn(f"warning: {warning}")
    if ctx.json:
        ctx.emit_json({**tick_json(report), "held": held})
    else:
        for line in tick_text(report):
            ctx.out(line)
        if held:
            ctx.out(f"held: {held}: nothing claimed (admission); running workers continue")
    return 0


def _admission(ctx: Context, *, dry_run: bool) -> str | None:
    """This host's admission for a oneshot tick (continuing from the last verdict in the
    state dir, so the hysteresis and the minimum hold span ticks): why it holds, or None.
    A dry run decides the same way but keeps nothing."""
    from dispatcher.gateway.admission import HostAdmission
    from scope.foundation.clock import SystemClock

    admission = HostAdmission(
        lambda: ctx.settings.admission,
        ctx.state_dir,
        ctx.environ,
        SystemClock(),
        writer="kanban tick",
    )
    verdict = admission.peek() if dry_run else admission.check()
    return (verdict.reason or "admission") if verdict.held else None
