"""Cluster database URLs as users see them: checked, and never shown with a password.

Kept apart from :mod:`dispatcher.cluster.database` so that reading the config (``config show``,
every CLI start) does not import the PostgreSQL driver.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from scope.foundation.errors import ConfigError
from scope.foundation.text import quote

ENV_URL = "DISPATCH_DATABASE_URL"
"""The environment variable whose URL overrides ``cluster.database``."""


def redact(url: str) -> str:
    """``url`` without its password (and without a query string, which may carry one)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable database URL>"
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, user + host, parts.path, "", ""))


def check_url(url: str, key: str = "cluster.database", path: str | None = None) -> str:
    """The URL if it is a ``postgresql://`` URL, else a one-line ConfigError naming the fix
    and where the URL came from (``key``: the config key or the environment variable)."""
    try:
        scheme = urlsplit(url).scheme
    except ValueError:
        scheme = ""
    if scheme not in ("postgresql", "postgres"):
        raise ConfigError(
            f"not a postgresql:// URL: {quote(redact(url))}",
            key=key,
            path=path,
            remedy="write it as postgresql://USER@HOST:PORT/DBNAME",
        )
    return url


def without_password(url: str) -> str:
    """``url`` with the password left out of its user part and its query (everything else,
    sslmode included, kept): what may be handed to a worker's environment."""
    parts = urlsplit(url)
    if parts.password is None and "password" not in parts.query:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = f"{parts.username}@" if parts.username else ""
    query = "&".join(
        item for item in parts.query.split("&") if item and not item.startswith("password=")
    )
    return urlunsplit((parts.scheme, user + host, parts.path, query, parts.fragment))
