"""Sessions, hosts, the status and notifications: ``dispatch ps``, ``kill``, ``hosts``,
``status`` and ``notify`` through the same reads, with their ``--json``."""

from __future__ import annotations

import time
from typing import Any

from dispatcher.app.documents import hosts_document, select_sessions, session_json
from dispatcher.web.api.spec import Call
from registry.abc import SessionState
from scope.foundation.errors import UsageError

FINISHED = frozenset(s.value for s in SessionState) - {"running"}


def list_sessions(call: Call) -> list[dict[str, Any]]:
    """``GET /sessions``: ``ps --json`` (``--all``, ``--state``, ``--owner``, ``--limit``)."""
    params = call.params
    states = params["state"] or []
    finished = bool(params["all"] or set(states) & FINISHED)
    sessions = call.site.source.registry().list_sessions(include_finished=finished)
    chosen = select_sessions(sessions, states=states, owner=params["owner"], limit=params["limit"])
    return [session_json(s) for s in chosen]


def show_session(call: Call) -> dict[str, Any]:
    """``GET /sessions/{session_id}``: one session as ``ps --json`` lists it."""
    return session_json(call.site.source.registry().resolve(call.params["session_id"]))


def kill_session(call: Call) -> dict[str, Any]:
    """``POST /sessions/{session_id}/kill``: ``kill --json`` (scope stop, or SIGTERM, grace,
    SIGKILL; a finished session is left as it is)."""
    registry = call.site.source.registry()
    session = registry.resolve(call.params["session_id"])
    final = registry.kill(session.id, reason=f"killed through the API by {call.caller.name}")
    return session_json(final.session)


def hosts(call: Call) -> list[dict[str, Any]]:
    """``GET /hosts``: ``hosts --json`` (cluster mode; a single host is a usage error there
    as here)."""
    source = call.site.source
    if not source.cluster_configured:
        raise UsageError(
            "no cluster database is configured (this host runs alone on SQLite)",
            remedy="set cluster.database in config.yaml or DISPATCH_DATABASE_URL",
        )
    return hosts_document(source.reader.cluster)


def limits(call: Call) -> list[dict[str, Any]]:
    """``GET /limits``: ``limits --json`` (one serializer, :func:`dispatcher.app.limitview.
    limits_doc`)."""
    return call.site.source.limits()


def status(call: Call) -> dict[str, Any]:
    """``GET /status``: ``status --json``."""
    from dispatcher.gateway.clusterview import cluster_status
    from dispatcher.gateway.report import status_document, status_json

    source = call.site.source
    doc = status_document(
        source.runtime(), source.environ, now=time.time(), fires=call.params["fires"]
    )
    doc["cluster"] = cluster_status(source.settings, source.state_dir, source.environ)
    return status_json(doc)


def notifications(call: Call) -> list[dict[str, Any]]:
    """``GET /notifications``: ``notify list --json`` (``--dead``)."""
    store = call.site.source.reader.cluster.notify_store()
    rows = store.list(state="dead" if call.params["dead"] else None)
    return [row.to_dict() for row in rows]


def retry_notification(call: Call) -> dict[str, Any]:
    """``POST /notifications/{message_id}/retry``: ``notify retry --json``."""
    store = call.site.source.reader.cluster.notify_store()
    found, touched = store.retry_named(call.params["message_id"], now=time.time())
    return {"id": found, "rows": touched}
