"""The JSON documents ``--json`` prints and the HTTP API serves: one builder per thing.

The CLI's commands and ``dispatch web``'s ``/api/v1/`` call these same functions, so a card,
a session, a host or a cron fire has exactly one JSON shape wherever a program reads it
(docs/api.md). The builders of single records live beside their records where the layer
allows (``kanban/views.py`` ``card_json``/``run_json``/``event_json``, ``cron/report.py``
``row_entry``, the outbox's ``Delivery.to_dict``); what is assembled from several reads
(a card with its runs' hosts, the hosts with their open runs, history with its hosts) and
the registry's sessions is built here, the lowest layer that sees all the parts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dispatcher.timefmt import iso

if TYPE_CHECKING:
    from dispatcher.app.clusterstate import ClusterState
    from dispatcher.app.limitview import Waits
    from dispatcher.app.workspace import Workspace
    from dispatcher.cluster.hosts import HostRow
    from dispatcher.cron.records import FireRecord
    from dispatcher.kanban.model import Card
    from registry.abc import Session

# The kanban and cron builders are imported where used: `dispatch ps`, `kill` and `logs` use
# this module too, and pay at start-up only for what they call.

__all__ = [
    "board_document",
    "card_document",
    "card_waits_of",
    "cron_entries",
    "history_document",
    "hosts_document",
    "listed_card_json",
    "output_document",
    "owner_matches",
    "paused_document",
    "select_sessions",
    "session_json",
]

EPOCH_KEYS = ("next_fire_at", "last_fire_at")
"""``cron list`` entries carry epoch copies of two times for the table; JSON has ISO only."""


def session_json(session: Session) -> dict[str, Any]:
    """A registry session (``ps``, ``kill``, ``run``, ``wait`` and ``logs -f`` with ``--json``)."""
    return {
        "id": session.id,
        "state": session.state.value,
        "argv": list(session.argv),
        "pid": session.worker_pid,
        "placement": session.placement.value,
        "unit": session.unit,
        "owner": str(session.owner),
        "started_at": iso(session.started_at),
        "finished_at": iso(session.finished_at),
        "exit_code": session.exit_code,
        "signal": session.signal,
        "completion_reason": session.completion_reason,
        "log_path": session.log_path,
    }


def owner_matches(owner: str, wanted: str) -> bool:
    """``--owner``: the same owner, or ``wanted`` is a prefix ending before a ``:`` (the rule
    ``dispatch events --owner`` follows)."""
    return owner == wanted or owner.startswith(wanted + ":")


def select_sessions(
    sessions: Iterable[Session],
    *,
    states: Collection[str] = (),
    owner: str | None = None,
    since: float | None = None,
    limit: int | None = None,
) -> list[Session]:
    """The sessions ``ps --state/--owner/--since/--limit`` keep (newest first as given)."""
    kept = [
        s
        for s in sessions
        if (not states or s.state.value in states)
        and (owner is None or owner_matches(str(s.owner), owner))
        and (since is None or (s.started_at or 0) >= since)
    ]
    return kept if limit is None else kept[:limit]


def output_document(session: Session, data: bytes) -> dict[str, Any]:
    """``logs --json``: the selected bytes of a session's log as text (U+FFFD for bad bytes)."""
    return {
        "id": session.id,
        "log_path": session.log_path,
        "bytes": len(data),
        "output": data.decode("utf-8", "replace"),
    }


def listed_card_json(
    card: Card, assignees: Collection[str] | None, waits: Waits | None = None
) -> dict[str, Any]:
    """A card in a listing (``kanban list/board --json``), with ``assignee_configured`` (true,
    false, or null when the config is not loaded; done and archived cards need none: true)
    and ``waiting``: the full named limit it waits for (:meth:`Waits.json`), or null."""
    from dispatcher.kanban.views import card_json, unconfigured

    known = None if assignees is None else not unconfigured(card, assignees)
    waiting = None if waits is None else waits.json(card.id)
    return {**card_json(card), "assignee_configured": known, "waiting": waiting}


