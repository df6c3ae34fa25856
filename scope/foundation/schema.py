"""Declarative configuration schema shared by every package.

Each package describes its config section as a frozen, keyword-only dataclass whose fields are
made with :func:`setting` (a kind, a default and one line of documentation). The dispatcher
composes the sections into one top-level record and validates a YAML file against it, so a single
schema drives validation, defaults, ``dispatch config show`` and the documentation check.

This module is pure: no I/O besides parsing text handed to it, no global state. It lives in
scope/foundation/ because all three packages need it and scope/ is the lowest.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

from scope.foundation.errors import ConfigError, Invalid
from scope.foundation.text import quote
from scope.foundation.values import (
    format_duration,
    format_percentage,
    format_size,
    load_zone_info,
    parse_duration,
    parse_percentage,
    parse_size,
)

# The value parsers live in values.py; these names are imported from here by many modules.
__all__ = ["Invalid", "format_duration", "format_size", "parse_duration", "parse_size"]

Path_ = tuple[str | int, ...]


# --- kinds -----------------------------------------------------------------------------------


class Kind:
    """How one config value is checked, converted and printed back."""

    label = "value"

    def convert(self, value: Any) -> Any:
        """Check and convert a parsed YAML value; raise :class:`Invalid` when it does not fit."""
        return value

    def dump(self, value: Any) -> Any:
        """The YAML-friendly form of a converted value (for ``config show``)."""
        return value

    def children(self) -> Iterator[tuple[str, Kind]]:
        """Nested kinds with the key fragment they live under (for documentation)."""
        return iter(())


class Str(Kind):
    """A string, optionally matching a pattern or one of fixed choices. A ``secret`` one
    (an environment value) is never repeated in an error."""

    def __init__(
        self,
        pattern: str | None = None,
        hint: str = "",
        nonempty: bool = True,
        *,
        secret: bool = False,
    ) -> None:
        self.pattern = re.compile(pattern) if pattern else None
        self.hint = hint
        self.nonempty = nonempty
        self.secret = secret
        self.label = "string"

    def convert(self, value: Any) -> Any:
        if isinstance(value, bool):
            # YAML 1.1 reads yes/no/on/off/true/false as booleans: COUNTRY: no is False.
            raise Invalid(
                f"expected a string, got the boolean {str(value).lower()}; YAML reads yes, no, "
                'on, off, true and false as booleans: quote the value (e.g. "no")'
            )
        if not isinstance(value, str):
            raise Invalid(f"expected a string, got {_describe(value)}")
        if self.nonempty and not value:
            raise Invalid("must not be empty")
        if self.pattern and not self.pattern.fullmatch(value):
            shown = "" if self.secret else f" {quote(value)}"
            raise Invalid(f"invalid value{shown}" + (f"; {self.hint}" if self.hint else ""))
        return value


class Int(Kind):
    """An integer within optional bounds."""

    label = "integer"

    DEFAULT_MAX = 2**63 - 1
    """Without an explicit ``max``: the largest integer the state database can store."""

    def __init__(self, min: int | None = None, max: int | None = None) -> None:
        self.min, self.max = min, self.DEFAULT_MAX if max is None else max

    def convert(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"expected an integer, got {_describe(value)}")
        if self.min is not None and value < self.min:
            raise Invalid(f"must be at least {self.min}, got {_describe(value)}")
        if self.max is not None and value > self.max:
            raise Invalid(f"must be at most {self.max}, got {_describe(value)}")
        return value


class Bool(Kind):
    """``true`` or ``false`` (YAML booleans only; the string "yes" is not silently true)."""

    label = "boolean"

    def convert(self, value: Any) -> Any:
        if not isinstance(value, bool):
            raise Invalid(f"expected true or false, got {_describe(value)}")
        return value


class Duration(Kind):
    """A duration in seconds (float), written as ``90``, ``30s``, ``5m``, ``1h30m`` ..."""

    label = "duration"

    def __init__(self, min: float = 0.0, max: float | None = None) -> None:
        self.min, self.max = min, max

    def convert(self, value: Any) -> Any:
        seconds = parse_duration(value)
        if seconds < self.min:
            raise Invalid(f"must be at least {format_duration(self.min)}, got {quote(value)}")
        if self.max is not None and seconds > self.max:
            raise Invalid(f"must be at most {format_duration(self.max)}, got {quote(value)}")
        return seconds

    def dump(self, value: Any) -> Any:
        return format_duration(value)


class Size(Kind):
    """A byte count, written as ``1048576`` or ``256MiB``."""

    label = "size"

    def __init__(self, min: int = 0, max: int | None = None) -> None:
        self.min, self.max = min, max

    def convert(self, value: Any) -> Any:
        size = parse_size(value)
        if size < self.min:
            raise Invalid(f"must be at least {format_size(self.min)}, got {quote(value)}")
        if self.max is not None and size > self.max:
            raise Invalid(f"must be at most {format_size(self.max)}, got {quote(value)}")
        return size

    def dump(self, value: Any) -> Any:
        return format_size(value)


class Percent(Kind):
    """A percentage written with its sign (``"150%"``), within bounds; converted to a float."""

    label = "percentage"

    def __init__(self, min: float = 0.0, max: float | None = None) -> None:
        self.min, self.max = min, max

    def convert(self, value: Any) -> Any:
        percent = parse_percentage(value)
        if percent < self.min:
            raise Invalid(f"must be at least {format_percentage(self.min)}, got {quote(value)}")
        if self.max is not None and percent > self.max:
            raise Invalid(f"must be at most {format_percentage(self.max)}, got {quote(value)}")
        return percent

    def dump(self, value: Any) -> Any:
        return format_percentage(value)


class Choice(Kind):
    """One value of an :class:`enum.Enum` whose values are strings."""

    def __init__(self, enum_cls: type[enum.Enum]) -> None:
        self.enum_cls = enum_cls
        self.label = "one of " + ", ".join(str(m.value) for m in enum_cls)

    def convert(self, value: Any) -> Any:
        for member in self.enum_cls:
            if member.value == value:
                return member
        allowed = ", ".join(str(m.value) for m in self.enum_cls)
        raise Invalid(f"invalid value {quote(value)}; use one of: {allowed}")

    def dump(self, value: Any) -> Any:
        return value.value


class Zone(Kind):
    """An IANA time zone name such as ``Europe/Berlin``."""

    label = "IANA time zone"

    def convert(self, value: Any) -> Any:
        if not isinstance(value, str) or not value:
            raise Invalid(f"expected a time zone name, got {_describe(value)}")
        load_zone_info(value)
        return value


class Argv(Kind):
    """A command: a list of strings (argv), or a single string (only valid with ``shell``).

    The shell rule is checked by the record that owns both keys; here a string becomes a
    ``str`` and a list a ``tuple`` so the owner can tell them apart.
    """

    label = "command (argv list, or a string with shell: true)"

    def convert(self, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                raise Invalid("command must not be empty")
            if "\0" in value:
                raise Invalid("a command cannot hold a NUL byte")
            return value
        if isinstance(value, list):
            if not value:
                raise Invalid("command must not be an empty list")
            for index, item in enumerate(value):
                if isinstance(item, bool) or not isinstance(item, str | int | float):
                    raise Invalid(f"argv items must be strings, got {_describe(item)}", (index,))
                if "\0" in str(item):
                    raise Invalid("an argument cannot hold a NUL byte", (index,))
            return tuple(str(item) for item in value)
        raise Invalid(f"expected an argv list or a string, got {_describe(value)}")

    def dump(self, value: Any) -> Any:
        return value if isinstance(value, str) else list(value)


class Optional(Kind):
    """The inner kind, or ``null``."""

    def __init__(self, inner: Kind) -> None:
        self.inner = inner
        self.label = f"{inner.label} or null"

    def convert(self, value: Any) -> Any:
        return None if value is None else self.inner.convert(value)

    def dump(self, value: Any) -> Any:
        return None if value is None else self.inner.dump(value)

    def children(self) -> Iterator[tuple[str, Kind]]:
        return self.inner.children()


class ListOf(Kind):
    """A list whose items share one kind; converted to a tuple (records stay immutable)."""

    def __init__(self, item: Kind) -> None:
        self.item = item
        self.label = f"list of {item.label}"

    def convert(self, value: Any) -> Any:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise Invalid(f"expected a list, got {_describe(value)}")
        out = []
        for index, item in enumerate(value):
            try:
                out.append(self.item.convert(item))
            except Invalid as err:
                raise Invalid(err.problem, (index, *err.path)) from None
        return tuple(out)

    def dump(self, value: Any) -> Any:
        return [self.item.dump(item) for item in value]

    def children(self) -> Iterator[tuple[str, Kind]]:
        yield "[]", self.item


class MapOf(Kind):
    """A mapping from names (matching ``key_pattern``) to values of one kind."""

    def __init__(self, value: Kind, key_pattern: str = r".+", key_hint: str = "") -> None:
        self.value = value
        self.key_pattern = re.compile(key_pattern)
        self.key_hint = key_hint
        self.label = f"mapping of name to {value.label}"

    def convert(self, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise Invalid(f"expected a mapping, got {_describe(value)}")
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or not self.key_pattern.fullmatch(key):
                hint = f"; {self.key_hint}" if self.key_hint else ""
                raise Invalid(f"invalid name {quote(key)}{hint}", (str(key),))
            try:
                out[key] = self.value.convert(item)
            except Invalid as err:
                raise Invalid(err.problem, (key, *err.path)) from None
        return out

    def dump(self, value: Any) -> Any:
        return {key: self.value.dump(item) for key, item in value.items()}

    def children(self) -> Iterator[tuple[str, Kind]]:
        yield "<name>", self.value


class Record(Kind):
    """A mapping validated against a dataclass whose fields were made with :func:`setting`.

    The dataclass may define ``check(self) -> None`` raising :class:`Invalid` (with the key in
    ``path``) for rules that span several keys.
    """

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.label = "mapping"

    def fields(self) -> Iterator[tuple[str, Kind, dataclasses.Field[Any]]]:
        """(key, kind, dataclass field) for every documented key of the record."""
        for field in dataclasses.fields(self.cls):
            kind = field.metadata.get("kind")
            if kind is not None:
                yield field.name, kind, field

    def prepared(self, value: Any) -> Any:
        """``value`` as the keys should be read (a subclass may rename keys YAML mangled);
        every reader of a record, :meth:`convert` and the config check, starts here."""
        return value

    def convert(self, value: Any) -> Any:
        value = self.prepared(value)
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise Invalid(f"expected a mapping, got {_describe(value)}")
        known = {name: (kind, field) for name, kind, field in self.fields()}
        for key in value:
            if key not in known:
                close = _closest(str(key), known)
                hint = f"; did you mean {close!r}?" if close else ""
                raise Invalid(f"unknown key {quote(key)}{hint}", (str(key),))
        kwargs = {}
        for name, (kind, field) in known.items():
            if name in value:
                try:
                    kwargs[name] = kind.convert(value[name])
                except Invalid as err:
                    raise Invalid(err.problem, (name, *err.path)) from None
            elif (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise Invalid(f"missing required key {name!r}")
        record = self.cls(**kwargs)
        check = getattr(record, "check", None)
        if check is not None:
            check()
        return record

    def dump(self, value: Any) -> Any:
        return {name: kind.dump(getattr(value, name)) for name, kind, _ in self.fields()}

    def children(self) -> Iterator[tuple[str, Kind]]:
        for name, kind, _ in self.fields():
            yield name, kind


def setting(
    default: Any = dataclasses.MISSING,
    *,
    kind: Kind,
    doc: str,
    default_factory: Callable[[], Any] | None = None,
) -> Any:
    """A dataclass field that is also a documented config key."""
    metadata = {"kind": kind, "doc": doc}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def documented_keys(root: Record, prefix: str = "") -> Iterator[tuple[str, Kind, str, Any]]:
    """Every key of the schema as (dotted key, kind, doc, default) in declaration order.

    Nested records appear as ``cron.jobs[].schedule`` and ``kanban.assignees.<name>.command``.
    """
    for name, kind, field in root.fields():
        key = f"{prefix}{name}"
        if field.default is not dataclasses.MISSING:
            default: Any = kind.dump(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = kind.dump(field.default_factory())
        else:
            default = dataclasses.MISSING
        yield key, kind, field.metadata["doc"], default
        yield from _nested_keys(kind, key)


def _nested_keys(kind: Kind, key: str) -> Iterator[tuple[str, Kind, str, Any]]:
    inner = kind.inner if isinstance(kind, Optional) else kind
    if isinstance(inner, Record):
        yield from documented_keys(inner, key + ".")
    elif isinstance(inner, ListOf | MapOf):
        for fragment, child in inner.children():
            sub = f"{key}{fragment}" if fragment == "[]" else f"{key}.{fragment}"
            if isinstance(child, Record):
                yield from documented_keys(child, sub + ".")


# --- YAML with line numbers ------------------------------------------------------------------


class Located:
    """Parsed YAML plus the line of every key and list item, for file:line errors."""

    def __init__(self, data: Any, lines: dict[Path_, int]) -> None:
        self.data = data
        self.lines = lines

    def line_of(self, path: Path_) -> int | None:
        """The line of ``path`` or of its nearest parent that has one."""
        for cut in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:cut]))
            if line is not None:
                return line
        return None


def load_yaml(text: str, filename: str) -> Located:
    """Parse YAML with the safe loader, keeping line numbers and rejecting duplicate keys."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        problem = (err.problem or err.context or "invalid YAML").strip()
        raise ConfigError(f"invalid YAML: {problem}", path=filename, line=line) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid YAML: {err}", path=filename) from None
    lines: dict[Path_, int] = {}
    if node is None:
        return Located(None, lines)
    constructor = SafeConstructor()
    data = _build(node, (), lines, constructor, filename)
    return Located(data, lines)


