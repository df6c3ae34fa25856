"""What a CLI command works with: resolved config, state dir, database and output helpers.

Everything is resolved lazily from the parsed arguments and the environment passed in, so a
command that only validates a file never creates a state dir or opens the database.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from scope.foundation.clock import Clock, SystemClock
from scope.foundation.errors import ConfigError

if TYPE_CHECKING:
    import argparse
    import logging

    from dispatcher.config import LoadedConfig
    from dispatcher.settings import Settings
    from dispatcher.timefmt import TimeView


class Context:
    """Per-invocation facts for a command handler."""

    def __init__(
        self,
        args: argparse.Namespace,
        environ: Mapping[str, str],
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.args = args
        self.environ = dict(environ)
        self.json: bool = bool(getattr(args, "json", False))
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self._closers: list[Any] = []
        self.clock: Clock = clock or SystemClock()
        self.stable_times = False
        """Absolute times only (set by ``--watch`` when stdout is not a terminal)."""
        self.config_problem: ConfigError | None = None
        """Set when a read-only command goes on without the (broken) config."""
        self._warnings: logging.Handler | None = None

    @property
    def read_only(self) -> bool:
        """The command only reads the state dir (:data:`dispatcher.cli.groups.READ_ONLY`)."""
        from dispatcher.cli.groups import read_only

        command = getattr(self.args, "group", None)
        sub = getattr(self.args, f"{command}_command", None)
        return read_only(command, sub if isinstance(sub, str) else None, self.args)

    @functools.cached_property
    def config_path(self) -> Path | None:
        """The config file in use (None: built-in defaults).

        ``--config`` or ``DISPATCH_CONFIG`` naming a missing file is a usage error for every
        command, read-only views included (exit 2, one line): a mistyped path has no state
        to fall back on the way a half-edited file does."""
        from dispatcher.config import resolve_config_path

        return resolve_config_path(getattr(self.args, "config", None), self.environ)

    @functools.cached_property
    def config(self) -> LoadedConfig:
        """The validated config.

        A read-only command (status, ps, logs, listings) must still work when the file is
        broken, because that is when an operator looks at the recent errors: it warns once and
        goes on with the built-in defaults (see :attr:`config_problem`). Every other command
        fails with the config error (exit 2)."""
        from dispatcher.config import LoadedConfig, load_config

        path = self.config_path
        if self.config_problem is not None:
            return LoadedConfig(settings=_defaults(), path=None)
        try:
            return load_config(path)
        except ConfigError as err:
            self._config_unusable(err)
            return LoadedConfig(settings=_defaults(), path=None)

    def _config_unusable(self, err: ConfigError) -> None:
        if not self.read_only:
            raise err
        self.config_problem = err
        self.warn(f"warning: config not used (read-only view of the state dir): {err.message}")

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

    def times(self) -> TimeView:
        """How this command shows times to people: now, in the viewer's zone (``TZ``)."""
        from dispatcher.timefmt import TimeView, viewer_zone

        return TimeView(
            now=self.clock.time(), zone=viewer_zone(self.environ), stable=self.stable_times
        )

    def on_close(self, closer: Any) -> None:
        """Register an object whose ``close()`` runs when the command ends."""
        self._closers.append(closer)

    def close(self) -> None:
        """Close what the command opened, newest first."""
        while self._closers:
            self._closers.pop().close()

    # -- output ------------------------------------------------------------------------------

    def show_warnings(self) -> None:
        """Show warnings from the library (a degraded placement, a lost session) as one line
        each on stderr until :meth:`hide_warnings`; ``dispatch serve`` replaces this with its
        own journal-friendly handler. Does nothing when already shown."""
        if self._warnings is None:
            self._warnings = _warnings_handler()

    def hide_warnings(self) -> None:
        """Undo :meth:`show_warnings`."""
        if self._warnings is not None:
            import logging

            logging.getLogger("dispatch").removeHandler(self._warnings)
            self._warnings = None

    def out(self, text: str = "") -> None:
        """A line of human output on stdout."""
        print(text, file=self.stdout)

    def warn(self, text: str) -> None:
        """A diagnostic line on stderr."""
        print(f"dispatch: {text}", file=self.stderr)

    def emit_json(self, document: Any) -> None:
        """The one JSON document of a ``--json`` command."""
        import json

        json.dump(document, self.stdout, indent=2, sort_keys=False, default=str)
        self.stdout.write("\n")


def _defaults() -> Settings:
    from dispatcher.settings import Settings

    return Settings()


def _warnings_handler() -> logging.Handler:
    import logging

    class Diagnostics(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            text = record.getMessage().replace("\n", " | ")
            return f"dispatch: {record.levelname.lower()}: {text}"

    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(Diagnostics())
    handler.dispatch_cli = True  # type: ignore[attr-defined]
    logger = logging.getLogger("dispatch")
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.WARNING:
        logger.setLevel(logging.WARNING)
    return handler
