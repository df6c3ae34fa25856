"""`dispatch cron`: list, next, run, history, pause, resume.

``list``, ``next``, ``history``, ``pause`` and ``resume`` read the config and the state database
only; ``run`` starts a worker through the registry (the same path a scheduled fire takes, under
its own manual fire key). Exit codes follow ARCHITECTURE.md: 2 for a bad argument, expression,
zone or unknown job; ``run --wait`` passes the worker's result through (exit code, 128+N for
signal N, 124 timed out, 127 failed_start, 1 refused or lost, 130 on Ctrl-C with the worker left
running).
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dispatcher.app.clusterstate import open_cluster_state
from dispatcher.app.cronjobs import CronJobs
from dispatcher.app.documents import cron_entries, history_document, paused_document
from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group, add_subgroups, int_arg
from dispatcher.cron.crontab import parse as parse_crontab
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.records import FireRecord
from dispatcher.cron.report import attempt_text, history_lines, iso_in, policy_text, row_entry
from dispatcher.cron.timeline import EARLIEST, LATEST, CronSchedule, Schedule
from dispatcher.cron.zones import host_zone_name, load_zone
from dispatcher.gateway.statusfile import scheduler_zone
from dispatcher.launch.outcome import Outcome
from dispatcher.launch.resources import sessions_of, used_text
from dispatcher.timefmt import TimeView
from scope.abc import CallerKind
from scope.foundation.clock import SystemClock
from scope.foundation.errors import Invalid, UsageError
from scope.foundation.text import quote
from scope.foundation.values import ISO_HINT, parse_iso_time

if TYPE_CHECKING:
    from dispatcher.app.runtime import Runtime
    from registry.abc import Session

MAX_COUNT = 1000
MAX_LIMIT = 1_000_000


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the ``cron`` group."""
    parser = add_group(subparsers, "cron", common)
    subs = add_subgroups(parser, "cron_command")

    listing = subs.add_parser(
        "list",
        parents=[common],
        help="Jobs with schedule, zone, pause state, next fire, last outcome and policies.",
    )
    listing.set_defaults(handler=handle_list)

    nxt = subs.add_parser(
        "next",
        parents=[common],
        help="Upcoming fire instants of a job, or of an ad-hoc expression with --expr.",
        description="Print the next fire instants (after the DST rule, each instant once). "
        "--from is exclusive (default now); a naive --from is read in the zone.",
    )
    nxt.add_argument("job_id", nargs="?", metavar="JOB_ID", help="a configured job")
    nxt.add_argument("--expr", metavar="EXPR", help="a crontab expression instead of a job")
    nxt.add_argument("--tz", metavar="ZONE", help="IANA zone for --expr (default: the host's)")
    nxt.add_argument("--from", dest="start", metavar="ISO", help="start after this instant")
    nxt.add_argument(
        "--count",
        type=int_arg(1, MAX_COUNT),
        default=5,
        metavar="N",
        help=f"how many (1-{MAX_COUNT}); fewer when the schedule reaches year 9999 first",
    )
    nxt.set_defaults(handler=handle_next)

    run = subs.add_parser("run", parents=[common], help="Fire a job now (its own manual fire key).")
    run.add_argument("job_id", metavar="JOB_ID", help="a configured job")
    run.add_argument("--wait", action="store_true", help="wait and pass the result through")
    run.set_defaults(handler=handle_run)

    history = subs.add_parser("history", parents=[common], help="Ledger rows, newest first.")
    history.add_argument("job_id", nargs="?", metavar="JOB_ID", help="only this job's rows")
    history.add_argument(
        "--limit", type=int_arg(1, MAX_LIMIT), default=50, metavar="N", help="rows (default 50)"
    )
    history.set_defaults(handler=handle_history)

    for name, verb in (("pause", "Pause"), ("resume", "Resume")):
        sub = subs.add_parser(
            name,
            parents=[common],
            help=f"{verb} a job (stored in the state database; overrides enabled).",
        )
        sub.add_argument("job_id", metavar="JOB_ID", help="a configured job")
        sub.set_defaults(handler=handle_pause if name == "pause" else handle_resume)


# -- helpers ---------------------------------------------------------------------------------


def _jobs(ctx: Context) -> CronJobs:
    """The configured jobs over the chosen ledger (the same code the web dashboard uses)."""

    def ledger() -> Ledger:
        state = open_cluster_state(ctx.settings, ctx.state_dir, ctx.environ)
        ctx.on_close(state)
        return state.ledger

    return CronJobs(
        ctx.settings,
        ledger,
        environ=ctx.environ,
        state_dir=ctx.state_dir,
        config_path=ctx.config_path,
        host_zone=scheduler_zone(ctx.state_dir),
    )


def _settle_open(ctx: Context, jobs: CronJobs) -> None:
    """Settle fires whose worker ended unseen; not while the config is broken (a read-only
    view: settling applies each job's configured policies)."""
    if ctx.config_problem is None:
        jobs.settle_open(lambda: _runtime(ctx))


