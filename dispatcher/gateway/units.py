"""Checks of installed dispatch units for ``dispatch doctor`` (its ``units`` key).

A unit file can quietly undo restart safety: a oneshot tick that degrades with the default
``KillMode=control-group`` kills its workers the moment the tick exits; a user manager without
linger is gone when its user logs out; a system service with ``User=`` must find that user's
runtime dir. These are read from the unit files themselves (``dispatch*.service`` in the usual
systemd search paths, or files named with ``--unit``), so the check works even when no manager
is reachable. Drop-ins are not merged; the report says which file it read.
"""

from __future__ import annotations

import errno
import os
import pwd
import shlex
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LINGER_DIR = Path("/var/lib/systemd/linger")


@dataclass(frozen=True, kw_only=True)
class UnitFile:
    """A unit file and which manager would load it."""

    path: Path
    manager: str
    """``user`` or ``system``."""


def search_dirs(environ: Mapping[str, str]) -> list[UnitFile]:
    """The directories systemd reads units from, for both managers (as placeholders)."""
    home = Path(environ.get("HOME") or Path.home())
    config = environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    user = [
        Path(config) / "systemd/user",
        Path("/etc/systemd/user"),
        Path("/usr/lib/systemd/user"),
        Path("/lib/systemd/user"),
    ]
    system = [
        Path("/etc/systemd/system"),
        Path("/usr/lib/systemd/system"),
        Path("/lib/systemd/system"),
    ]
    return [UnitFile(path=p, manager="user") for p in user] + [
        UnitFile(path=p, manager="system") for p in system
    ]


