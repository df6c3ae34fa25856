"""The config snapshot: what the short write commands need of config.yaml, kept from the last
time the file was validated until it changes.

``dispatch kanban add`` and a worker's report (``complete``, ``block``, ``review``, ``defer``)
read little of the config: the assignee names, how long a transient block lasts, the
notification routes, and whether the board is in a cluster database. Getting that from the
file means importing PyYAML and validating every section of the schema, several times the
interpreter's own start-up. So once such a command has validated the file, it writes those
facts here, and the next ones read them instead, as long as the file is unchanged.

- Where: ``STATE_DIR/cache/config-<16 hex digits of the config path's SHA-256>.json``, or
  ``config-defaults.json`` for the built-in defaults (no config file). The cache dir is
  private (0700, ours, no symlink); the file is written 0600 to a temporary name and renamed
  into place, so a reader sees a whole snapshot or none.
- Key: the config file's identity (:class:`~dispatcher.config.ConfigIdentity`: path, device,
  inode, size, mtime in ns, and the SHA-256 of its content, read afresh every time), the
  dispatch version and :data:`FORMAT`. A snapshot is written only from a file that validated,
  so a broken config never has a current snapshot and its errors are reported as always.
- Trust: a snapshot that is not a regular file owned by the running user, is writable by
  others, lies in a cache dir that is not private, does not parse, or whose key differs is
  ignored: the command reads config.yaml as it always did and writes a fresh snapshot.
- ``DISPATCH_FAST_PATH=0`` turns it off (and the command-line fast path,
  :mod:`dispatcher.cli.fastpath`): nothing is read or written.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatcher import __version__
from dispatcher.config import ConfigIdentity, read_config_bytes
from dispatcher.launch.outbox import Route
from registry.errors import StateError
from registry.store.database import check_private, ensure_private_dir
from scope.foundation.digest import sha256_hex

if TYPE_CHECKING:
    from dispatcher.config import LoadedConfig
    from dispatcher.settings import Settings

__all__ = ["BYPASS_ENV", "FORMAT", "Snapshot", "enabled", "load", "snapshot_file", "store"]

FORMAT = 1
"""The snapshot's layout; a snapshot of another layout is ignored (and replaced)."""

BYPASS_ENV = "DISPATCH_FAST_PATH"
"""``DISPATCH_FAST_PATH=0``: no snapshot and no command-line fast path."""

CACHE_DIR = "cache"


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether the snapshot and the fast path may be used (see :data:`BYPASS_ENV`)."""
    return environ.get(BYPASS_ENV) != "0"


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """What the short write commands read of the config. It is a
    :class:`~dispatcher.kanban.board.BoardSettings` (the assignee names, the transient block)."""

    assignees: frozenset[str]
    transient_block: float
    routes: tuple[Route, ...]
    """The notification rules, as the outbox routes them."""
    clustered: bool
    """The config sets ``cluster.database``: the board is in PostgreSQL."""

    @classmethod
    def of(cls, settings: Settings) -> Snapshot:
        """The snapshot of validated settings."""
        return cls(
            assignees=frozenset(settings.kanban.assignees),
            transient_block=float(settings.kanban.transient_block),
            routes=tuple(settings.notify.routes()),
            clustered=settings.cluster.database is not None,
        )


def snapshot_file(state_dir: Path, config: Path | None) -> Path:
    """Where the snapshot of ``config`` (None: the built-in defaults) lives."""
    name = "defaults"
    if config is not None:
        name = sha256_hex(os.fsencode(os.path.abspath(config)))
    return Path(state_dir) / CACHE_DIR / f"config-{name[:16]}.json"


def load(state_dir: Path, config: Path | None) -> Snapshot | None:
    """The snapshot of ``config`` as it is now, or None when there is none that is current and
    trusted (see the module docstring). Reads only; never raises for what it finds."""
    target = snapshot_file(state_dir, config)
    try:
        document = _read_trusted(target)
        if document is None or document.get("format") != FORMAT:
            return None
        if document.get("version") != __version__:
            return None
        if document.get("config") != _key(config):
            return None
        return _snapshot_of(document["facts"])
    except (OSError, StateError, ValueError, TypeError, KeyError, AttributeError):
        return None


def store(state_dir: Path, loaded: LoadedConfig) -> None:
    """Write the snapshot of the config ``loaded`` validated. Best effort: a cache dir that
    cannot be made or is not private is left alone, and the next command reads the file."""
    if loaded.path is not None and loaded.identity is None:
        return  # not read from a file here: nothing to key it by
    facts = Snapshot.of(loaded.settings)
    document = {
        "format": FORMAT,
        "version": __version__,
        "config": None if loaded.identity is None else _identity_key(loaded.identity),
        "facts": {
            "assignees": sorted(facts.assignees),
            "transient_block": facts.transient_block,
            "clustered": facts.clustered,
            "routes": [_route_json(route) for route in facts.routes],
        },
    }
    data = json.dumps(document, sort_keys=True).encode("utf-8")
    target = snapshot_file(state_dir, loaded.path)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        ensure_private_dir(target.parent, allow_symlink=False)
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()  # left by a crash of a process with our pid
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(temporary, flags, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        # No fsync: a snapshot torn by a crash does not parse and is rebuilt.
        os.replace(temporary, target)
    except (OSError, StateError):
        with contextlib.suppress(OSError):
            temporary.unlink()


def _read_trusted(target: Path) -> dict[str, Any] | None:
    """The snapshot document, if the file and its directory are ours and private."""
    folder = target.parent
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode):
        return None
    check_private(folder, info)  # raises StateError (UnsafeStatePath) when not ours
    fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None
        check_private(target, info)
        raw = handle.read(1024 * 1024)
    document = json.loads(raw)
    return document if isinstance(document, dict) else None


def _key(config: Path | None) -> dict[str, Any] | None:
    """What the current config file's snapshot must be keyed by (None: the defaults)."""
    if config is None:
        return None
    raw, info = read_config_bytes(config)
    return _identity_key(ConfigIdentity.of(config, info, raw))


def _identity_key(identity: ConfigIdentity) -> dict[str, Any]:
    return {
        "path": identity.path,
        "dev": identity.dev,
        "ino": identity.ino,
        "size": identity.size,
        "mtime_ns": identity.mtime_ns,
        "sha256": identity.sha256,
    }


def _route_json(route: Route) -> dict[str, list[str]]:
    return {
        "events": sorted(route.events),
        "channels": list(route.channels),
        "assignees": sorted(route.assignees),
        "jobs": sorted(route.jobs),
        "groups": sorted(route.groups),
    }


def _snapshot_of(facts: dict[str, Any]) -> Snapshot:
    """The snapshot in ``facts``; ValueError or TypeError when anything is not as written."""
    block = facts["transient_block"]
    if isinstance(block, bool) or not isinstance(block, int | float) or not math.isfinite(block):
        raise ValueError("transient_block")
    clustered = facts["clustered"]
    if not isinstance(clustered, bool):
        raise ValueError("clustered")
    routes = tuple(
        Route(
            events=frozenset(_strings(route["events"])),
            channels=_strings(route["channels"]),
            assignees=frozenset(_strings(route["assignees"])),
            jobs=frozenset(_strings(route["jobs"])),
            groups=frozenset(_strings(route["groups"])),
        )
        for route in facts["routes"]
    )
    return Snapshot(
        assignees=frozenset(_strings(facts["assignees"])),
        transient_block=float(block),
        routes=routes,
        clustered=clustered,
    )


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError("expected a list of strings")
    return tuple(value)