def _runtime(ctx: Context, *, follow: bool = False) -> Runtime:
    from dispatcher.app.runtime import runtime_from_context

    return runtime_from_context(ctx, caller_kind=CallerKind.CRON, follow=follow)


# -- list ------------------------------------------------------------------------------------


def handle_list(args: argparse.Namespace, ctx: Context) -> int:
    """``dispatch cron list``."""
    jobs = _jobs(ctx)
    _settle_open(ctx, jobs)
    times = ctx.times()
    views = jobs.views(times.now)
    for view in views:
        for warning in view.warnings:
            ctx.warn(f"cron job {view.plan.job.id!r}: {warning}")
    entries = [view.entry for view in views]
    if ctx.config_problem is not None:
        # The file is broken: show what the ledger knows about the jobs it has seen.
        entries += jobs.unconfigured_entries()
    if ctx.json:
        ctx.emit_json(cron_entries(entries))
        return 0
    if not entries:
        if ctx.config_problem is not None:
            ctx.out(
                "no cron jobs known to the state dir (config not loaded: jobs it names are unknown)"
            )
        else:
            ctx.out("no cron jobs configured")
        return 0
    rows = [("ID", "SCHEDULE", "TIMEZONE", "STATE", "NEXT", "LEFT", "LAST", "POLICIES")]
    for entry in entries:
        state_text = "active" if entry["active"] else "disabled"
        if entry["paused"]:
            state_text = "paused (exhausted)" if entry.get("paused_reason") else "paused"
        nxt = entry.get("next_fire_at")
        unknown = "-" if entry["schedule"] else "?"  # no schedule: the config is not loaded
        rows.append(
            (
                entry["id"],
                entry["schedule"] or "?",
                entry["timezone"] or "?",
                state_text,
                times.at(nxt, entry["timezone"]) if nxt else unknown,
                times.ago(nxt) if nxt else unknown,
                _last_text(entry, times),
                policy_text(entry) if entry["schedule"] else "(config not loaded)",
            )
        )
    _table(ctx, rows)
    return 0


def _last_text(entry: dict[str, Any], times: TimeView) -> str:
    if not entry["last_outcome"]:
        return "-"
    at = entry.get("last_fire_at")
    return f"{entry['last_outcome']} {times.ago(at)}" if at else entry["last_outcome"]


