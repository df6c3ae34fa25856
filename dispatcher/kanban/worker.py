"""What a card's worker is started with: argv, cwd, environment and the card body file.

The cwd and the environment follow the launch core's rules for every worker
(:class:`dispatcher.launch.setup.Workplace`): the dispatcher's environment, then the
assignee's ``env_file``, then its ``env``, then the card variables, which always win:
``DISPATCH_CARD_ID``, ``DISPATCH_RUN_ID``, ``DISPATCH_CARD_TITLE``, ``DISPATCH_CARD_BODY_FILE``
(always; a 0600 file under the state dir), ``DISPATCH_CARD_BODY`` (only when the body is at most
64 KiB), ``DISPATCH_STATE_DIR`` and ``DISPATCH_CONFIG``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from dispatcher.kanban.model import Card, Run
from dispatcher.kanban.settings import Assignee
from dispatcher.launch.setup import Workplace
from registry.abc import Owner, OwnerKind, SpawnRequest
from registry.store.database import ensure_private_dir
from scope.abc import CallerKind
from scope.resources import ScopeProperties

BODY_ENV_LIMIT = 64 * 1024
"""Bodies up to this many bytes (UTF-8) are also passed in ``DISPATCH_CARD_BODY``."""


@dataclass(frozen=True, kw_only=True)
class WorkerContext:
    """Where the dispatcher runs (state dir, config file, environment) and as which caller."""

    workplace: Workplace
    caller: CallerKind = CallerKind.KANBAN

    @property
    def state_dir(self) -> Path:
        """The state dir the body files live under."""
        return self.workplace.state_dir


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


def card_variables(card: Card, run: Run, body_file: Path) -> dict[str, str]:
    """The variables that tell a worker which card and run it works on."""
    extra = {
        "DISPATCH_CARD_ID": card.id,
        "DISPATCH_RUN_ID": run.run_id,
        "DISPATCH_CARD_TITLE": card.title,
        "DISPATCH_CARD_BODY_FILE": str(body_file),
    }
    if len(card.body.encode("utf-8")) <= BODY_ENV_LIMIT and "\0" not in card.body:
        extra["DISPATCH_CARD_BODY"] = card.body
    return extra


def spawn_request(
    card: Card,
    run: Run,
    assignee: Assignee,
    ctx: WorkerContext,
    *,
    resources: ScopeProperties | None = None,
) -> SpawnRequest:
    """Everything the registry needs to start the card's worker; writes the body file.
    ``resources``: this try's class when a retry rule chose one (else the assignee's).

    Raises :class:`~dispatcher.launch.failure.WorkerSetupError` when the assignee cannot be
    used as configured (a ``config_error``)."""
    workplace = ctx.workplace
    cwd = workplace.cwd(assignee.cwd, key=f"kanban.assignees.{card.assignee}.cwd")
    body_file = write_body(ctx.state_dir, run.run_id, card.body)
    try:
        env = workplace.environment(
            env_file=assignee.env_file,
            env=assignee.env,
            extra=card_variables(card, run, body_file),
        )
    except BaseException:
        remove_body(ctx.state_dir, run.run_id)
        raise
    command = assignee.command
    return SpawnRequest(
        argv=command if isinstance(command, str) else tuple(command),
        shell=assignee.shell,
        cwd=cwd,
        env=env,
        owner=Owner(kind=OwnerKind.KANBAN, id=run.run_id),
        caller=ctx.caller,
        pty=assignee.pty,
        timeout=assignee.timeout,
        resources=assignee.resources if resources is None else resources,
        unit_parts=(card.id, run.run_id),
        wants_isolation=True,
        labels={"card_id": card.id, "run_id": run.run_id, "assignee": card.assignee},
    )
