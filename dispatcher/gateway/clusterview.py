"""The cluster lines of ``dispatch status`` and ``dispatch doctor``.

``status`` shows the cluster database (URL without password), this host's lease and its skew:
from the running serve's ``cluster.json`` when one runs (it knows about an outage or a
supersede as it happens), else from this host's row in the hosts table. ``doctor`` connects
afresh, checks the schema version and measures the skew now; the cluster is unhealthy when the
database cannot be used or the skew keeps cron from firing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dispatcher.app.clusterstate import cluster_url, open_cluster_state
from dispatcher.cluster.settings import SKEW_REFUSE, SKEW_WARN
from dispatcher.cluster.url import redact
from dispatcher.gateway.lock import read_holder
from dispatcher.settings import Settings
from dispatcher.timefmt import iso
from registry.errors import StateError


def cluster_status(
    settings: Settings, state_dir: Path, environ: Mapping[str, str]
) -> dict[str, Any] | None:
    """This host in the cluster for ``dispatch status`` (None: no cluster database)."""
    url = cluster_url(settings, environ)
    if url is None:
        return None
    doc: dict[str, Any] = {"database": redact(url), "host_id": settings.cluster.effective_host_id()}
    holder = read_holder(state_dir)
    if holder is not None:
        from dispatcher.gateway.lease import read_cluster_status

        served = read_cluster_status(state_dir)
        if served is not None and served.get("pid") == holder.pid:
            doc.update(_from_serve(served))
            return doc
    try:
        with open_cluster_state(settings, state_dir, environ) as state:
            assert state.hosts is not None
            row = state.hosts.row(doc["host_id"])
    except StateError as err:
        doc.update(state="unreachable", error=err.message)
        return doc
    if row is None:
        doc.update(state="not joined")
    else:
        doc.update(
            state="live" if row.live else "expired",
            epoch=row.epoch,
            lease_until=iso(row.lease_until),
            last_heartbeat=iso(row.heartbeat_at),
            skew=row.skew,
        )
    return doc


def _from_serve(served: Mapping[str, Any]) -> dict[str, Any]:
    doc = {
        "state": served.get("state"),
        "epoch": served.get("epoch"),
        "lease_until": iso(served.get("lease_until")),
        "last_heartbeat": iso(served.get("renewed_at")),
        "skew": served.get("skew"),
        "cron_refused": bool(served.get("cron_refused")),
    }
    if served.get("outage_since") is not None:
        doc["outage_since"] = iso(served["outage_since"])
    if served.get("error"):
        doc["error"] = served["error"]
    return doc


def cluster_check(
    settings: Settings, state_dir: Path, environ: Mapping[str, str]
) -> dict[str, Any] | None:
    """``dispatch doctor``'s cluster check (None: no cluster database); ``ok`` says whether
    this host can take part: the database is usable and the clock close enough for cron."""
    url = cluster_url(settings, environ)
    if url is None:
        return None
    doc: dict[str, Any] = {"database": redact(url), "host_id": settings.cluster.effective_host_id()}
    try:
        with open_cluster_state(settings, state_dir, environ) as state:
            assert state.hosts is not None and state.db is not None
            doc["schema_version"] = state.db.schema_version()
            skew = state.hosts.measure_skew()
            row = state.hosts.row(doc["host_id"])
    except StateError as err:
        doc.update(ok=False, problem=err.message)
        return doc
    doc["skew"] = round(skew, 3)
    doc["lease"] = "not joined" if row is None else "live" if row.live else "expired"
    doc["ok"] = abs(skew) < SKEW_REFUSE
    if abs(skew) >= SKEW_REFUSE:
        doc["problem"] = (
            f"this host's clock is {skew:+.0f} s off the database's: cron fires nothing here; "
            "fix NTP (timedatectl status)"
        )
    elif abs(skew) >= SKEW_WARN:
        doc["warning"] = f"this host's clock is {skew:+.2f} s off the database's; check NTP"
    return doc


def cluster_lines(doc: Mapping[str, Any] | None) -> list[str]:
    """The human lines of either document (none without a cluster)."""
    if doc is None:
        return []
    lines = [f"cluster:    {doc['database']} as host {doc['host_id']}"]
    if "state" in doc:
        lease = f"lease:      {doc['state']}"
        if doc.get("epoch") is not None:
            lease += f" (epoch {doc['epoch']}"
            lease += f", until {doc['lease_until']})" if doc.get("lease_until") else ")"
        lines.append(lease)
    elif "lease" in doc:
        lines.append(f"lease:      {doc['lease']} (schema v{doc.get('schema_version')})")
    if doc.get("skew") is not None:
        skew = f"skew:       {doc['skew']:+.3f} s against the database clock"
        lines.append(skew + ("; cron fires nothing here" if doc.get("cron_refused") else ""))
    for key in ("problem", "warning", "error"):
        if doc.get(key):
            lines.append(f"            {doc[key]}")
    return lines
