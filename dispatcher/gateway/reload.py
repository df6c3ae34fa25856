"""Reloading a running gateway and learning whether the new config was taken.

``systemctl reload`` on systemd 252 has no ``Type=notify-reload``: a plain
``ExecReload=/bin/kill -HUP $MAINPID`` returns at once and reports success even when the gateway
rejected the file. ``dispatch reload`` (the unit's ``ExecReload=``) closes that gap:

1. it finds the gateway of the state dir through the serve lock (pid and kernel start time) and
   signals SIGHUP only when that identity still holds (through a pidfd);
2. the gateway records every reload's outcome in ``reload.json`` (its pid, a generation number,
   when it began, ok or the error), written atomically as soon as the reload is decided;
3. the command waits, bounded, for a record that the gateway began after the signal was sent and
   exits 0 when the config was applied, 2 with the gateway's reason when it was rejected (the
   old config stays in effect), 1 when no gateway answered.

With ``Type=notify-reload`` (systemd 253 and later) the manager signals the gateway itself and
waits for ``RELOADING=1`` ... ``READY=1``, which the gateway sends for every reload; only the
verdict needs this command, so the unit keeps ``ExecReload=dispatch reload`` either way.
"""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dispatcher.errors import GatewayError
from dispatcher.gateway.lock import Holder, read_holder
from dispatcher.gateway.statusfile import read_json, write_json
from scope.foundation.clock import Clock, SystemClock

RELOAD_NAME = "reload.json"
POLL_INTERVAL = 0.05
"""Seconds between looks at ``reload.json`` while waiting for the verdict."""


@dataclass(frozen=True, kw_only=True)
class ReloadRecord:
    """The outcome of one reload of a running gateway."""

    pid: int
    generation: int
    """1 for the first reload of this gateway process, then counting."""
    started_at: float
    finished_at: float
    ok: bool
    source: str
    """The config file re-read (or "built-in defaults")."""
    error: str | None = None
    """Why the new config was rejected (the one-line config error)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape (``reload.json``; times as epoch seconds)."""
        return asdict(self)


class ReloadRejected(GatewayError):
    """The gateway refused the new config and keeps the old one (exit 2, a config error)."""

    exit_code = 2

    def __init__(self, record: ReloadRecord) -> None:
        super().__init__(
            remedy="fix the file (dispatch config check FILE), then reload again",
            pid=record.pid,
            problem=record.error or "rejected",
        )

    def describe(self) -> str:
        return (
            f"reload rejected by dispatch serve (pid {self.fields['pid']}), the old config stays "
            f"in effect: {self.fields['problem']}"
        )


def write_reload(state_dir: Path, record: ReloadRecord) -> None:
    """Replace ``reload.json`` atomically (the gateway, right after deciding a reload)."""
    write_json(Path(state_dir) / RELOAD_NAME, record.to_dict())


def read_reload(state_dir: Path, pid: int | None = None) -> ReloadRecord | None:
    """The last reload recorded (by gateway ``pid`` when given), or None."""
    raw = read_json(Path(state_dir) / RELOAD_NAME)
    try:
        record = ReloadRecord(**raw) if isinstance(raw, dict) else None
    except TypeError:
        return None
    if record is None or (pid is not None and record.pid != pid):
        return None
    return record


def request_reload(
    state_dir: Path,
    *,
    timeout: float,
    expect_pid: int | None = None,
    clock: Clock | None = None,
) -> ReloadRecord:
    """SIGHUP the state dir's gateway and wait for its verdict (see the module docstring).

    Returns the record of an applied reload; raises :class:`ReloadRejected` for a rejected
    one and :class:`GatewayError` when no gateway runs, its identity does not hold, or it gave
    no verdict within ``timeout`` seconds."""
    holder = _confirmed_holder(state_dir, expect_pid)
    clock = clock or SystemClock()
    sent_at = clock.time()
    if not _send_hup(holder):
        raise GatewayError(f"dispatch serve (pid {holder.pid}) exited before it was signalled")
    deadline = clock.monotonic() + timeout
    while True:
        record = read_reload(state_dir, holder.pid)
        if record is not None and record.started_at >= sent_at:
            if not record.ok:
                raise ReloadRejected(record)
            return record
        current = read_holder(state_dir)
        if current is None or current.pid != holder.pid:
            raise GatewayError(
                f"dispatch serve (pid {holder.pid}) exited while reloading",
                remedy="see its log (journalctl --user -u dispatch.service)",
            )
        if clock.monotonic() >= deadline:
            raise GatewayError(
                f"dispatch serve (pid {holder.pid}) gave no reload verdict within {timeout:g} s",
                remedy="it may be busy; see 'dispatch status' and its log",
            )
        clock.sleep(POLL_INTERVAL)


def _confirmed_holder(state_dir: Path, expect_pid: int | None) -> Holder:
    from scope.foundation.procstat import start_time

    holder = read_holder(state_dir)
    if holder is None:
        raise GatewayError(
            f"no dispatch serve is running on {state_dir}",
            remedy="start it (systemctl --user start dispatch.service), or pass the --state-dir "
            "it uses",
        )
    if expect_pid is not None and expect_pid != holder.pid:
        raise GatewayError(
            f"the dispatch serve on {state_dir} is pid {holder.pid}, not pid {expect_pid}",
            remedy="give the unit's ExecReload= the same --state-dir as its ExecStart=",
        )
    if holder.start_ticks is None or start_time(holder.pid) != holder.start_ticks:
        # The lock is held, but by a process whose start time we cannot match: never signal.
        raise GatewayError(
            f"cannot confirm the identity of dispatch serve pid {holder.pid}; not signalled"
        )
    return holder


def _send_hup(holder: Holder) -> bool:
    from registry.proc import Identity, send

    assert holder.start_ticks is not None
    return send(Identity(pid=holder.pid, start=holder.start_ticks), signal.SIGHUP)
