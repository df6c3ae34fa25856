"""The short write commands of ``dispatch kanban``: ``add`` and a worker's reports
(``complete``, ``block``, ``review``, ``defer``). ``kanban_cmd`` registers them with the rest of
the group; the command-line fast path (:mod:`dispatcher.cli.fastpath`) calls the same handlers.

Scripts and workers run these again and again, so this module imports at its top only what
they need with a current config snapshot (:mod:`dispatcher.app.snapshot`): the board and its
database. The config schema, the registry, the cluster driver and the views are imported only
when a command needs them (a changed or broken config, cluster mode, ``--json`` of a report).

Which board: an operator's command (``add``, ``defer``, and a report outside a worker) needs a
valid config, whose errors exit 2; a report inside a worker (``DISPATCH_RUN_ID`` and
``DISPATCH_HOST_ID`` set) uses what its run was started with (:mod:`dispatcher.app.reports`)
and a config that does not load only costs it the configured settings, silently.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.app import snapshot
from dispatcher.app.reports import captured
from dispatcher.cli.context import Context
from dispatcher.cluster.url import ENV_URL
from scope.foundation.errors import DispatchError, UsageError
from scope.foundation.text import quote

if TYPE_CHECKING:
    import argparse

    from dispatcher.app.openboard import OpenBoard
    from dispatcher.app.snapshot import Snapshot
    from dispatcher.kanban.model import Card
    from dispatcher.settings import Settings

MAX_BODY_BYTES = 16 * 1024 * 1024


# -- the board ----------------------------------------------------------------------------------


def open_board(ctx: Context) -> OpenBoard:
    """The board an operator's write command changes: from the config snapshot when it is
    current (single host), else from the config, whose errors are the command's (exit 2)."""
    facts = current_snapshot(ctx)
    if facts is not None and not facts.clustered and not ctx.environ.get(ENV_URL):
        return _board_of(ctx, facts)
    ctx.show_warnings()  # the full path: cluster mode may warn
    loaded = ctx.config
    board = _workspace(ctx, loaded.settings, config_path=ctx.config_path)
    if facts is None and snapshot.enabled(ctx.environ):
        snapshot.store(board.state_dir, loaded)
    return board


def open_report_board(ctx: Context) -> OpenBoard:
    """The board a worker reports to: inside a worker (``DISPATCH_RUN_ID`` or
    ``DISPATCH_FIRE_KEY``, and ``DISPATCH_HOST_ID`` set), only what its run was started with,
    so a broken, missing or changed config never stops the report and none of its errors are
    printed; elsewhere (an operator's shell) :func:`open_board`."""
    if not captured(ctx.environ):
        return open_board(ctx)
    if not ctx.environ.get(ENV_URL):
        facts = _quiet_snapshot(ctx)
        if facts is not None:
            return _board_of(ctx, facts)
    from dispatcher.app.reports import captured_settings

    ctx.show_warnings()
    settings = captured_settings(_quiet_settings(ctx), ctx.environ)
    assert settings is not None  # a worker's environment, checked above
    return _workspace(ctx, settings)


def current_snapshot(ctx: Context) -> Snapshot | None:
    """The config snapshot, if enabled and current. The config path is resolved first, as
    loading the config would (a ``--config`` naming no file is the command's error)."""
    config = ctx.config_path
    if not snapshot.enabled(ctx.environ):
        return None
    from dispatcher.paths import resolve_state_dir

    try:
        state_dir = resolve_state_dir(getattr(ctx.args, "state_dir", None), ctx.environ)
    except DispatchError:
        return None  # reported by opening the board, as without a snapshot
    return snapshot.load(state_dir, config)


def _quiet_snapshot(ctx: Context) -> Snapshot | None:
    """:func:`current_snapshot` for a worker's report: no config error is the report's."""
    try:
        return current_snapshot(ctx)
    except DispatchError:
        return None


def _quiet_settings(ctx: Context) -> Settings:
    """The config's settings when it is usable (``kanban.transient_block`` and the
    notification rules still apply), else the built-in defaults, without a word: the worker's
    report does not depend on it. A usable config leaves a snapshot for the next report."""
    from dispatcher.config import load_config, resolve_config_path
    from dispatcher.settings import Settings

    try:
        path = resolve_config_path(getattr(ctx.args, "config", None), ctx.environ)
        loaded = load_config(path)
    except DispatchError:
        return Settings()
    if snapshot.enabled(ctx.environ):
        # The state dir's own error, if any, is reported by opening the board.
        with contextlib.suppress(DispatchError):
            snapshot.store(ctx.state_dir, loaded)
    return loaded.settings


def _board_of(ctx: Context, facts: Snapshot) -> OpenBoard:
    """The single host's board, with the snapshot's settings."""
    from dispatcher.app.clusterstate import open_local_state
    from dispatcher.app.openboard import OpenBoard

    state_dir = ctx.state_dir
    board = OpenBoard(open_local_state(state_dir, facts.routes), facts, state_dir=state_dir)
    ctx.on_close(board)
    return board


def _workspace(ctx: Context, settings: Settings, *, config_path: Path | None = None) -> OpenBoard:
    from dispatcher.app.workspace import Workspace

    workspace = Workspace(settings, ctx.state_dir, environ=ctx.environ, config_path=config_path)
    ctx.on_close(workspace)
    return workspace


# -- arguments and output -------------------------------------------------------------------