def find_units(environ: Mapping[str, str]) -> list[UnitFile]:
    """Installed ``dispatch*.service`` files; the first of each name wins, as in systemd."""
    seen: set[tuple[str, str]] = set()
    found = []
    for place in search_dirs(environ):
        try:
            candidates = sorted(place.path.glob("dispatch*.service"))
        except OSError:
            continue
        for path in candidates:
            key = (place.manager, path.name)
            if key in seen or not path.is_file():
                continue
            seen.add(key)
            found.append(UnitFile(path=path, manager=place.manager))
    return found


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """``{section: {key: [values...]}}`` (repeated keys accumulate, as ``Environment=`` does;
    an empty assignment resets the list, as systemd does)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        if current is None or "=" not in line:
            continue
        key, value = (part.strip() for part in line.split("=", 1))
        if value == "":
            current[key] = []
        else:
            current.setdefault(key, []).append(value)
    return sections


def _environment(values: Iterable[str]) -> dict[str, str]:
    env = {}
    for value in values:
        try:
            words = shlex.split(value)
        except ValueError:
            words = value.split()
        for word in words:
            name, sep, val = word.partition("=")
            if sep:
                env[name] = val
    return env


def _role(exec_start: str) -> str:
    words = exec_start.split()
    if "serve" in words:
        return "serve"
    if "kanban" in words and "tick" in words:
        return "kanban-tick"
    return "other"


def _lingers(user: str) -> bool:
    return (LINGER_DIR / user).exists()


def inspect_unit(
    unit: UnitFile, *, degrade_without_scope: bool, current_user: str
) -> dict[str, Any]:
    """The checks that matter for one unit file, with a remedy for each failed one."""
    try:
        sections = parse_unit(_read_unit(unit.path))
    except (OSError, UnicodeDecodeError) as err:
        return {
            "name": unit.path.name,
            "path": str(unit.path),
            "manager": unit.manager,
            "role": "unknown",
            "ok": False,
            "checks": {"readable": {"ok": False, "value": None, "detail": str(err)}},
            "remedies": [],
        }
    service = sections.get("Service", {})
    exec_start = " ".join(service.get("ExecStart", []))
    role = _role(exec_start)
    kill_mode = (service.get("KillMode") or ["control-group"])[-1]
    unit_type = (service.get("Type") or ["simple"])[-1]
    user = (service.get("User") or [current_user])[-1]
    env = _environment(service.get("Environment", []))
    checks: dict[str, dict[str, Any]] = {}
    remedies: list[str] = []

    _kill_mode_check(unit, role, kill_mode, degrade_without_scope, checks, remedies)

    if role == "serve":
        ok = unit_type == "notify"
        checks["type"] = {
            "ok": ok,
            "value": unit_type,
            "detail": "READY=1 is sent after adoption"
            if ok
            else "systemd will not wait for adoption before calling the gateway started",
        }
        if not ok:
            remedies.append(f"{unit.path.name}: set Type=notify")
        _restart_check(unit, service, checks, remedies)

    _exec_checks(unit, service, user, checks, remedies)
    lingering = _lingers(user)
    checks["linger"] = {
        "ok": lingering,
        "value": user,
        "detail": f"{user}'s systemd manager runs without a login session"
        if lingering
        else f"{user}'s systemd manager (and the scopes it holds) stops at logout",
    }
    if not lingering:
        # Same wording as the scope layer's remedy, so doctor lists it once.
        remedies.append(
            f"run 'loginctl enable-linger {user}' so the user manager runs without a login"
        )

    _runtime_dir_check(unit, env, user, checks, remedies)
    return {
        "name": unit.path.name,
        "path": str(unit.path),
        "manager": unit.manager,
        "role": role,
        "ok": all(check["ok"] for check in checks.values()),
        "checks": checks,
        "remedies": remedies,
    }


def _restart_check(
    unit: UnitFile,
    service: dict[str, list[str]],
    checks: dict[str, dict[str, Any]],
    remedies: list[str],
) -> None:
    """A serve unit that restarts must not restart on 1 and 2 (permanent until someone acts:
    a bad config, a missing module, an unusable state dir; see dispatcher.gateway.exits)."""
    restart = (service.get("Restart") or ["no"])[-1]
    if restart == "no":
        return
    prevented = set(" ".join(service.get("RestartPreventExitStatus", [])).split())
    ok = {"1", "2"} <= prevented
    checks["restart"] = {
        "ok": ok,
        "value": f"Restart={restart} RestartPreventExitStatus={' '.join(sorted(prevented))}",
        "detail": "restarts only when serve asks (exit 75) or crashes"
        if ok
        else "restarts forever on errors a restart cannot fix (exit 1 and 2)",
    }
    if not ok:
        remedies.append(f"{unit.path.name}: add RestartPreventExitStatus=1 2")


def _kill_mode_check(
    unit: UnitFile,
    role: str,
    kill_mode: str,
    degrade_without_scope: bool,
    checks: dict[str, dict[str, Any]],
    remedies: list[str],
) -> None:
    """A tick that starts degraded workers must not kill them with its cgroup."""
    if role == "kanban-tick" and degrade_without_scope and kill_mode == "control-group":
        checks["kill_mode"] = {
            "ok": False,
            "value": kill_mode,
            "detail": "degraded kanban workers die as soon as the tick's unit ends",
        }
        remedies.append(
            f"{unit.path.name}: set KillMode=process so degraded workers outlive "
            "the tick, or make scopes work (see linger)"
        )
    else:
        detail = (
            "unscoped (degraded) children die when the unit stops; scoped workers survive"
            if kill_mode in ("control-group", "mixed")
            else "processes left in the unit survive its stop"
        )
        checks["kill_mode"] = {"ok": True, "value": kill_mode, "detail": detail}


def _runtime_dir_check(
    unit: UnitFile,
    env: dict[str, str],
    user: str,
    checks: dict[str, dict[str, Any]],
    remedies: list[str],
) -> None:
    """A system service names the user manager's runtime dir; a user unit gets it."""
    runtime = env.get("XDG_RUNTIME_DIR")
    if unit.manager == "user":
        checks["runtime_dir"] = {
            "ok": True,
            "value": runtime,
            "detail": "the user manager sets XDG_RUNTIME_DIR",
        }
    else:
        try:
            uid = pwd.getpwnam(user).pw_uid
        except KeyError:
            uid = None
        fallback = f"/run/user/{uid}" if uid is not None else "/run/user/<uid>"
        exported = runtime is not None
        checks["runtime_dir"] = {
            "ok": exported,
            "value": runtime,
            "detail": f"exported as {runtime}"
            if exported
            else f"not exported; dispatch falls back to {fallback}, which exists only while "
            f"{user}'s manager runs",
        }
        if not exported:
            remedies.append(
                f"{unit.path.name}: add Environment=XDG_RUNTIME_DIR={fallback} and "
                f"Environment=DBUS_SESSION_BUS_ADDRESS=unix:path={fallback}/bus"
            )


