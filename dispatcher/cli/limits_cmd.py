"""`dispatch limits`: every named limit with its use, capacity, rate window and what waits.

``dispatch limits [--json]`` reads the holds of every limit in ``limits:`` (fleet-wide ones
across the cluster database, ``scope: host`` ones for this host), the first ready cards in
claim order and the cron fires held back, and prints one entry per limit (the JSON document is
:func:`dispatcher.app.limitview.limits_doc`'s, the one the web serves too).
"""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group

DESCRIPTION = (
    "List the named limits (limits: in config.yaml): the runs and cron fires holding each, its "
    "capacity, the starts its rate window counts, the cards and fires waiting for it, and for "
    "per_group limits the busiest groups."
)


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `limits` command."""
    parser = add_group(subparsers, "limits", common, description=DESCRIPTION)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Print every limit."""
    from dispatcher.app.limitview import limits_doc, limits_text
    from dispatcher.app.workspace import Workspace
    from scope.abc import CallerKind

    if ctx.config_problem is not None:
        # Only the config defines limits: without it they are unknown, never "none".
        if ctx.json:
            ctx.emit_json(None)
        else:
            ctx.out("limits: unknown (config not loaded; limits: in config.yaml defines them)")
        return 0
    workspace = Workspace(
        ctx.settings, ctx.state_dir, environ=ctx.environ, caller=CallerKind.ONESHOT
    )
    ctx.on_close(workspace)
    stamp = workspace.cluster.stamp
    doc = limits_doc(
        ctx.settings,
        workspace.store,
        workspace.cluster.ledger,
        now=workspace.now(),
        host=None if stamp is None else stamp.host_id,
    )
    if ctx.json:
        ctx.emit_json(doc)
    else:
        for line in limits_text(doc):
            ctx.out(line)
    return 0
