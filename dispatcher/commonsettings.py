"""Config pieces shared by the cron and kanban sections."""

from __future__ import annotations

from scope.schema import (
    Invalid,
    MapOf,
    Str,
)

JOB_ID_PATTERN = r"[a-z0-9][a-z0-9_-]*"
ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"


def env_kind() -> MapOf:
    """The kind of an ``env:`` mapping (environment names to strings)."""
    return MapOf(
        Str(nonempty=False), ENV_NAME_PATTERN, "environment names are [A-Za-z_][A-Za-z0-9_]*"
    )


def check_command(command: str | tuple[str, ...], shell: bool) -> None:
    """A string command is only valid with ``shell: true`` (argv lists never see a shell)."""
    if isinstance(command, str) and not shell:
        raise Invalid(
            "a command string needs 'shell: true'; write the command as an argv list "
            '(e.g. ["backup", "--full"]) or set shell: true',
            ("command",),
        )
