"""Config pieces shared by the cron and kanban sections."""

from __future__ import annotations

from typing import Any

from scope.foundation.schema import (
    Argv,
    Bool,
    Invalid,
    ListOf,
    MapOf,
    Optional,
    Record,
    Str,
    setting,
)
from scope.resources import ScopeProperties

JOB_ID_PATTERN = r"[a-z0-9][a-z0-9_-]*"
ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"


def env_kind() -> MapOf:
    """The kind of an ``env:`` mapping (environment names to strings)."""
    return MapOf(
        Str(r"[^\0]*", "an environment value cannot hold a NUL byte", nonempty=False, secret=True),
        ENV_NAME_PATTERN,
        "environment names are [A-Za-z_][A-Za-z0-9_]*",
    )


def check_command(command: str | tuple[str, ...], shell: bool) -> None:
    """A string command is only valid with ``shell: true`` (argv lists never see a shell)."""
    if isinstance(command, str) and not shell:
        raise Invalid(
            "a command string needs 'shell: true'; write the command as an argv list "
            '(e.g. ["backup", "--full"]) or set shell: true',
            ("command",),
        )


# Settings every worker definition has (cron jobs and kanban assignees), defined once so the
# two stay alike. Each returns a fresh dataclass field.


def command_setting() -> Any:
    """``command``: an argv list, or a string with ``shell: true``."""
    return setting(kind=Argv(), doc="argv list to run; a single string only with shell: true.")


def shell_setting() -> Any:
    """``shell``: run a string command through ``/bin/sh -c``."""
    return setting(False, kind=Bool(), doc="Run a string command through /bin/sh -c.")


def cwd_setting() -> Any:
    """``cwd``: the worker's working directory."""
    return setting(
        None,
        kind=Optional(Str(r"[^\0]+", "a path cannot hold a NUL byte")),
        doc="Working directory (default: the state dir).",
    )


def env_setting() -> Any:
    """``env``: extra environment variables."""
    return setting(default_factory=dict, kind=env_kind(), doc="Extra environment variables.")


def env_file_setting() -> Any:
    """``env_file``: NAME=value lines, ours and 0600."""
    return setting(
        None,
        kind=Optional(Str(r"[^\0]+", "a path cannot hold a NUL byte")),
        doc="File of NAME=value lines added to the environment; must be ours and mode 0600.",
    )


def uses_setting() -> Any:
    """``uses``: the named limits (``limits:``) every start of this worker takes."""
    return setting(
        default_factory=tuple,
        kind=ListOf(Str(JOB_ID_PATTERN, "limit names are [a-z0-9][a-z0-9_-]*")),
        doc="Named limits (from limits:) each start takes, all or none: a start waits while "
        "any of them is full.",
    )


def pty_setting() -> Any:
    """``pty``: run the worker on a pseudo-terminal."""
    return setting(False, kind=Bool(), doc="Run the worker on a pseudo-terminal.")


def resources_setting() -> Any:
    """``resources``: the worker's resource class, over ``scope.resources`` key by key."""
    return setting(
        default_factory=ScopeProperties,
        kind=Record(ScopeProperties),
        doc="Resource class of this worker's scope (memory_high, memory_max, memory_swap_max, "
        "cpu_weight, cpu_quota, tasks_max, io_weight, runtime_max, best_effort); unset keys "
        "come from scope.resources. See docs/resources.md.",
    )
