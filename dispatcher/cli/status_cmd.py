"""``dispatch status [--json]``: is serve running, placement now, workers, cards, next fires,
recent errors. Exit 0 (this reports; ``dispatch doctor`` judges health), except exit 1 when the
state database is unusable (then only whether serve runs, and the error)."""

from __future__ import annotations

import argparse
from typing import Any

from dispatcher.cli.context import Context
from dispatcher.cli.options import watch_options, watched
from dispatcher.cli.parser import Parser, Subparsers, add_group, int_arg
from dispatcher.timefmt import TimeView, iso, span
from registry.errors import StateError


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the ``status`` group."""
    parser = add_group(subparsers, "status", common)
    parser.add_argument(
        "--fires",
        type=int_arg(0, 1000),
        default=5,
        metavar="N",
        help="how many next cron fires to show (default 5; 0 for none)",
    )
    watch_options(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Print the status document (``--watch``: again and again)."""
    return watched(args, ctx, lambda: _once(args, ctx))


def _once(args: argparse.Namespace, ctx: Context) -> int:
    from dispatcher.app.runtime import runtime_from_context
    from dispatcher.gateway.clusterview import cluster_status
    from dispatcher.gateway.report import status_document, status_json

    times = ctx.times()
    try:
        runtime = runtime_from_context(ctx)
        doc = status_document(
            runtime,
            ctx.environ,
            now=times.now,
            fires=args.fires,
            config_loaded=ctx.config_problem is None,
        )
        doc["cluster"] = cluster_status(ctx.settings, ctx.state_dir, ctx.environ)
    except StateError as err:
        _without_database(ctx, err)
        raise
    if ctx.json:
        ctx.emit_json(status_json(doc))
        return 0
    _human(ctx, doc, times)
    return 0


def _without_database(ctx: Context, err: StateError) -> None:
    """What can be said while the state database is unusable: whether a gateway runs (its
    workers do not need the database); the error line itself follows on stderr (exit 1)."""
    from dispatcher.gateway.lock import read_holder

    holder = read_holder(ctx.state_dir)
    if ctx.json:
        serve: dict[str, Any] = {"running": holder is not None}
        if holder is not None:
            serve.update(pid=holder.pid, started_at=iso(holder.started_at))
        ctx.emit_json({"serve": serve, "state_error": err.to_dict()})
    elif holder is not None:
        ctx.out(f"serve:      running, pid {holder.pid}; its workers keep running")
    else:
        ctx.out("serve:      not running")


def _human(ctx: Context, doc: dict[str, Any], times: TimeView) -> None:
    from dispatcher.gateway.clusterview import cluster_lines

    serve = doc["serve"]
    if serve["running"]:
        up = f"since {times.at(serve['started_at'])}"
        if not times.stable:
            up = f"up {span(serve['uptime'])}, {up}"
        ctx.out(f"serve:      running, pid {serve['pid']}, {up}")
    else:
        ctx.out("serve:      not running")
    reload = serve.get("last_reload")
    if reload:
        verdict = "applied" if reload["ok"] else "REJECTED, old config kept"
        detail = reload["source"] if reload["ok"] else reload["error"]
        ctx.out(f"reload:     {verdict} {times.both(reload['finished_at'])}: {detail}")
    ctx.out(f"placement:  {_placement_text(doc, ctx.config_problem is not None)}")
    if serve.get("keepers"):
        ctx.out(f"keepers:    {_keepers_text(serve['keepers'])}")
    if serve.get("relay"):
        ctx.out(f"relay:      {_relay_text(serve['relay'])}")
    kinds = ", ".join(f"{k} {n}" for k, n in doc["workers"]["by_kind"].items()) or "none"
    ctx.out(f"workers:    {doc['workers']['running']} running ({kinds})")
    cards = ", ".join(f"{k} {n}" for k, n in doc["cards"].items() if n) or "none"
    paused = " (claiming paused)" if doc["kanban_paused"] else ""
    ctx.out(f"cards:      {cards}{paused}")
    ctx.out(f"admission:  {_admission_text(doc['admission'], times)}")
    _fires_lines(ctx, doc, times)
    for paused in doc["cron_paused"]:
        ctx.out(f"cron paused: {_paused_text(paused, times)}")
    for line in cluster_lines(doc.get("cluster")):
        ctx.out(line)
    errors = doc["recent_errors"]
    if errors:
        ctx.out("recent errors:")
        for error in errors:
            ctx.out(f"  {times.both(error.get('at'))}  {_error_text(error)}")


