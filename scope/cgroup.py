"""Facts about cgroup v2 read from /proc and the cgroup2 filesystem.

This module only reads: where cgroup2 is mounted, which cgroup a process is in, which processes a
cgroup holds, and which unit a cgroup path belongs to. It never creates, writes or kills anything,
and it imports nothing of ours, so every layer (scope, registry, tests) may use it.

cgroup2 is not always at ``/sys/fs/cgroup``: hybrid hosts mount it at ``/sys/fs/cgroup/unified``
next to the v1 controllers, and containers may mount it elsewhere. The mount point is therefore read
from mountinfo, never assumed.

Errors are the standard library's: ``OSError`` (for example ``ProcessLookupError`` or
``FileNotFoundError``) when /proc cannot be read, ``LookupError`` when a fact is absent (no cgroup2
mount, no v2 line), ``ValueError`` for malformed input. The scope layer translates them into its own
error tree at its boundary.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = [
    "UNIT_SUFFIXES",
    "MountInfoEntry",
    "cgroup2_mount",
    "cgroup_procs",
    "enclosing_unit",
    "leaf_unit",
    "own_cgroup",
    "parse_mountinfo",
    "unescape_mountinfo",
]

#: Unit types that own a cgroup (systemd.unit(5)); other types (targets, timers, paths, devices)
#: never appear as a cgroup path component.
UNIT_SUFFIXES: tuple[str, ...] = (".service", ".scope", ".slice", ".socket", ".mount", ".swap")

# mountinfo escapes space, tab, newline and backslash as three octal digits (fs/proc_namespace.c
# uses seq_escape with " \t\n\\"); decoding any \ooo keeps us correct if the set ever grows.
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")

# The fields before the optional tagged fields: mount id, parent id, major:minor, root, mount point,
# mount options.
_FIXED_FIELDS = 6


@dataclass(frozen=True, kw_only=True)
class MountInfoEntry:
    """One line of ``/proc/PID/mountinfo`` (proc(5)), with paths unescaped."""

    mount_id: int
    parent_id: int
    root: str
    mount_point: Path
    fstype: str
    source: str
    super_options: str


def unescape_mountinfo(field: str) -> str:
    r"""Decode the octal escapes (``\040`` for a space, ...) that mountinfo uses inside fields."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[MountInfoEntry]:
    """Parse mountinfo text into entries, in file order.

    The number of optional fields varies (``shared:1 master:2`` or none); they end at a lone ``-``,
    after which come the filesystem type, the source and the super options. Blank lines are ignored;
    a line without the separator or with too few fields raises ``ValueError``.
    """
    entries: list[MountInfoEntry] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        try:
            separator = fields.index("-", _FIXED_FIELDS)
        except ValueError:
            raise ValueError(f"mountinfo line {lineno} has no ' - ' separator: {line!r}") from None
        tail = fields[separator + 1 :]
        if len(tail) < 2:
            raise ValueError(f"mountinfo line {lineno} is truncated after ' - ': {line!r}")
        entries.append(
            MountInfoEntry(
                mount_id=int(fields[0]),
                parent_id=int(fields[1]),
                root=unescape_mountinfo(fields[3]),
                mount_point=Path(unescape_mountinfo(fields[4])),
                fstype=tail[0],
                source=unescape_mountinfo(tail[1]),
                super_options=tail[2] if len(tail) > 2 else "",
            )
        )
    return entries


def cgroup2_mount(mountinfo_path: str | Path = "/proc/self/mountinfo") -> Path | None:
    """Return where the cgroup2 hierarchy is mounted, or ``None`` when it is not mounted.

    A mount of the hierarchy's root (mountinfo root ``/``) is preferred over a bind mount of a
    subtree, because only there does ``<mount><cgroup path>`` name the cgroup a process reports in
    ``/proc/PID/cgroup``. When the same point is mounted over, the last (visible) entry wins.
    """
    text = Path(mountinfo_path).read_text(encoding="utf-8", errors="surrogateescape")
    candidates = [e for e in parse_mountinfo(text) if e.fstype == "cgroup2"]
    if not candidates:
        return None
    whole = [e for e in candidates if e.root == "/"]
    chosen = whole or candidates
    # Later lines are mounted later; a later mount at the same point hides the earlier one, so
    # prefer the last root mount rather than the first.
    return chosen[-1].mount_point


