"""The project's one error root and the branches every package shares.

The root lives in scope/foundation/ because scope/ is the lowest package; scope/, registry/ and
dispatcher/ add their own branches by subclassing. The whole tree::

    DispatchError                      exit 1 unless a subclass says otherwise
    ├── UsageError                     exit 2: a bad argument or an unknown/ambiguous id
    │   ├── NotFoundError              exit 2: an id, file or name that does not exist
    │   ├── IdTooShort                 ids.py: an id prefix under 4 characters (exit 2)
    │   ├── AmbiguousId                ids.py: an id prefix matches several ids (exit 2)
    │   └── Invalid                    exit 2: a value does not fit its kind (schema parsers)
    ├── ConfigError                    exit 2: config file invalid (carries file and line)
    ├── ScopeError                     scope/errors.py: placing or stopping a systemd scope failed
    │   ├── ScopeUnavailable           placement refused by policy (no restart-safe scope)
    │   │   └── ClassUnavailable       the worker's resource class cannot take effect here
    │   ├── ManagerLost                a scoped spawn failed because the manager vanished
    │   └── BusError                   the runtime dir or bus is unsafe or unusable
    ├── RegistryError                  registry/errors.py: spawn, kill, session, state store
    │   └── StateError                 the state database is unusable or from a newer version
    └── DispatcherError                dispatcher/errors.py: cron, kanban, gateway

A class also says whether a restart can help (``restart_helps``): ``dispatch serve`` exits 75
for those at start and with the class's exit code for every other one.

Every error keeps its facts in structured fields and builds its message from them, so callers
(the CLI, the JSON output, the event log) can use the fields without parsing text. Where a user can
act, the message names the fix in ``remedy``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs the CLI's start-up; the annotations are strings anyway
    from typing import Any, ClassVar


class DispatchError(Exception):
    """Root of every error this project raises on purpose.

    Subclasses set ``exit_code`` (the CLI's exit status for this class) and may override
    :meth:`describe` to build the message from their fields. ``remedy`` is a sentence telling the
    user what to do, appended to the message when present.
    """

    exit_code: ClassVar[int] = 1
    restart_helps: ClassVar[bool] = False
    """Whether the same start may succeed later with nothing changed (a database that is
    down, a disk that is full): ``dispatch serve`` then exits 75 to ask its supervisor for a
    restart. Every other error at start is permanent until someone acts, so serve exits with
    ``exit_code`` (1 or 2) and the shipped units do not restart it."""

    def __init__(self, message: str = "", *, remedy: str | None = None, **fields: Any) -> None:
        self.fields: dict[str, Any] = dict(fields)
        self.remedy = remedy
        self._message = message
        super().__init__(self.message)

    def describe(self) -> str:
        """The problem, without the remedy. Subclasses build it from ``self.fields``."""
        return self._message

    @property
    def message(self) -> str:
        """One line: the problem, then the fix when there is one."""
        text = self.describe()
        if self.remedy:
            text = f"{text}; {self.remedy}" if text else self.remedy
        return " ".join(text.split("\n"))

    def __str__(self) -> str:
        return self.message

    def __getattr__(self, name: str) -> Any:
        # Structured fields read like attributes (err.unit, err.path) without each subclass
        # declaring them; only called when normal lookup fails.
        fields = self.__dict__.get("fields")
        if fields is not None and name in fields:
            return fields[name]
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form: type, message and the structured fields."""
        out: dict[str, Any] = {"error": type(self).__name__, "message": self.message}
        for key, value in self.fields.items():
            out[key] = value if isinstance(value, str | int | float | bool | None) else str(value)
        if self.remedy:
            out["remedy"] = self.remedy
        return out


class UsageError(DispatchError):
    """A command-line argument or API argument is wrong (exit 2)."""

    exit_code = 2


class NotFoundError(UsageError):
    """Something named by the user does not exist: an id, a file, a job (exit 2)."""

    def __init__(self, kind: str, name: str, *, remedy: str | None = None, **fields: Any) -> None:
        super().__init__(remedy=remedy, kind=kind, name=name, **fields)

    def describe(self) -> str:
        from scope.foundation.text import quote  # here: text.py imports this module

        return f"no {self.fields['kind']} {quote(self.fields['name'])}"


class ConfigError(DispatchError):
    """A configuration file (or value) is invalid. Carries ``path`` and ``line`` when known."""

    exit_code = 2

    def __init__(
        self,
        problem: str,
        *,
        path: str | None = None,
        line: int | None = None,
        key: str | None = None,
        remedy: str | None = None,
    ) -> None:
        super().__init__(remedy=remedy, problem=problem, path=path, line=line, key=key)

    def describe(self) -> str:
        where = self.fields.get("path") or "<config>"
        if self.fields.get("line"):
            where = f"{where}:{self.fields['line']}"
        key = self.fields.get("key")
        subject = f"{key}: " if key else ""
        return f"{where}: {subject}{self.fields['problem']}"


class Invalid(UsageError):
    """A value does not fit its kind (a duration, a size, a time zone, ...): exit 2.

    Raised by the schema's parsers; ``path`` (keys below where it was raised) lets the config
    loader turn it into a :class:`ConfigError` naming the file, line and key. A command-line flag
    that fails to parse reaches the user as this one line directly.
    """

    def __init__(self, problem: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path = path
