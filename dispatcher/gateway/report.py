"""The document behind ``dispatch status``: gateway, placement, workers, cards, cron, errors.

Built from the state database (sessions, board, ledger) plus, while a gateway runs, its status
file. Without a gateway the placement is judged here the way the gateway would get it (inside a
unit, cached probe), so the answer to "would my workers be restart-safe?" is there either way.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from dispatcher.app.clusterstate import open_cluster_state
from dispatcher.app.runtime import Runtime
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.plan import job_active, plan_job
from dispatcher.cron.zones import host_zone_name
from dispatcher.gateway.admission import admission_status
from dispatcher.gateway.lock import read_holder
from dispatcher.gateway.reload import read_reload
from dispatcher.gateway.statusfile import read_status
from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.store import SqlDatabase
from dispatcher.kanban.views import unconfigured
from dispatcher.timefmt import iso
from scope.abc import CallerKind, Scoper
from scope.errors import ScopeUnavailable
from scope.foundation.errors import DispatchError

FAILED_OUTCOMES = (
    "failed",
    "timed_out",
    "lost",
    "failed_start",
    "spawn_refused",
    "config_error",
    "oom_killed",
)


def status_document(
    runtime: Runtime,
    environ: Mapping[str, str],
    *,
    now: float | None = None,
    fires: int = 5,
    config_loaded: bool = True,
) -> dict[str, Any]:
    """Everything ``dispatch status`` shows, as plain data (timestamps as epoch seconds).

    ``config_loaded`` False (a read-only view of a broken config): the next fires cannot be
    known (``next_cron_fires`` is None) and ``cron_jobs_known`` names the jobs the ledger has
    seen instead, so the view never claims that nothing will fire."""
    now = time.time() if now is None else now
    state_dir = runtime.state_dir
    holder = read_holder(state_dir)
    served = read_status(state_dir) if holder else None
    if served is not None and holder is not None and served.pid != holder.pid:
        served = None
    serve: dict[str, Any] = {"running": holder is not None}
    if holder is not None:
        serve.update(pid=holder.pid, started_at=holder.started_at, uptime=now - holder.started_at)
        if served is not None:
            serve["updated_at"] = served.updated_at
            serve["keepers"] = served.keepers
            serve["relay"] = served.relay
        reload = read_reload(state_dir, holder.pid)
        serve["last_reload"] = reload.to_dict() if reload is not None else None
    placement = dict(served.placement) if served else _placement_here(runtime)

    sessions = runtime.registry.list_sessions()
    workers = collections.Counter(s.owner.kind for s in sessions)
    with open_cluster_state(runtime.settings, state_dir, environ, local=runtime.db) as state:
        store = state.board
        cards = {status.value: count for status, count in store.status_counts().items()}
        return {
            "serve": serve,
            "placement": placement,
            "workers": {"running": len(sessions), "by_kind": dict(sorted(workers.items()))},
            "cards": cards,
            "kanban_paused": store.paused(),
            "next_cron_fires": _next_fires(runtime, state.ledger, environ, now, fires)
            if config_loaded
            else None,
            "cron_jobs_known": None if config_loaded else _known_jobs(state.ledger),
            "cron_paused": _paused_jobs(state.ledger),
            "recent_errors": (_unconfigured(store, runtime) if config_loaded else [])
            + _recent_errors(store.db, served.recent_errors if served else []),
            "admission": admission_status(state_dir, environ, runtime.settings.admission),
        }


def placement_of(scoper: Scoper) -> dict[str, str]:
    """What cron and kanban workers of this process would get right now (the cached probe
    verdict): a placement value, ``refused``, or ``unknown (why)``."""
    out = {}
    for name, caller in (("cron", CallerKind.CRON), ("kanban", CallerKind.KANBAN)):
        try:
            out[name] = scoper.decide(caller).placement.value
        except ScopeUnavailable:
            out[name] = "refused"
        except DispatchError as err:
            out[name] = f"unknown ({err})"
    return out


def _placement_here(runtime: Runtime) -> dict[str, str]:
    from scope.placement import decide

    out: dict[str, str] = {}
    scoper: Any = runtime.scoper
    real = scoper.real() if hasattr(scoper, "real") else scoper
    try:
        facts = real.facts(probe=True)
    except (AttributeError, DispatchError) as err:
        return {"cron": f"unknown ({err})", "kanban": f"unknown ({err})"}
    # The gateway runs inside a service by definition: judge it as it would be judged.
    facts = dataclasses.replace(facts, in_teardown_unit=True)
    for name, caller in (("cron", CallerKind.CRON), ("kanban", CallerKind.KANBAN)):
        try:
            out[name] = decide(facts, caller, real.policy, wants_isolation=True).placement.value
        except ScopeUnavailable:
            out[name] = "refused"
    return out


def _next_fires(
    runtime: Runtime, ledger: Ledger, environ: Mapping[str, str], now: float, count: int
) -> list[dict[str, Any]]:
    jobs = runtime.settings.cron.jobs
    if not jobs:
        return []
    host = host_zone_name(environ)
    states = ledger.job_states()
    found: list[dict[str, Any]] = []
    for job in jobs:
        plan = plan_job(job, host)
        if not job_active(job, states.get(job.id)):
            continue
        for at in plan.schedule.next_instants(now, count):
            found.append({"job_id": job.id, "at": at, "zone": plan.zone})
    found.sort(key=lambda item: (item["at"], item["job_id"]))
    return found[:count]


def _unconfigured(store: BoardStore, runtime: Runtime) -> list[dict[str, Any]]:
    """A standing problem per card whose assignee the config does not name (it is never
    spawned); shown first, since it lasts until someone fixes the config or the card."""
    assignees = runtime.settings.kanban.assignees
    return [
        {
            "at": card.updated_at,
            "level": "error",
            "source": "kanban",
            "message": f"card {card.id}: assignee {card.assignee!r} is not configured",
        }
        for card in store.list_cards()
        if unconfigured(card, assignees)
    ]


def _paused_jobs(ledger: Ledger) -> list[dict[str, Any]]:
    """Every paused cron job: by whom (``operator``: ``cron pause``; ``dispatch``: a fire
    failed every attempt under ``on_exhausted: pause``), since when and why."""
    return [
        {
            "job_id": state.job_id,
            "by": "dispatch" if state.paused_reason else "operator",
            "paused_at": state.paused_at,
            "reason": state.paused_reason,
        }
        for state in sorted(ledger.job_states().values(), key=lambda s: s.job_id)
        if state.paused
    ]


def _known_jobs(ledger: Ledger) -> list[str]:
    """The cron jobs the ledger has seen (a state or a fire), sorted."""
    return sorted(set(ledger.job_states()) | set(ledger.last_rows()))


def _recent_errors(db: SqlDatabase, served: list[dict[str, Any]], limit: int = 10) -> list[Any]:
    errors: list[dict[str, Any]] = [dict(item) for item in served]
    marks = ",".join("?" * len(FAILED_OUTCOMES))
    with db.read() as conn:
        runs = conn.execute(
            f"SELECT card_id, run_id, outcome, error, ended_at FROM kanban_runs"  # noqa: S608
            f" WHERE outcome IN ({marks}) ORDER BY ended_at DESC LIMIT ?",
            (*FAILED_OUTCOMES, limit),
        ).fetchall()
        fires = conn.execute(
            f"SELECT job_id, fire_key, outcome, error, ended_at, decided_at FROM cron_fires"  # noqa: S608
            f" WHERE outcome IN ({marks}) ORDER BY id DESC LIMIT ?",
            (*FAILED_OUTCOMES, limit),
        ).fetchall()
    for row in runs:
        errors.append(
            {
                "at": row["ended_at"],
                "level": "error",
                "source": "kanban",
                "message": f"card {row['card_id']} run {row['run_id']}: {row['outcome']}"
                + (f": {row['error']}" if row["error"] else ""),
            }
        )
    for row in fires:
        errors.append(
            {
                "at": row["ended_at"] or row["decided_at"],
                "level": "error",
                "source": "cron",
                "message": f"{row['fire_key']}: {row['outcome']}"
                + (f": {row['error']}" if row["error"] else ""),
            }
        )
    errors.sort(key=lambda item: item.get("at") or 0, reverse=True)
    # The gateway logs what the database also records (a refused run, a failed fire): show
    # each event once, keeping the database's wording.
    unique: list[dict[str, Any]] = []
    for item in errors:
        if not any(_same_event(item, kept) for kept in unique):
            unique.append(item)
    return unique[:limit]


def _same_event(a: dict[str, Any], b: dict[str, Any]) -> bool:
    close = abs((a.get("at") or 0) - (b.get("at") or 0)) < 2
    ma, mb = str(a.get("message", "")), str(b.get("message", ""))
    return close and (ma == mb or _core(ma) == _core(mb))


def _core(message: str) -> str:
    """The error text after the run/fire prefix (``card c_1 run r_2: spawn_refused: ...``)."""
    parts = message.split(": ", 2)
    return parts[-1][:120]


def status_json(doc: dict[str, Any]) -> dict[str, Any]:
    """``status --json`` (and the API's ``/status``) from :func:`status_document` plus its
    ``cluster`` key: times as ISO-8601, the uptime in whole seconds."""
    serve = dict(doc["serve"])
    for key in ("started_at", "updated_at"):
        if key in serve:
            serve[key] = iso(serve[key])
    if "uptime" in serve:
        serve["uptime_seconds"] = int(serve.pop("uptime"))
    if serve.get("last_reload"):
        reload = dict(serve["last_reload"])
        for key in ("started_at", "finished_at"):
            reload[key] = iso(reload[key])
        serve["last_reload"] = reload
    return {
        **doc,
        "serve": serve,
        "next_cron_fires": None
        if doc["next_cron_fires"] is None
        else [
            {"job_id": f["job_id"], "at": iso(f["at"], f["zone"])} for f in doc["next_cron_fires"]
        ],
        "recent_errors": [{**e, "at": iso(e.get("at"))} for e in doc["recent_errors"]],
        "cron_paused": [{**p, "paused_at": iso(p["paused_at"])} for p in doc["cron_paused"]],
        "admission": {
            **doc["admission"],
            "since": iso(doc["admission"]["since"]),
            "decided_at": iso(doc["admission"]["decided_at"]),
        },
    }
