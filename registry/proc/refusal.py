"""Refuse worker commands that would kill the gateway by name (``pkill python3`` and friends).

When the registry runs inside the gateway (``dispatch serve``), an agent's worker that runs
``pkill -f 'dispatch serve'`` or ``killall python`` would take down the process supervising
it. The check judges *words*, the way the kill tools themselves will: it finds each simple
command (through ``sh -c`` strings, ``sudo``/``env``/``timeout``-style wrappers and ``eval``),
reads the kill tool's own options, and applies its pattern to the gateway's names and command
lines. A regex over the whole line would refuse ``grep pkill notes.txt`` and miss
``sh -c "x=1; pkill  -9 python3"``. Targets that do not match the gateway stay killable.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = ["GatewayIdentity", "gateway_kill_reason"]

_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "busybox-sh"}
_OPERATORS = {";", "&&", "||", "|", "&", "(", ")", "\n", ";;", "|&", "`", "$("}
_MAX_DEPTH = 4
# Wrappers that run their operand as a command: name -> options that take a value.
_WRAPPERS: dict[str, set[str]] = {
    "sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "--user", "--group"},
    "doas": {"-u", "-C"},
    "env": {"-u", "-C", "-S", "--unset", "--chdir"},
    "nohup": set(),
    "exec": {"-a"},
    "command": set(),
    "builtin": set(),
    "time": {"-f", "-o"},
    "nice": {"-n", "--adjustment"},
    "ionice": {"-c", "-n", "-p", "-P", "-u"},
    "chrt": set(),
    "setsid": set(),
    "stdbuf": {"-i", "-o", "-e"},
    "timeout": {"-s", "-k", "--signal", "--kill-after"},
    "xargs": {"-a", "-d", "-E", "-e", "-I", "-i", "-L", "-l", "-n", "-P", "-s"},
    "busybox": set(),
    "flock": {"-w", "-E", "-c"},
    "watch": {"-n", "-d"},
}
_PKILL_VALUE_OPTS = {
    "-g", "-G", "-P", "-s", "-t", "-u", "-U", "-F", "-r", "-q", "--signal", "--pgroup",
    "--group", "--parent", "--session", "--terminal", "--euid", "--uid", "--pidfile",
    "--runstates", "--ns", "--nslist", "--queue", "--env", "--cgroup",
}  # fmt: skip
_KILLALL_VALUE_OPTS = {"-s", "--signal", "-u", "--user", "-y", "-o", "--younger-than",
                       "--older-than", "-n", "--ns", "-Z", "--context"}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class GatewayIdentity:
    """What a kill-by-name command could use to hit the gateway process."""

    pid: int
    pgrp: int
    uid: int
    user: str
    names: frozenset[str]
    """Process names (``comm``, the interpreter's names, ``dispatch``)."""
    cmdlines: tuple[str, ...]
    """Full command lines (this process's own and the usual ways to start the gateway)."""

    @classmethod
    def current(cls) -> GatewayIdentity:
        """The identity of the running process (the gateway when called from it)."""
        names = {"python", "python3", f"python3.{sys.version_info.minor}", "dispatch"}
        cmdlines = ["dispatch serve", "python3 -m dispatcher serve", "python -m dispatcher serve"]
        try:
            with open("/proc/self/comm", encoding="utf-8", errors="replace") as f:
                names.add(f.read().strip())
            with open("/proc/self/cmdline", "rb") as f:
                raw = f.read().rstrip(b"\0").split(b"\0")
            cmdlines.insert(0, " ".join(part.decode(errors="replace") for part in raw))
        except OSError:
            pass
        for exe in (
            sys.executable,
            os.path.realpath(sys.executable),
            sys.argv[0] if sys.argv else "",
        ):
            if exe:
                names.add(os.path.basename(exe))
        uid = os.getuid()
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        return cls(
            pid=os.getpid(),
            pgrp=os.getpgrp(),
            uid=uid,
            user=user,
            names=frozenset(n for n in names if n),
            cmdlines=tuple(cmdlines),
        )


def gateway_kill_reason(argv: Sequence[str], gateway: GatewayIdentity) -> str | None:
    """Why running ``argv`` would kill the gateway, or None when it would not."""
    for command in _simple_commands(list(argv), 0):
        reason = _judge(command, gateway)
        if reason is not None:
            return reason
    return None


# -- finding the commands ----------------------------------------------------------------------


def _simple_commands(words: list[str], depth: int) -> Iterator[list[str]]:
    """The commands ``words`` runs: itself, unwrapped, and what its shell strings run."""
    if depth > _MAX_DEPTH:
        return
    words = _strip_assignments(words)
    while words:
        name = os.path.basename(words[0])
        if name in _SHELLS:
            script = _shell_script(words)
            if script is not None:
                for part in _split_script(script):
                    yield from _simple_commands(part, depth + 1)
            return
        if name == "eval":
            for part in _split_script(" ".join(words[1:])):
                yield from _simple_commands(part, depth + 1)
            return
        if name in _WRAPPERS:
            words = _unwrap(words, _WRAPPERS[name])
            continue
        yield words
        return


def _strip_assignments(words: list[str]) -> list[str]:
    index = 0
    while index < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[index], re.S):
        index += 1
    return words[index:]