def _table(
    ctx: Context, rows: Sequence[Sequence[str]], details: dict[int, list[str]] | None = None
) -> None:
    """Aligned columns; ``details`` are indented lines printed under the row of that index."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        ctx.out("  ".join(cells).rstrip())
        for line in (details or {}).get(index, []):
            ctx.out(f"    {line}")


# -- next ------------------------------------------------------------------------------------


def handle_next(args: argparse.Namespace, ctx: Context) -> int:
    """``dispatch cron next``."""
    if (args.job_id is None) == (args.expr is None):
        raise UsageError("give either JOB_ID or --expr EXPR (see 'dispatch cron next --help')")
    schedule: Schedule
    if args.expr is not None:
        zone_name = args.tz or host_zone_name(ctx.environ)
        schedule = CronSchedule(parse_crontab(args.expr), load_zone(zone_name))
    else:
        if args.tz is not None:
            raise UsageError("--tz applies to --expr only; a job uses its own timezone")
        plan = _jobs(ctx).plan(args.job_id)
        schedule, zone_name = plan.schedule, plan.zone
    start = _parse_from(args.start, zone_name) if args.start else SystemClock().time()
    instants = schedule.next_instants(start, args.count)
    texts = [iso_in(at, zone_name) for at in instants]
    if ctx.json:
        ctx.emit_json(texts)
    else:
        for text in texts:
            ctx.out(str(text))
    if len(instants) < args.count:
        # Not an error: the calendar ends (year 9999) before the schedule does.
        last = f"; the last is {texts[-1]}" if texts else ""
        ctx.warn(
            f"only {len(instants)} of {args.count} fires exist before the end of the "
            f"computable calendar ({_UNTIL}){last}"
        )
    return 0


_UNTIL = "9999-12-30"
_RANGE = f"0001-01-02T00:00Z to {_UNTIL}T00:00Z"


def _parse_from(text: str, zone_name: str) -> float:
    try:
        at = parse_iso_time(text, load_zone(zone_name)).timestamp()
    except Invalid as err:
        raise UsageError(f"--from: {err.problem}") from None
    if not EARLIEST <= at <= LATEST:
        raise UsageError(
            f"--from {quote(text)}: outside the times cron computes ({_RANGE})",
            remedy=f"give a time in that range ({ISO_HINT})",
        )
    return at


# -- pause / resume --------------------------------------------------------------------------


def handle_pause(args: argparse.Namespace, ctx: Context) -> int:
    """``dispatch cron pause JOB_ID``."""
    return _set_paused(args, ctx, True)


def handle_resume(args: argparse.Namespace, ctx: Context) -> int:
    """``dispatch cron resume JOB_ID``."""
    return _set_paused(args, ctx, False)


def _set_paused(args: argparse.Namespace, ctx: Context, paused: bool) -> int:
    changed = _jobs(ctx).set_paused(args.job_id, paused, SystemClock().time())
    if ctx.json:
        ctx.emit_json(paused_document(args.job_id, paused, changed))
        return 0
    word = "paused" if paused else "resumed"
    ctx.out(f"{args.job_id}: {word}" if changed else f"{args.job_id}: already {word}")
    return 0


# -- history ---------------------------------------------------------------------------------


def handle_history(args: argparse.Namespace, ctx: Context) -> int:
    """``dispatch cron history``."""
    jobs = _jobs(ctx)
    if args.job_id is not None:
        jobs.check_known(args.job_id)
    _settle_open(ctx, jobs)
    rows = jobs.ledger.history(args.job_id, args.limit)
    # Cluster mode: the host that decided or ran each fire (a single host's ledger has none).
    fire_hosts = getattr(jobs.ledger, "fire_hosts", None)
    hosts = fire_hosts([row.id for row in rows]) if fire_hosts is not None else None
    # Each fire's class, peak memory and CPU time come with its session (this host's).
    ran = [row.session_id for row in rows if row.session_id]
    sessions = sessions_of(_runtime(ctx).registry, ran) if ran else {}
    if ctx.json:
        ctx.emit_json(history_document(rows, hosts, sessions))
        return 0
    if not rows:
        ctx.out("no cron history")
        return 0
    times = ctx.times()
    header = ["FIRE KEY", "OUTCOME", "ATTEMPT", "NOMINAL", "PLACEMENT", "SESSION", "EXIT"]
    header += ["CLASS", "USED", "ERROR"]
    if hosts is not None:
        header.insert(1, "HOST")
    table: list[tuple[str, ...]] = [tuple(header)]
    details: dict[int, list[str]] = {}
    for row in rows:
        details[len(table)] = history_lines(row, times)
        entry = row_entry(row)
        exit_text = "-" if row.exit_code is None else str(row.exit_code)
        if row.signal:
            exit_text = row.signal
        cells = [
            row.fire_key,
            entry["outcome"] + (" (catch-up)" if row.catch_up else ""),
            attempt_text(row),
            times.both(row.nominal, row.zone),
            row.placement or "-",
            row.session_id or "-",
            exit_text,
            _class_text(sessions.get(row.session_id or "")),
            used_text(sessions.get(row.session_id or "")) or "-",
            row.error or "",
        ]
        if hosts is not None:
            cells.insert(1, hosts.get(row.id) or "-")
        table.append(tuple(cells))
    _table(ctx, table, details)
    return 0


def _class_text(session: Session | None) -> str:
    granted = session.resources if session is not None else None
    return "-" if granted is None else granted.describe()


# -- run -------------------------------------------------------------------------------------


def handle_run(args: argparse.Namespace, ctx: Context) -> int:
    """``dispatch cron run JOB_ID [--wait]``."""
    jobs = _jobs(ctx)
    jobs.plan(args.job_id)
    runtime = _runtime(ctx, follow=True)
    scheduler = jobs.scheduler(runtime)
    record = scheduler.run_now(args.job_id)
    if record.session_id is None or not args.wait:
        _report_run(ctx, record)
        if args.wait:
            return _exit_status(record)
        # Without --wait the command fails (exit 1) only when the fire could not start.
        return 1 if _not_started(record) else 0
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    try:
        result = runtime.registry.wait(record.session_id, interrupt=interrupted)
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted.is_set() and not result.snapshot.session.finished:
        ctx.warn(f"interrupted; session {record.session_id} keeps running")
        _report_run(ctx, record)
        return 130
    settled = scheduler.settle(result.snapshot.session)
    fresh = settled or scheduler.ledger.get(record.id)
    _report_run(ctx, fresh)
    return _exit_status(fresh)


def _report_run(ctx: Context, record: FireRecord) -> None:
    if ctx.json:
        ctx.emit_json(row_entry(record))
    elif record.session_id:
        ctx.out(record.session_id)
    if _not_started(record) and record.session_id is not None:
        # The worker's exec failed in its keeper (a refused spawn, where no session exists,
        # was already named on stderr by the launch core's warning).
        ctx.warn(f"{record.fire_key}: {record.shown_outcome}: {record.error}")


def _not_started(record: FireRecord) -> bool:
    """Whether the fire never got a running worker (refused, failed to start, unusable)."""
    if record.outcome in (Outcome.SPAWN_REFUSED, Outcome.FAILED_START):
        return True
    return record.outcome is Outcome.CONFIG_ERROR and record.exit_code is None


def _exit_status(record: FireRecord) -> int:
    """The fire's result as an exit status, as ``dispatch wait`` passes a worker's through:
    its exit code, 128+N for signal N, 124 for a timeout, 127 when it could not start, 1 for
    a refused spawn or a worker definition that cannot be used."""
    outcome = record.outcome
    if outcome is None or outcome is Outcome.COMPLETED:
        return 0
    if record.signal:
        try:
            return 128 + signal.Signals[record.signal].value
        except KeyError:
            return 1
    if outcome is Outcome.TIMED_OUT:
        return 124
    if outcome is Outcome.FAILED_START:
        return 127
    if record.exit_code:
        return record.exit_code
    return 1
