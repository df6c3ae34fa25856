"""What a CLI command works with: resolved config, state dir, database and output helpers.

Everything is resolved lazily from the parsed arguments and the environment passed in, so a
command that only validates a file never creates a state dir or opens the database.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from dispatcher.config import LoadedConfig
    from dispatcher.settings import Settings


class Context:
    """Per-invocation facts for a command handler."""

    def __init__(
        self,
        args: argparse.Namespace,
        environ: Mapping[str, str],
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        self.args = args
        self.environ = dict(environ)
        self.json: bool = bool(getattr(args, "json", False))
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self._closers: list[Any] = []

    @functools.cached_property
    def config_path(self) -> Path | None:
        """The config file in use (None: built-in defaults)."""
        from dispatcher.config import resolve_config_path

        return resolve_config_path(getattr(self.args, "config", None), self.environ)

    @functools.cached_property
    def config(self) -> LoadedConfig:
        """The validated config."""
        from dispatcher.config import load_config

        return load_config(self.config_path)

    @property
    def settings(self) -> Settings:
        """Shorthand for ``config.settings``."""
        return self.config.settings

    @functools.cached_property
    def state_dir(self) -> Path:
        """The state dir, created (0700) on first use."""
        from dispatcher.paths import prepare_state_dir, resolve_state_dir

        return prepare_state_dir(
            resolve_state_dir(getattr(self.args, "state_dir", None), self.environ)
        )

    def on_close(self, closer: Any) -> None:
        """Register an object whose ``close()`` runs when the command ends."""
        self._closers.append(closer)

    def close(self) -> None:
        """Close what the command opened, newest first."""
        while self._closers:
            self._closers.pop().close()

    # -- output ------------------------------------------------------------------------------

    def out(self, text: str = "") -> None:
        """A line of human output on stdout."""
        print(text, file=self.stdout)

    def warn(self, text: str) -> None:
        """A diagnostic line on stderr."""
        print(f"dispatch: {text}", file=self.stderr)

    def emit_json(self, document: Any) -> None:
        """The one JSON document of a ``--json`` command."""
        json.dump(document, self.stdout, indent=2, sort_keys=False, default=str)
        self.stdout.write("\n")