def _unwrap(words: list[str], value_opts: set[str]) -> list[str]:
    """The operand command of a wrapper (``timeout 5 pkill x`` -> ``pkill x``)."""
    name = os.path.basename(words[0])
    rest = words[1:]
    while rest:
        word = rest[0]
        if word == "--":
            rest = rest[1:]
            break
        if word.startswith("-") and word != "-":
            rest = rest[2:] if word in value_opts else rest[1:]
            continue
        if name == "env" and "=" in word:
            rest = rest[1:]
            continue
        break
    if name == "timeout" and rest:
        rest = rest[1:]  # the duration
    elif name in ("nice", "chrt") and rest and re.fullmatch(r"-?\d+", rest[0]):
        rest = rest[1:]
    elif name == "flock" and rest:
        rest = rest[1:]  # the lock file
    elif name == "watch":
        rest = _split_script(" ".join(rest))[0] if rest else []
    return rest


def _shell_script(words: list[str]) -> str | None:
    """The ``-c`` script of a shell invocation (``sh -ec 'x'``, ``bash -l -c x``)."""
    for index, word in enumerate(words[1:], start=1):
        if word.startswith("-") and not word.startswith("--") and "c" in word[1:]:
            return words[index + 1] if index + 1 < len(words) else None
        if not word.startswith("-") and not word.startswith("+"):
            return None  # a script file: not ours to read
    return None


def _split_script(script: str) -> list[list[str]]:
    """Simple commands of a shell script, split at operators, parentheses and newlines."""
    lexer = shlex.shlex(script.replace("$(", " ( ").replace("`", " ; "), posix=True,
                        punctuation_chars=";&|()\n")  # fmt: skip
    lexer.whitespace = " \t\r"
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    try:
        for word in lexer:
            if word in _OPERATORS or set(word) <= set(";&|()\n"):
                commands.append([])
            else:
                commands[-1].append(word)
    except ValueError:
        # An unbalanced quote: judge the words we could read rather than nothing.
        commands.append(script.split())
    return [c for c in commands if c]


# -- judging one command -----------------------------------------------------------------------


def _judge(command: list[str], gw: GatewayIdentity) -> str | None:
    name = os.path.basename(command[0])
    args = command[1:]
    if name == "pkill":
        return _judge_pkill(args, gw, shlex.join(command))
    if name == "killall":
        return _judge_killall(args, gw, shlex.join(command))
    if name == "killall5":
        return f"{shlex.join(command)!r} signals every process, the gateway included"
    if name == "kill":
        return _judge_kill(args, gw, shlex.join(command))
    return None


