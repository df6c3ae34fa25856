"""Finding, reading and validating config.yaml.

Nothing here is resolved at import time: every function takes the environment it should use,
so one process can serve several configs and state dirs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher.settings import SCHEMA, Settings
from scope.foundation.errors import ConfigError
from scope.foundation.schema import dump_record, load_yaml, validate

MAX_CONFIG_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class LoadedConfig:
    """Validated settings and where they came from (``path`` None: built-in defaults)."""

    settings: Settings
    path: Path | None

    @property
    def source(self) -> str:
        """The file name, or "built-in defaults"."""
        return str(self.path) if self.path else "built-in defaults"

    def effective(self) -> dict[str, Any]:
        """The effective configuration with defaults filled in (YAML-friendly)."""
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
        return LoadedConfig(settings=Settings(), path=None)
    return LoadedConfig(settings=parse_config(read_config_text(path), str(path)), path=path)


def read_config_text(path: Path) -> str:
    """The file's text, with clear errors for directories, unreadable files and bad encodings."""
    try:
        if path.is_dir():
            raise ConfigError("is a directory, not a config file", path=str(path))
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"cannot read: {err.strerror}", path=str(path)) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError("larger than 4 MiB; is this really a config file?", path=str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError("not valid UTF-8", path=str(path), line=line) from None


def parse_config(text: str, filename: str) -> Settings:
    """Validate config text. Raises :class:`ConfigError` naming ``filename`` and the line."""
    located = load_yaml(text, filename)
    if located.data is not None and not isinstance(located.data, dict):
        raise ConfigError("the top level must be a mapping of sections", path=filename, line=1)
    settings = validate(SCHEMA, located, filename)
    assert isinstance(settings, Settings)
    return settings
