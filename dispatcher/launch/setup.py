"""A worker's working directory and environment, the same for cron jobs and kanban assignees.

Relative paths (``cwd``, ``env_file``) are relative to the config file's directory (where the
user wrote them), ``~`` is expanded, and a worker without ``cwd`` starts in the state dir. The
environment is layered: the launching process's own (minus the per-launch variables a parent
worker may have passed down, so a worker never sees another launch's ids, and minus systemd's
per-service variables, which would make a worker in its own scope believe it is the launcher's
service), then ``env_file``, then ``env``, then the launch's own variables, which always win.

A cwd that is not a directory or an env_file that cannot be used is a
:class:`~dispatcher.launch.failure.WorkerSetupError` (a ``config_error``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dispatcher import envfile
from dispatcher.errors import EnvFileError
from dispatcher.launch.failure import WorkerSetupError
from registry.environment import SERVICE_ENV

__all__ = ["LAUNCH_VARIABLES", "Workplace"]

LAUNCH_VARIABLES = frozenset(
    {
        "DISPATCH_CARD_ID",
        "DISPATCH_RUN_ID",
        "DISPATCH_CARD_TITLE",
        "DISPATCH_CARD_BODY_FILE",
        "DISPATCH_CARD_BODY",
        "DISPATCH_JOB_ID",
        "DISPATCH_FIRE_KEY",
        "DISPATCH_FIRE_ATTEMPT",
        "DISPATCH_FIRE_ATTEMPTS",
        "DISPATCH_STATE_DIR",
        "DISPATCH_CONFIG",
    }
)
"""Variables that describe one launch; inherited copies are dropped before layering."""


@dataclass(frozen=True, kw_only=True)
class Workplace:
    """Where a launching process runs: its state dir, config file and environment."""

    state_dir: Path
    config_path: Path | None
    environ: Mapping[str, str]

    def resolve(self, path: str) -> Path:
        """``path`` with ``~`` expanded; relative to the config file's directory (else the
        state dir)."""
        expanded = Path(os.path.expanduser(path))
        if expanded.is_absolute():
            return expanded
        base = self.config_path.parent if self.config_path is not None else self.state_dir
        return Path(base).absolute() / expanded

    def cwd(self, cwd: str | None, *, key: str) -> str:
        """The worker's working directory (``key`` names the setting in errors)."""
        if cwd is None:
            return str(Path(self.state_dir).absolute())
        path = self.resolve(cwd)
        if not path.is_dir():
            raise WorkerSetupError(
                "the worker's cwd is not a directory",
                path=str(path),
                remedy=f"create it or fix {key}",
            )
        return str(path)

    def environment(
        self,
        *,
        env_file: str | None,
        env: Mapping[str, str],
        extra: Mapping[str, str],
    ) -> dict[str, str]:
        """The layered environment (see the module docstring)."""
        layered = {
            k: v
            for k, v in self.environ.items()
            if k not in LAUNCH_VARIABLES and k not in SERVICE_ENV
        }
        if env_file:
            layered.update(self.read_env_file(env_file))
        layered.update(env)
        layered["DISPATCH_STATE_DIR"] = str(Path(self.state_dir).absolute())
        if self.config_path is not None:
            layered["DISPATCH_CONFIG"] = str(Path(self.config_path).absolute())
        layered.update(extra)
        return layered

    def read_env_file(self, path: str) -> dict[str, str]:
        """An env_file (rules in :mod:`dispatcher.envfile`); one that cannot be used is a
        :class:`WorkerSetupError`."""
        resolved = self.resolve(path)
        try:
            return envfile.read_env_file(str(resolved))
        except EnvFileError as err:
            raise WorkerSetupError(
                str(err.fields["problem"]),
                path=str(resolved),
                line=err.fields.get("line"),
                remedy=err.remedy
                or "fix the file (mode 0600, NAME=value lines) or remove env_file",
            ) from None