def board_document(
    cards: Sequence[Card],
    *,
    paused: bool,
    assignees: Collection[str] | None,
    waits: Waits | None = None,
) -> dict[str, Any]:
    """``kanban board --json``: the pause flag and the cards by status (archived left out)."""
    from dispatcher.kanban.model import CardStatus

    doc: dict[str, Any] = {"paused": paused}
    for status in CardStatus:
        if status is not CardStatus.ARCHIVED:
            doc[status.value] = [
                listed_card_json(c, assignees, waits) for c in cards if c.status is status
            ]
    return doc


def card_document(workspace: Workspace, card_id: str) -> dict[str, Any]:
    """``kanban show --json``: the card, its retry state, its runs (each with its ``host``,
    null on a single host, and its ``resources``, ``memory_peak`` and ``cpu_time``) and its
    events."""
    from dispatcher.kanban.views import show_json
    from dispatcher.launch.resources import sessions_of

    store = workspace.store
    card = store.get_card(card_id)
    runs = store.runs_of(card_id)
    # Each run's class, peak memory and CPU time come with its session (this host's).
    sessions = sessions_of(workspace.registry(), (run.session_id for run in runs))
    limit = workspace.settings.kanban.limit_for(card.assignee)
    doc = show_json(card, runs, store.events_of(card_id), sessions, limit=limit)
    hosts = workspace.run_hosts(card_id)
    for run in doc["runs"]:
        run["host"] = hosts.get(run["run_id"])
    doc["waiting"] = card_waits_of(workspace, [card]).json(card_id)
    return doc


def card_waits_of(workspace: Workspace, cards: Sequence[Card]) -> Waits:
    """Which full named limit each of ``cards`` waits for, as this host sees the holds."""
    from dispatcher.app.limitview import card_waits

    stamp = workspace.cluster.stamp
    host = None if stamp is None else stamp.host_id
    return card_waits(workspace.settings, workspace.store, cards, now=workspace.now(), host=host)


def hosts_document(
    state: ClusterState, rows: Sequence[HostRow] | None = None
) -> list[dict[str, Any]]:
    """``hosts --json``: every host of the cluster database (``rows`` when read already) with
    its lease and open runs."""
    assert state.hosts is not None and state.db is not None
    rows = state.hosts.rows() if rows is None else rows
    with state.db.read() as conn:
        open_runs = {
            r[0]: int(r[1])
            for r in conn.execute(
                "SELECT host_id, count(*) FROM kanban_runs WHERE outcome IS NULL"
                " AND host_id IS NOT NULL GROUP BY host_id"
            ).fetchall()
        }
    return [
        {
            "host_id": row.host_id,
            "boot_id": row.boot_id,
            "version": row.version,
            "epoch": row.epoch,
            "last_heartbeat": iso(row.heartbeat_at),
            "lease_until": iso(row.lease_until),
            "lease": "live" if row.live else "expired",
            "running_runs": open_runs.get(row.host_id, 0),
            "skew": row.skew,
        }
        for row in rows
    ]


def cron_entries(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``cron list --json`` from the jobs' entries (ISO times only)."""
    return [{k: v for k, v in e.items() if k not in EPOCH_KEYS} for e in entries]


def history_document(
    rows: Sequence[FireRecord],
    hosts: dict[int, str | None] | None,
    sessions: Mapping[str, Session] | None = None,
) -> list[dict[str, Any]]:
    """``cron history --json``: ledger rows, each with the ``host`` that decided or ran it in
    cluster mode (``hosts`` None on a single host: no key) and, given this host's
    ``sessions`` by id, each fire's ``resources``, ``memory_peak`` and ``cpu_time``."""
    from dispatcher.cron.report import row_entry

    entries = [row_entry(row, sessions) for row in rows]
    if hosts is not None:
        for row, entry in zip(rows, entries, strict=True):
            entry["host"] = hosts.get(row.id)
    return entries


def paused_document(job_id: str, paused: bool, changed: bool) -> dict[str, Any]:
    """``cron pause/resume --json``."""
    return {"id": job_id, "paused": paused, "changed": changed}
