"""Every error in a config file at once (``dispatch config check``), not only the first.

:meth:`~scope.foundation.schema.Kind.convert` stops at the first value that does not fit, which
is right for loading (nothing half-valid is ever used). A check wants them all: this walks the
same schema, converting every key of every record, item of every list and entry of every
mapping on its own, and collects one :class:`~scope.foundation.errors.Invalid` per problem
with its path. Rules that span several keys (a record's ``check()``) run only where the keys
they read are valid themselves, so one mistake is not reported twice.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scope.foundation.errors import ConfigError, Invalid
from scope.foundation.schema import Kind, ListOf, Located, MapOf, Optional, Record, _closest

__all__ = ["collect_errors", "config_errors"]

_FAILED = object()
"""Stands for a value that did not convert (its error is already collected)."""


def config_errors(root: Record, located: Located, filename: str) -> list[ConfigError]:
    """Every problem of the parsed file, as one-line config errors in file order."""
    found: list[Invalid] = []
    collect_errors(root, located.data, (), found)
    errors = [_config_error(err, located, filename) for err in found]
    errors.sort(key=lambda e: e.fields.get("line") or 0)
    return errors


def collect_errors(
    kind: Kind, value: Any, path: tuple[str | int, ...], found: list[Invalid]
) -> Any:
    """``kind.convert(value)``, or the failure marker after appending every problem below
    ``path`` to ``found``."""
    if isinstance(kind, Optional):
        return None if value is None else collect_errors(kind.inner, value, path, found)
    if isinstance(kind, Record):
        return _record(kind, value, path, found)
    if isinstance(kind, ListOf) and isinstance(value, list):
        items = [collect_errors(kind.item, item, (*path, i), found) for i, item in enumerate(value)]
        return _FAILED if any(i is _FAILED for i in items) else tuple(items)
    if isinstance(kind, MapOf) and isinstance(value, dict):
        return _mapping(kind, value, path, found)
    try:
        return kind.convert(value)
    except Invalid as err:
        found.append(Invalid(err.problem, (*path, *err.path)))
        return _FAILED


def _mapping(
    kind: MapOf, value: dict[Any, Any], path: tuple[str | int, ...], found: list[Invalid]
) -> Any:
    out: dict[str, Any] = {}
    failed = False
    for key, item in value.items():
        if not isinstance(key, str) or not kind.key_pattern.fullmatch(key):
            hint = f"; {kind.key_hint}" if kind.key_hint else ""
            found.append(Invalid(f"invalid name {key!r}{hint}", (*path, str(key))))
            failed = True
            continue
        converted = collect_errors(kind.value, item, (*path, key), found)
        failed = failed or converted is _FAILED
        out[key] = converted
    return _FAILED if failed else out


def _record(kind: Record, value: Any, path: tuple[str | int, ...], found: list[Invalid]) -> Any:
    value = kind.prepared(value)
    if value is None:
        value = {}
    if not isinstance(value, dict):
        try:
            return kind.convert(value)  # raises the "expected a mapping" error
        except Invalid as err:
            found.append(Invalid(err.problem, (*path, *err.path)))
            return _FAILED
    known = {name: (child, field) for name, child, field in kind.fields()}
    failed = False
    for key in value:
        if key not in known:
            close = _closest(str(key), known)
            hint = f"; did you mean {close!r}?" if close else ""
            found.append(Invalid(f"unknown key {key!r}{hint}", (*path, str(key))))
            failed = True
    kwargs: dict[str, Any] = {}
    for name, (child, field) in known.items():
        if name in value:
            converted = collect_errors(child, value[name], (*path, name), found)
            failed = failed or converted is _FAILED
            kwargs[name] = converted
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            found.append(Invalid(f"missing required key {name!r}", path))
            failed = True
    if failed:
        return _FAILED
    try:
        record = kind.cls(**kwargs)
        check = getattr(record, "check", None)
        if check is not None:
            check()
    except Invalid as err:
        found.append(Invalid(err.problem, (*path, *err.path)))
        return _FAILED
    return record


def _config_error(err: Invalid, located: Located, filename: str) -> ConfigError:
    key = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in err.path)
    key = key.replace(".[", "[")
    return ConfigError(err.problem, path=filename, line=located.line_of(err.path), key=key or None)
