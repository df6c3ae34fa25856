"""What a card's worker is started with: argv, cwd, environment and the card body file.

The worker's environment is the dispatcher's own (minus variables that describe the
dispatcher's unit, which would mislead a worker living in its own scope), then the assignee's
``env_file``, then its ``env``, then the card variables, which always win:
``DISPATCH_CARD_ID``, ``DISPATCH_RUN_ID``, ``DISPATCH_CARD_TITLE``, ``DISPATCH_CARD_BODY_FILE``
(always; a 0600 file under the state dir), ``DISPATCH_CARD_BODY`` (only when the body is at most
64 KiB), ``DISPATCH_STATE_DIR`` and ``DISPATCH_CONFIG``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dispatcher import envfile
from dispatcher.errors import EnvFileError
from dispatcher.kanban.errors import KanbanError
from dispatcher.kanban.model import Card, Run
from dispatcher.kanban.settings import Assignee
from registry.abc import Owner, SpawnRequest
from registry.state import ensure_private_dir
from scope.abc import CallerKind

BODY_ENV_LIMIT = 64 * 1024
"""Bodies up to this many bytes (UTF-8) are also passed in ``DISPATCH_CARD_BODY``."""

UNIT_VARIABLES = (
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "NOTIFY_SOCKET",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "MAINPID",
    "MANAGERPID",
    "SYSTEMD_EXEC_PID",
    "TRIGGER_UNIT",
    "TRIGGER_PATH",
    "TRIGGER_TIMER_REALTIME_USEC",
    "TRIGGER_TIMER_MONOTONIC_USEC",
    "DISPATCH_SCOPE_GATE_FD",
)
"""Variables that describe the dispatcher's own unit; a worker in its own scope must not see
them (INVOCATION_ID would make a nested ``dispatch run`` think it sits in a service, and
NOTIFY_SOCKET would let it talk to the gateway's supervisor)."""

CARD_VARIABLES = (
    "DISPATCH_CARD_ID",
    "DISPATCH_RUN_ID",
    "DISPATCH_CARD_TITLE",
    "DISPATCH_CARD_BODY_FILE",
    "DISPATCH_CARD_BODY",
    "DISPATCH_STATE_DIR",
    "DISPATCH_CONFIG",
)


class WorkerSetupError(KanbanError):
    """The assignee's definition cannot be used as it is (an unsafe or malformed env_file, a
    missing cwd): retrying cannot help, so the run is a ``config_error``."""

    def __init__(
        self,
        problem: str,
        *,
        path: str | None = None,
        line: int | None = None,
        remedy: str | None = None,
    ) -> None:
        super().__init__(remedy=remedy, problem=problem, path=path, line=line)

    def describe(self) -> str:
        where = self.fields.get("path")
        if where and self.fields.get("line"):
            where = f"{where}:{self.fields['line']}"
        return f"{where}: {self.fields['problem']}" if where else self.fields["problem"]


@dataclass(frozen=True, kw_only=True)
class WorkerContext:
    """Where the dispatcher runs: state dir, config file and the environment to inherit."""

    state_dir: Path
    config_path: Path | None
    environ: Mapping[str, str]
    caller: CallerKind = CallerKind.KANBAN


def bodies_dir(state_dir: Path) -> Path:
    """``<state_dir>/kanban/bodies`` (0700): one body file per run."""
    return Path(state_dir) / "kanban" / "bodies"


def body_path(state_dir: Path, run_id: str) -> Path:
    """The body file of ``run_id``."""
    return bodies_dir(state_dir) / f"{run_id}.txt"


def write_body(state_dir: Path, run_id: str, body: str) -> Path:
    """Write the card body for ``run_id`` (0600, created fresh; never follows a symlink)."""
    folder = bodies_dir(state_dir)
    ensure_private_dir(folder.parent)
    ensure_private_dir(folder)
    path = folder / f"{run_id}.txt"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(body.encode("utf-8"))
    return path


def remove_body(state_dir: Path, run_id: str) -> None:
    """Delete the body file of a closed run (missing is fine)."""
    with contextlib.suppress(OSError):
        body_path(state_dir, run_id).unlink()


def _base_dir(ctx: WorkerContext) -> Path:
    return ctx.config_path.parent if ctx.config_path is not None else Path(ctx.state_dir)


def _resolve(path: str, ctx: WorkerContext) -> Path:
    """``~`` expanded; relative paths are relative to the config file's directory."""
    expanded = Path(os.path.expanduser(path))
    return expanded if expanded.is_absolute() else _base_dir(ctx) / expanded


def read_env_file(path: Path) -> dict[str, str]:
    """The assignee's env_file (rules in :mod:`dispatcher.envfile`); a file that cannot be used
    is a :class:`WorkerSetupError`, so the run is a ``config_error``."""
    try:
        return envfile.read_env_file(str(path))
    except EnvFileError as err:
        raise WorkerSetupError(
            str(err.fields["problem"]),
            path=str(path),
            line=err.fields.get("line"),
            remedy=err.remedy or "fix the file (mode 0600, NAME=value lines) or remove env_file",
        ) from None


def worker_env(
    card: Card, run: Run, assignee: Assignee, ctx: WorkerContext, body_file: Path
) -> dict[str, str]:
    """The worker's environment (see the module docstring for the layering)."""
    env = {
        key: value
        for key, value in ctx.environ.items()
        if key not in UNIT_VARIABLES and key not in CARD_VARIABLES
    }
    if assignee.env_file:
        env.update(read_env_file(_resolve(assignee.env_file, ctx)))
    env.update(assignee.env)
    env["DISPATCH_CARD_ID"] = card.id
    env["DISPATCH_RUN_ID"] = run.run_id
    env["DISPATCH_CARD_TITLE"] = card.title
    env["DISPATCH_CARD_BODY_FILE"] = str(body_file)
    encoded = card.body.encode("utf-8")
    if len(encoded) <= BODY_ENV_LIMIT and "\0" not in card.body:
        env["DISPATCH_CARD_BODY"] = card.body
    env["DISPATCH_STATE_DIR"] = str(Path(ctx.state_dir).absolute())
    if ctx.config_path is not None:
        env["DISPATCH_CONFIG"] = str(Path(ctx.config_path).absolute())
    return env


def worker_cwd(assignee: Assignee, ctx: WorkerContext) -> str:
    """The assignee's ``cwd`` (relative to the config file's directory), else the state dir."""
    if assignee.cwd is None:
        return str(Path(ctx.state_dir).absolute())
    path = _resolve(assignee.cwd, ctx)
    if not path.is_dir():
        raise WorkerSetupError(
            "the assignee's cwd is not a directory",
            path=str(path),
            remedy="create it or fix kanban.assignees.<name>.cwd",
        )
    return str(path)


def spawn_request(card: Card, run: Run, assignee: Assignee, ctx: WorkerContext) -> SpawnRequest:
    """Everything the registry needs to start the card's worker; writes the body file.

    Raises :class:`WorkerSetupError` when the assignee cannot be used as configured."""
    cwd = worker_cwd(assignee, ctx)
    body_file = write_body(ctx.state_dir, run.run_id, card.body)
    try:
        env = worker_env(card, run, assignee, ctx, body_file)
    except BaseException:
        remove_body(ctx.state_dir, run.run_id)
        raise
    command = assignee.command
    return SpawnRequest(
        argv=command if isinstance(command, str) else tuple(command),
        shell=assignee.shell,
        cwd=cwd,
        env=env,
        owner=Owner(kind="kanban", id=run.run_id),
        caller=ctx.caller,
        pty=assignee.pty,
        timeout=assignee.timeout,
        unit_parts=(card.id, run.run_id),
        wants_isolation=True,
        labels={"card_id": card.id, "run_id": run.run_id, "assignee": card.assignee},
    )
