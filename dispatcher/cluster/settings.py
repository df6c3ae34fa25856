"""The ``cluster:`` section of config.yaml (cluster mode; empty means one host on SQLite)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.cluster.url import ENV_URL, check_url, redact
from scope.foundation.errors import ConfigError, Invalid
from scope.foundation.schema import Duration, Optional, Str, setting

SKEW_WARN = 1.0
"""Seconds of clock skew against the database at which a host warns."""
SKEW_REFUSE = 60.0
"""Seconds of clock skew at which a host fires no cron (kanban still runs)."""
HOST_ID = r"[a-z0-9][a-z0-9._-]*"


class DatabaseUrl(Str):
    """A ``postgresql://`` URL, shown without its password by ``config show``."""

    def convert(self, value: Any) -> Any:
        text = super().convert(value)
        try:
            return check_url(text)
        except ConfigError as err:
            raise Invalid(
                str(err.fields["problem"]) + "; write it as postgresql://USER@HOST/DB"
            ) from None

    def dump(self, value: Any) -> Any:
        return None if value is None else redact(value)


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    """Several hosts sharing one board and cron ledger in PostgreSQL (docs/cluster.md)."""

    database: str | None = setting(
        None,
        kind=Optional(DatabaseUrl()),
        doc="postgresql:// URL of the cluster database; unset: this host alone, on SQLite in "
        f"the state dir. The environment variable {ENV_URL} overrides it.",
    )
    password_file: str | None = setting(
        None,
        kind=Optional(Str()),
        doc="File (mode 0600) whose first line is the database password; keeps the password "
        "out of the URL, the config and the logs.",
    )
    host_id: str | None = setting(
        None,
        kind=Optional(Str(pattern=HOST_ID, hint="use lowercase letters, digits, '.', '_', '-'")),
        doc="This host's name in the cluster (default: the short hostname, lowercased).",
    )
    heartbeat: float = setting(
        5.0, kind=Duration(min=0.1), doc="How often this host renews its lease."
    )
    lease_ttl: float = setting(
        30.0,
        kind=Duration(min=1),
        doc="How long a lease lasts without renewal; after it, other hosts rescue this host's "
        "runs. At least 3 x heartbeat.",
    )

    def check(self) -> None:
        """A lease must survive two missed heartbeats."""
        if self.lease_ttl < 3 * self.heartbeat:
            raise Invalid(
                f"lease_ttl ({self.lease_ttl:g}s) must be at least 3 x heartbeat "
                f"({self.heartbeat:g}s)",
                ("lease_ttl",),
            )

    def url(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """The database URL in force: the environment's, else the config's, else None."""
        from_env = environ.get(ENV_URL)
        return check_url(from_env, ENV_URL, "environment") if from_env else self.database

    def effective_host_id(self) -> str:
        """``host_id``, else the short hostname made to fit the host id pattern."""
        if self.host_id:
            return self.host_id
        short = socket.gethostname().split(".")[0].lower()
        cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in short)
        return cleaned.lstrip("._-") or "host"