def read_body(args: argparse.Namespace) -> str | None:
    """``--body``, or what ``--body-file`` holds (``-``: stdin), or None."""
    if args.body is not None:
        return str(args.body)
    if args.body_file is None:
        return None
    try:
        if args.body_file == "-":
            raw = sys.stdin.buffer.read(MAX_BODY_BYTES + 1)
        else:
            with open(Path(args.body_file).expanduser(), "rb") as handle:
                raw = handle.read(MAX_BODY_BYTES + 1)
    except OSError as err:
        raise UsageError(
            f"--body-file {args.body_file}: {err.strerror}", remedy="give a readable file"
        ) from None
    if len(raw) > MAX_BODY_BYTES:
        raise UsageError(f"--body-file {args.body_file}: larger than 16 MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--body-file {args.body_file}: not valid UTF-8") from None


def _card_id(args: argparse.Namespace, ctx: Context) -> str:
    card = args.id or ctx.environ.get("DISPATCH_CARD_ID")
    if not card:
        raise UsageError(
            "no card id", remedy="pass ID or run inside a worker (DISPATCH_CARD_ID is set there)"
        )
    return str(card)


def _run_id(args: argparse.Namespace, ctx: Context) -> str | None:
    return args.run or ctx.environ.get("DISPATCH_RUN_ID") or None


def print_card(ctx: Context, card: Card, line: str) -> None:
    """A changed card: as ``kanban list --json`` shows one, or ``line``."""
    if ctx.json:
        from dispatcher.kanban.views import card_json

        ctx.emit_json(card_json(card))
    else:
        ctx.out(line)


# -- the commands ---------------------------------------------------------------------------


def handle_add(args: argparse.Namespace, ctx: Context) -> int:
    """Add a card and print its id (an idempotent repeat prints the existing id)."""
    body = read_body(args) or ""
    workspace = open_board(ctx)
    card, _created = workspace.board.add(
        args.title,
        assignee=args.assignee,
        now=workspace.now(),
        body=body,
        priority=args.priority,
        parents=args.parent,
        idempotency_key=args.idempotency_key,
        failure_limit=args.failure_limit,
        group=args.card_group,
    )
    if ctx.json:
        ctx.emit_json({"id": card.id})
    else:
        ctx.out(card.id)
    return 0


def handle_complete(args: argparse.Namespace, ctx: Context) -> int:
    """The worker's card is done."""
    workspace = open_report_board(ctx)
    card = workspace.board.complete(
        _card_id(args, ctx), _run_id(args, ctx), now=workspace.now(), result=args.result
    )
    print_card(ctx, card, f"{card.id} done")
    return 0


def handle_block(args: argparse.Namespace, ctx: Context) -> int:
    """The worker blocks its card."""
    workspace = open_report_board(ctx)
    card = workspace.board.block(
        _card_id(args, ctx),
        _run_id(args, ctx),
        kind=args.kind,
        reason=args.reason,
        now=workspace.now(),
    )
    print_card(ctx, card, f"{card.id} blocked ({args.kind})")
    return 0


def handle_review(args: argparse.Namespace, ctx: Context) -> int:
    """The worker hands its card to review."""
    workspace = open_report_board(ctx)
    card = workspace.board.review(_card_id(args, ctx), _run_id(args, ctx), now=workspace.now())
    print_card(ctx, card, f"{card.id} in review")
    return 0


def handle_defer(args: argparse.Namespace, ctx: Context) -> int:
    """The worker defers its card: the run ends ``deferred`` and the card is ready at TIME.
    Inside a cron worker (no card, a fire key) it defers the fire's next try instead."""
    from dispatcher.timefmt import iso

    env = ctx.environ
    if not (args.id or args.run or env.get("DISPATCH_CARD_ID")) and env.get("DISPATCH_FIRE_KEY"):
        return _defer_fire(args, ctx)
    workspace = open_report_board(ctx)
    now = workspace.now()
    until = _defer_until(args, now)
    card = workspace.board.defer(
        _card_id(args, ctx), _run_id(args, ctx), until=until, reason=args.reason, now=now
    )
    print_card(ctx, card, f"{card.id} deferred until {iso(until)}")
    return 0


def _defer_fire(args: argparse.Namespace, ctx: Context) -> int:
    from dispatcher.app.reports import defer_fire
    from dispatcher.cron.report import row_entry
    from dispatcher.timefmt import iso

    ctx.show_warnings()
    row, until = defer_fire(
        _quiet_settings(ctx),
        ctx.state_dir,
        ctx.environ,
        until=lambda now: _defer_until(args, now),
        reason=args.reason,
    )
    if ctx.json:
        ctx.emit_json(row_entry(row))
    else:
        ctx.out(f"{row.fire_key}: next try deferred until {iso(until)}")
    return 0


def _defer_until(args: argparse.Namespace, now: float) -> float:
    from scope.foundation.errors import Invalid
    from scope.foundation.values import parse_duration

    if args.for_ is None:
        flag, text, until = "--until", args.until, _until_arg(args.until)
    else:
        try:
            flag, text, until = "--for", args.for_, now + parse_duration(args.for_)
        except Invalid as err:
            raise UsageError(f"--for: {err.problem}") from None
    if until <= now:
        # Checked here, where the worker's own words are known (the board sees a timestamp).
        raise UsageError(f"{flag} {quote(text)}: the time must be in the future")
    return until


def _until_arg(text: str) -> float:
    from scope.foundation.errors import Invalid
    from scope.foundation.values import ISO_HINT, parse_iso_time

    try:
        moment = parse_iso_time(text, None)
        return (moment if moment.tzinfo else moment.astimezone()).timestamp()
    except (Invalid, OverflowError, ValueError, OSError):
        raise UsageError(f"--until {quote(text)}: give an ISO-8601 time ({ISO_HINT})") from None
