"""cron's branch of the error tree (the root and the whole tree are drawn in scope/errors.py).

::

    DispatchError
    ├── UsageError
    │   ├── CronExpressionError   a crontab expression that cannot be used (exit 2)
    │   ├── DeferRefused          a worker's defer that its fire cannot take (exit 2)
    │   └── ZoneError             a time zone name that cannot be loaded (exit 2)
    └── DispatcherError           dispatcher/errors.py
        └── CronError             a cron operation failed (exit 1)

(EnvFileError, shared with kanban, lives in dispatcher/errors.py.)
"""

from __future__ import annotations

from typing import Any

from dispatcher.errors import DispatcherError
from scope.foundation.errors import UsageError
from scope.foundation.text import quote


class CronExpressionError(UsageError):
    """A crontab expression (or a zone given with one) is invalid; one line, exit 2."""

    def __init__(self, expression: str, problem: str, **fields: Any) -> None:
        super().__init__(expression=expression, problem=problem, **fields)

    def describe(self) -> str:
        expression = quote(self.fields["expression"])
        return f"invalid crontab expression {expression}: {self.fields['problem']}"


class CronError(DispatcherError):
    """A cron operation failed (a fire that cannot start, a CLI request that cannot be met)."""

    def __init__(self, problem: str, *, remedy: str | None = None, **fields: Any) -> None:
        super().__init__(remedy=remedy, problem=problem, **fields)

    def describe(self) -> str:
        job = self.fields.get("job_id")
        prefix = f"cron job {job!r}: " if job else ""
        return f"{prefix}{self.fields['problem']}"


class DeferRefused(UsageError):
    """``dispatch kanban defer`` inside a cron worker that its fire cannot take (no retry
    policy, no try in progress, another try's worker, a time not in the future): one line,
    exit 2, nothing changed."""

    def __init__(self, fire_key: str, problem: str, *, remedy: str | None = None) -> None:
        super().__init__(remedy=remedy, fire_key=fire_key, problem=problem)

    def describe(self) -> str:
        return f"cron fire {self.fields['fire_key']}: {self.fields['problem']}"


class ZoneError(UsageError):
    """A time zone name that cannot be loaded; one line, exit 2."""

    def __init__(self, zone: str, **fields: Any) -> None:
        super().__init__(zone=zone, **fields)

    def describe(self) -> str:
        return (
            f"unknown time zone {quote(self.fields['zone'])}; use an IANA name such as "
            "Europe/Berlin or UTC"
        )