def _judge_pkill(args: list[str], gw: GatewayIdentity, text: str) -> str | None:
    full = exact = ignore_case = False
    patterns: list[str] = []
    selectors: dict[str, str] = {}
    signal_zero = False
    index = 0
    while index < len(args):
        word = args[index]
        if word == "--":
            patterns.extend(args[index + 1 :])
            break
        if word in _PKILL_VALUE_OPTS or (word.startswith("--") and "=" in word):
            key, _, inline = word.partition("=")
            value = inline if inline else (args[index + 1] if index + 1 < len(args) else "")
            selectors[key] = value
            index += 1 if inline else 2
            continue
        if word.startswith("--"):
            full |= word == "--full"
            exact |= word == "--exact"
            ignore_case |= word == "--ignore-case"
            index += 1
            continue
        if word.startswith("-") and len(word) > 1:
            body = word[1:]
            if body.isdigit() or body.upper().removeprefix("SIG") in _SIGNAL_NAMES:
                signal_zero = body == "0"
            else:
                full |= "f" in body
                exact |= "x" in body
                ignore_case |= "i" in body
            index += 1
            continue
        patterns.append(word)
        index += 1
    if signal_zero or selectors.get("--signal") == "0":
        return None
    flags = re.IGNORECASE if ignore_case else 0
    for pattern in patterns:
        subjects = gw.cmdlines if full else tuple(n[:15] for n in gw.names)
        hit = _matches(pattern, subjects, exact=exact, flags=flags)
        if hit is not None:
            what = "command line" if full else "process name"
            return f"{text!r} matches the gateway's {what} {hit!r}"
    if not patterns and _selects_us(selectors, gw):
        return f"{text!r} selects the gateway's own processes"
    return None


def _judge_killall(args: list[str], gw: GatewayIdentity, text: str) -> str | None:
    regex = ignore_case = False
    names: list[str] = []
    user: str | None = None
    index = 0
    while index < len(args):
        word = args[index]
        if word in _KILLALL_VALUE_OPTS:
            if word in ("-u", "--user") and index + 1 < len(args):
                user = args[index + 1]
            index += 2
            continue
        if word.startswith("-") and len(word) > 1:
            body = word.lstrip("-")
            if body.upper().removeprefix("SIG") not in _SIGNAL_NAMES and not body.isdigit():
                regex |= body in ("r", "regexp") or ("r" in body and not word.startswith("--"))
                ignore_case |= body in ("I", "ignore-case") or "I" in body
            index += 1
            continue
        names.append(word)
        index += 1
    for name in names:
        if regex:
            flags = re.IGNORECASE if ignore_case else 0
            hit = _matches(name, tuple(gw.names), exact=False, flags=flags)
        else:
            base = os.path.basename(name)
            hit = next(
                (n for n in gw.names if n == base or (ignore_case and n.lower() == base.lower())),
                None,
            )
        if hit is not None:
            return f"{text!r} matches the gateway's process name {hit!r}"
    if not names and user is not None and user in (gw.user, str(gw.uid)):
        return f"{text!r} signals every process of {user}, the gateway included"
    return None


def _judge_kill(args: list[str], gw: GatewayIdentity, text: str) -> str | None:
    targets: list[str] = []
    index = 0
    while index < len(args):
        word = args[index]
        if word in ("-s", "-n", "--signal"):
            index += 2
            continue
        if word in ("-l", "-L", "--list", "--table"):
            return None
        if word == "--":
            targets.extend(args[index + 1 :])
            break
        if word.startswith("-") and not re.fullmatch(r"-\d+", word):
            index += 1
            continue
        if re.fullmatch(r"-\d+", word) and not targets and index == 0 and len(args) > 1:
            index += 1  # `kill -9 PID`: a signal number, not a process group
            continue
        targets.append(word)
        index += 1
    for target in targets:
        if target in (str(gw.pid), "-1", f"-{gw.pgrp}"):
            return f"{text!r} signals the gateway's process (or every process)"
    return None


def _matches(pattern: str, subjects: Sequence[str], *, exact: bool, flags: int) -> str | None:
    try:
        compiled = re.compile(pattern, flags)
    except re.error:
        needle = pattern.lower() if flags & re.IGNORECASE else pattern
        for subject in subjects:
            hay = subject.lower() if flags & re.IGNORECASE else subject
            if (hay == needle) if exact else (needle in hay):
                return subject
        return None
    for subject in subjects:
        if (compiled.fullmatch(subject) if exact else compiled.search(subject)) is not None:
            return subject
    return None


def _selects_us(selectors: dict[str, str], gw: GatewayIdentity) -> bool:
    for key, value in selectors.items():
        values = set(value.split(","))
        if key in ("-u", "-U", "--euid", "--uid") and values & {gw.user, str(gw.uid)}:
            return True
        if key in ("-g", "--pgroup", "-s", "--session") and values & {str(gw.pgrp), "0"}:
            return True
    return False


_SIGNAL_NAMES = {
    "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "IOT", "BUS", "FPE", "KILL", "USR1", "SEGV",
    "USR2", "PIPE", "ALRM", "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU",
    "URG", "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO", "POLL", "PWR", "SYS",
}  # fmt: skip