def _exec_checks(
    unit: UnitFile,
    service: dict[str, list[str]],
    user: str,
    checks: dict[str, dict[str, Any]],
    remedies: list[str],
) -> None:
    """ExecStart='s program exists; a gateway's ExecReload= reports the reload's verdict."""
    words = _command_words((service.get("ExecStart") or [""])[-1])
    program = _expand(words[0], user) if words else ""
    found = _executable(program)
    checks["exec_start"] = {
        "ok": found is not None,
        "value": program or None,
        "detail": f"runs {found}" if found else f"{program or 'no program'}: no such executable",
    }
    if found is None:
        remedies.append(
            f"{unit.path.name}: ExecStart= names {program or 'nothing'}, which does not exist; "
            "point it at your dispatch (the quick start installs ~/.local/bin/dispatch)"
        )
    if _role(" ".join(words)) != "serve":
        return
    reload = " ".join(service.get("ExecReload", []))
    waits = "reload" in _command_words(reload)
    checks["exec_reload"] = {
        "ok": waits,
        "value": reload or None,
        "detail": "systemctl reload waits for the verdict and fails for a rejected config"
        if waits
        else "systemctl reload reports success even when the gateway rejects the config",
    }
    if not waits:
        remedies.append(
            f"{unit.path.name}: set ExecReload=<your dispatch> reload --pid $MAINPID so a "
            "rejected config makes the reload fail"
        )


def _command_words(value: str) -> list[str]:
    """A command line's words without systemd's prefixes (``-``, ``@``, ``:``, ``+``, ``!``)."""
    try:
        words = shlex.split(value)
    except ValueError:
        words = value.split()
    if words:
        words[0] = words[0].lstrip("-@:+!")
    return words


def _expand(program: str, user: str) -> str:
    """``%h``/``%u``/``%U`` (the specifiers a unit's ExecStart= usually has)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return program
    return (
        program.replace("%h", entry.pw_dir)
        .replace("%u", entry.pw_name)
        .replace("%U", str(entry.pw_uid))
        .replace("%%", "%")
    )


def _executable(program: str) -> str | None:
    if not program:
        return None
    if "/" in program:
        return program if os.access(program, os.X_OK) and Path(program).is_file() else None
    # systemd looks a bare name up in its own fixed search path.
    return shutil.which(program, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin")


def units_report(
    environ: Mapping[str, str],
    *,
    degrade_without_scope: bool,
    extra: Sequence[Path] = (),
) -> list[dict[str, Any]]:
    """Checks for every installed dispatch unit plus the files in ``extra``."""
    current = _current_user()
    units = [UnitFile(path=Path(p), manager=_guess_manager(Path(p))) for p in extra]
    units += [u for u in find_units(environ) if u.path not in {x.path for x in units}]
    return [
        inspect_unit(u, degrade_without_scope=degrade_without_scope, current_user=current)
        for u in units
    ]


def _guess_manager(path: Path) -> str:
    """Which manager a unit file named on the command line is meant for: by its directory
    when that is a systemd one, else by its content (User= or multi-user.target: system)."""
    where = str(path.resolve().parent)
    if "/systemd/user" in where:
        return "user"
    if "/systemd/system" in where:
        return "system"
    try:
        sections = parse_unit(_read_unit(path))
    except (OSError, UnicodeDecodeError):
        return "user"
    wanted = " ".join(sections.get("Install", {}).get("WantedBy", []))
    if sections.get("Service", {}).get("User") or "multi-user.target" in wanted:
        return "system"
    return "user"


MAX_UNIT_BYTES = 1024 * 1024


def _read_unit(path: Path) -> str:
    """A unit file's text, at most 1 MiB (``--unit /dev/zero`` must not read forever);
    OSError or UnicodeDecodeError otherwise."""
    with open(path, "rb") as handle:
        raw = handle.read(MAX_UNIT_BYTES + 1)
    if len(raw) > MAX_UNIT_BYTES:
        raise OSError(errno.EFBIG, "larger than 1 MiB; not a unit file", str(path))
    return raw.decode("utf-8")


def _current_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
