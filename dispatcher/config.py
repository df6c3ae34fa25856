"""Finding, reading and validating config.yaml.

Nothing here is resolved at import time: every function takes the environment it should use,
so one process can serve several configs and state dirs. The schema (every section's records)
and the YAML parser are imported only to read a file: finding it costs a short write command
nothing (see :mod:`dispatcher.app.snapshot`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scope.foundation.errors import ConfigError

if TYPE_CHECKING:
    from dispatcher.settings import Settings

MAX_CONFIG_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class ConfigIdentity:
    """Which version of a config file was read: where, the file's device, inode, size and
    modification time (ns), and a SHA-256 of the bytes read. Equal identities mean the same
    content in the same file; the config snapshot (:mod:`dispatcher.app.snapshot`) is keyed by
    it."""

    path: str
    """The absolute path (symlinks not resolved: the name the user gave)."""
    dev: int
    ino: int
    size: int
    mtime_ns: int
    sha256: str

    @classmethod
    def of(cls, path: Path, info: os.stat_result, raw: bytes) -> ConfigIdentity:
        """The identity of ``raw``, read from the open file ``info`` describes."""
        from scope.foundation.digest import sha256_hex

        return cls(
            path=os.path.abspath(path),
            dev=info.st_dev,
            ino=info.st_ino,
            size=info.st_size,
            mtime_ns=info.st_mtime_ns,
            sha256=sha256_hex(raw),
        )


@dataclass(frozen=True, kw_only=True)
class LoadedConfig:
    """Validated settings and where they came from (``path`` None: built-in defaults)."""

    settings: Settings
    path: Path | None
    identity: ConfigIdentity | None = None
    """The version of the file that was validated (None for the built-in defaults)."""

    @property
    def source(self) -> str:
        """The file name, or "built-in defaults"."""
        return str(self.path) if self.path else "built-in defaults"

    def effective(self) -> dict[str, Any]:
        """The effective configuration with defaults filled in (YAML-friendly)."""
        from dispatcher.settings import SCHEMA
        from scope.foundation.schema import dump_record

        return dump_record(SCHEMA, self.settings)


def default_config_path(environ: Mapping[str, str]) -> Path:
    """``$XDG_CONFIG_HOME/dispatch/config.yaml``, else ``~/.config/dispatch/config.yaml``."""
    base = environ.get("XDG_CONFIG_HOME", "")
    if not base or not os.path.isabs(base):
        base = str(Path(environ.get("HOME") or Path.home()) / ".config")
    return Path(base) / "dispatch" / "config.yaml"


def resolve_config_path(explicit: str | None, environ: Mapping[str, str]) -> Path | None:
    """The config file to read: ``--config``, else ``DISPATCH_CONFIG``, else the default path
    when it exists, else None (built-in defaults). An explicit path must exist."""
    chosen = explicit or environ.get("DISPATCH_CONFIG") or None
    if chosen:
        path = Path(chosen).expanduser()
        origin = "--config" if explicit else "DISPATCH_CONFIG"
        if not path.exists():
            raise ConfigError(
                f"config file not found (from {origin})",
                path=str(path),
                remedy="check the path, or omit it to use the defaults",
            )
        return path
    default = default_config_path(environ)
    return default if default.exists() else None


def load_config(path: Path | None) -> LoadedConfig:
    """Read and validate ``path`` (None: built-in defaults). Raises :class:`ConfigError`."""
    if path is None:
        from dispatcher.settings import Settings

        return LoadedConfig(settings=Settings(), path=None)
    text, identity = _read_config(path)
    settings = parse_config(text, str(path))
    return LoadedConfig(settings=settings, path=path, identity=identity)


def read_config_text(path: Path) -> str:
    """The file's text, with clear errors for directories, unreadable files and bad encodings."""
    return _read_config(path)[0]


def read_config_bytes(path: Path) -> tuple[bytes, os.stat_result]:
    """What the config file holds (at most one byte more than the size limit) and what
    ``fstat`` says of the file it was read from. Raises OSError."""
    with open(path, "rb") as handle:
        info = os.fstat(handle.fileno())
        return handle.read(MAX_CONFIG_BYTES + 1), info


def _read_config(path: Path) -> tuple[str, ConfigIdentity]:
    try:
        if path.is_dir():
            raise ConfigError("is a directory, not a config file", path=str(path))
        raw, info = read_config_bytes(path)
    except OSError as err:
        raise ConfigError(f"cannot read: {err.strerror}", path=str(path)) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError("larger than 4 MiB; is this really a config file?", path=str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError("not valid UTF-8", path=str(path), line=line) from None
    return text, ConfigIdentity.of(path, info, raw)


def parse_config(text: str, filename: str) -> Settings:
    """Validate config text. Raises :class:`ConfigError` naming ``filename`` and the line."""
    from dispatcher.settings import SCHEMA, Settings
    from scope.foundation.schema import load_yaml, validate

    located = load_yaml(text, filename)
    if located.data is not None and not isinstance(located.data, dict):
        raise ConfigError("the top level must be a mapping of sections", path=filename, line=1)
    settings = validate(SCHEMA, located, filename)
    assert isinstance(settings, Settings)
    return settings