_PLAIN_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}"
    for name in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp", "merge")
)


def _build(
    node: yaml.Node,
    path: Path_,
    lines: dict[Path_, int],
    constructor: SafeConstructor,
    filename: str,
) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if node.tag not in _PLAIN_TAGS:
        raise ConfigError(
            f"unsupported YAML tag {quote(node.tag)}; plain values, lists and mappings only",
            path=filename,
            line=node.start_mark.line + 1,
        )
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise ConfigError(
                    "YAML merge keys (<<) are not supported; write the keys out",
                    path=filename,
                    line=key_node.start_mark.line + 1,
                )
            key = _build(key_node, (*path, "\0key"), {}, constructor, filename)
            if isinstance(key, list | dict):
                raise ConfigError(
                    "mapping keys must be plain scalars",
                    path=filename,
                    line=key_node.start_mark.line + 1,
                )
            if key in out:
                raise ConfigError(
                    f"duplicate key {quote(key)}", path=filename, line=key_node.start_mark.line + 1
                )
            child = (*path, str(key))
            lines[child] = key_node.start_mark.line + 1
            out[key] = _build(value_node, child, lines, constructor, filename)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [
            _build(item, (*path, index), lines, constructor, filename)
            for index, item in enumerate(node.value)
        ]
    try:
        return constructor.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, OverflowError) as err:
        # ValueError: an integer past int()'s 4,300-digit limit; OverflowError: a timestamp
        # or float out of range.
        raise ConfigError(
            f"invalid value {quote(node.value)}: {str(err).splitlines()[0]}",
            path=filename,
            line=node.start_mark.line + 1,
        ) from None


def validate(root: Record, located: Located, filename: str) -> Any:
    """Convert parsed YAML into the root record; errors become :class:`ConfigError` with a line."""
    try:
        return root.convert(located.data)
    except Invalid as err:
        key = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in err.path)
        key = key.replace(".[", "[")
        raise ConfigError(
            err.problem, path=filename, line=located.line_of(err.path), key=key or None
        ) from None


def dump_record(root: Record, value: Any) -> dict[str, Any]:
    """The YAML-friendly effective configuration (defaults filled in)."""
    dumped = root.dump(value)
    assert isinstance(dumped, dict)
    return dumped


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        if abs(value) >= 10**18:
            return "a number of more than 18 digits"
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {quote(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return type(value).__name__


def _closest(word: str, options: Mapping[str, Any]) -> str | None:
    import difflib

    found = difflib.get_close_matches(word, list(options), n=1, cutoff=0.75)
    return found[0] if found else None