def own_cgroup(pid: int | str = "self", *, proc_root: str | Path = "/proc") -> str:
    """Return the cgroup v2 path of a process (``"self"`` by default), e.g. ``/app.slice/x.scope``.

    It is the ``0::`` line of ``/proc/PID/cgroup``. Raises ``LookupError`` when the host has no
    v2 line (a pure v1 host), and ``OSError`` when the process does not exist. ``proc_root``
    exists for tests and for a procfs mounted elsewhere.
    """
    proc = Path(proc_root) / _proc_name(pid)
    text = (proc / "cgroup").read_text(encoding="utf-8", errors="surrogateescape")
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise LookupError(f"{proc}/cgroup has no cgroup v2 ('0::') line")


def cgroup_procs(control_group: str, mount: Path | None = None) -> list[int]:
    """Return the pids in a cgroup (not its descendants), sorted.

    ``control_group`` is an absolute cgroup path as systemd's ``ControlGroup`` property or
    :func:`own_cgroup` report it. A cgroup that does not exist (the unit is gone) holds nothing, so
    the result is an empty list rather than an error. ``mount`` defaults to :func:`cgroup2_mount`;
    ``LookupError`` when there is none, because "no processes" could not be told from "cannot
    know".
    """
    if mount is None:
        mount = cgroup2_mount()
        if mount is None:
            raise LookupError("cgroup2 is not mounted (no cgroup2 entry in /proc/self/mountinfo)")
    procs_file = mount.joinpath(*_cgroup_parts(control_group), "cgroup.procs")
    try:
        text = procs_file.read_text(encoding="ascii")
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        # ENODEV: the cgroup was removed between open and read; it is as empty as a missing one.
        if exc.errno == errno.ENODEV:
            return []
        raise
    return sorted(int(word) for word in text.split())


def leaf_unit(cgroup_path: str) -> str | None:
    """Return the last component of a cgroup path when it names a unit, else ``None``.

    ``/app.slice/run-r1.scope`` gives ``run-r1.scope``; ``/`` and a delegated sub-cgroup such as
    ``/x.service/worker`` give ``None`` (see :func:`enclosing_unit` for the latter).
    """
    name = PurePosixPath(cgroup_path).name
    return name if _is_unit_name(name) else None


def enclosing_unit(cgroup_path: str) -> str | None:
    """Return the innermost unit that contains a cgroup path, looking through delegated subtrees.

    ``/x.service/worker`` gives ``x.service`` (stopping ``x.service`` kills ``worker`` too); a path
    with no unit component gives ``None``.
    """
    for name in reversed(PurePosixPath(cgroup_path).parts):
        if _is_unit_name(name):
            return name
    return None


def _is_unit_name(name: str) -> bool:
    """Whether a path component looks like ``<something>.<cgroup-owning unit type>``."""
    return any(name.endswith(suffix) and len(name) > len(suffix) for suffix in UNIT_SUFFIXES)


def _proc_name(pid: int | str) -> str:
    """The /proc entry for an int pid, a decimal string or ``"self"``; nothing else is accepted."""
    if isinstance(pid, bool):
        raise ValueError(f"not a pid: {pid!r}")
    if isinstance(pid, int):
        if pid <= 0:
            raise ValueError(f"not a pid: {pid!r}")
        return str(pid)
    # A string reaches a filesystem path; accept only what names a process, never "../x".
    if pid == "self" or (pid.isascii() and pid.isdigit() and int(pid) > 0):
        return pid
    raise ValueError(f"not a pid: {pid!r}")


def _cgroup_parts(control_group: str) -> tuple[str, ...]:
    """Split an absolute cgroup path into parts, refusing any that could leave the mount."""
    if not control_group.startswith("/"):
        raise ValueError(f"cgroup path must be absolute: {control_group!r}")
    parts = PurePosixPath(control_group).parts[1:]
    if any(part in (".", "..") for part in parts) or "\0" in control_group:
        raise ValueError(f"cgroup path must not contain '.', '..' or NUL: {control_group!r}")
    return parts