def _error_text(error: dict[str, Any]) -> str:
    """``source: message``, the source once (most log lines start with it already)."""
    source, message = f"{error['source']}: ", str(error["message"])
    return message if message.startswith(source) else source + message


def _keepers_text(keepers: dict[str, Any]) -> str:
    """How serve starts keepers: its fork server, and what fell back to a fresh interpreter."""
    state = f"pid {keepers['pid']}" if keepers.get("running") else "not running"
    text = f"fork server {state}, {keepers.get('forked', 0)} forked"
    fallbacks = keepers.get("fallbacks") or {}
    if fallbacks:
        reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(fallbacks.items()))
        text += f"; started the usual way: {sum(fallbacks.values())} ({reasons})"
    if keepers.get("restarts"):
        text += f"; restarted {keepers['restarts']}x"
    return text


def _relay_text(relay: dict[str, Any]) -> str:
    """Short write commands serve answered, and those it left to run on their own."""
    text = f"{relay.get('answered', 0)} short write commands answered by serve"
    declined = relay.get("declined") or {}
    if declined:
        reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(declined.items()))
        text += f"; left to run on their own: {sum(declined.values())} ({reasons})"
    return text


def _admission_text(admission: dict[str, Any], times: TimeView) -> str:
    """``taking new work (memory pressure 0 %, MemAvailable 5.2GiB)`` or the hold and why."""
    now = admission["now"]
    if not admission["enabled"]:
        return f"off (admission.enabled: false; {now})"
    if not admission["held"]:
        return f"taking new work ({now})"
    since = times.both(admission["since"]) if admission["since"] else "unknown"
    who = admission["decided_by"] or "unknown"
    return f"HOLDING new work since {since} ({who}): {admission['reason']}; now {now}"


def _placement_text(doc: dict[str, Any], config_broken: bool) -> str:
    """The placement line; without a gateway it says it is the judgement of one under its
    unit, and with a broken config that the built-in defaults were judged."""
    text = ", ".join(f"{k} {v}" for k, v in doc["placement"].items())
    if doc["serve"]["running"]:
        return text
    how = "as a gateway under its unit would get it"
    if config_broken:
        how += "; built-in defaults judged: config not loaded"
    return f"{text} ({how})"


def _paused_text(paused: dict[str, Any], times: TimeView) -> str:
    """``backup since 02:41:10 CET by dispatch: <why>; dispatch cron resume backup``."""
    job = paused["job_id"]
    why = f": {paused['reason']}" if paused["reason"] else ""
    return (
        f"{job} since {times.both(paused['paused_at'])} by {paused['by']}{why};"
        f" dispatch cron resume {job}"
    )


def _fires_lines(ctx: Context, doc: dict[str, Any], times: TimeView) -> None:
    """The next fires; unknown (never "none") while the config cannot be read."""
    fires = doc["next_cron_fires"]
    if fires is None:
        known = ", ".join(doc.get("cron_jobs_known") or []) or "none"
        ctx.out(f"next fires: unknown (config not loaded; jobs the state dir knows: {known})")
    elif fires:
        ctx.out("next fires:")
        for fire in fires:
            ctx.out(f"  {times.both(fire['at'])}  {fire['job_id']}")
    else:
        ctx.out("next fires: none")
