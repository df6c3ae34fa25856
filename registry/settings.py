"""The ``registry:`` section of config.yaml."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from scope.foundation.schema import Bool, Duration, Int, Invalid, Kind, ListOf, Size, setting


class Regex(Kind):
    """A regular expression (Python syntax), checked by compiling it."""

    label = "regular expression"

    def convert(self, value: Any) -> Any:
        if not isinstance(value, str) or not value:
            raise Invalid(f"expected a regular expression, got {value!r}")
        try:
            re.compile(value)
        except re.error as err:
            raise Invalid(f"invalid regular expression {value!r}: {err}") from None
        return value


@dataclass(frozen=True, kw_only=True)
class RegistrySettings:
    """Output capture, kill, retention and event limits for every launched process."""

    tail_chars: int = setting(
        200_000,
        kind=Int(min=1000),
        doc="Characters of recent output each session keeps in memory (the rest is in its log).",
    )
    max_log_bytes: int = setting(
        256 * 1024**2,
        kind=Size(min=4096),
        doc="Per-session log cap: beyond it the head is kept and later output is counted and "
        "dropped with a marker in the log.",
    )
    kill_grace: float = setting(
        2.0,
        kind=Duration(min=0),
        doc="Seconds between SIGTERM and SIGKILL when killing a session.",
    )
    drain_time: float = setting(
        5.0,
        kind=Duration(min=0),
        doc="After the worker exits, how long its keeper keeps capturing output that "
        "descendants still write (the exit is recorded at once; this only bounds the capture).",
    )
    finished_ttl: float = setting(
        7 * 86400.0,
        kind=Duration(min=0),
        doc="How long a finished session stays listed before pruning (from finished_at).",
    )
    log_retention: float = setting(
        14 * 86400.0,
        kind=Duration(min=0),
        doc="Minimum age before the log of a session still referenced by kanban or cron "
        "history may be deleted.",
    )
    max_sessions: int = setting(
        10_000,
        kind=Int(min=10),
        doc="Cap on finished sessions kept; the oldest finished beyond it are pruned first.",
    )
    prune_interval: float = setting(
        3600.0,
        kind=Duration(min=1),
        doc="How often a long-running process sweeps finished sessions.",
    )
    output_chars: int = setting(
        2000,
        kind=Int(min=0),
        doc="Characters of output carried by completion events and wait/kill snapshots "
        "(per-session override at spawn).",
    )
    max_pending_events: int = setting(
        10_000,
        kind=Int(min=10),
        doc="Cap on stored events; the oldest acknowledged events are dropped first.",
    )
    max_unacked_events: int = setting(
        50_000,
        kind=Int(min=10),
        doc="Hard cap on stored unacknowledged events: beyond it (and beyond "
        "max_pending_events) the oldest unacknowledged ones are dropped, with a warning in "
        "the log.",
    )
    fork_server: bool = setting(
        True,
        kind=Bool(),
        doc="Start keepers from a fork server (one warm interpreter, forked for each keeper) "
        "in 'dispatch serve' and in a 'dispatch kanban tick' that may start many workers; "
        "false: a fresh interpreter for every keeper. Either way a keeper behaves the same, "
        "and a spawn the fork server cannot take starts the usual way.",
    )
    redact: bool = setting(
        True,
        kind=Bool(),
        doc="Mask common secret shapes (API keys, bearer tokens, password=/token= "
        "assignments, passwords in URLs) in every output handed to a program; "
        "'dispatch logs' stays raw unless --redact.",
    )
    redact_patterns: tuple[str, ...] = setting(
        (),
        kind=ListOf(Regex()),
        doc="Extra regular expressions whose matches are masked like the built-in secret shapes.",
    )
    watch_cooldown: float = setting(
        15.0,
        kind=Duration(min=0),
        doc="After a watch event, further matches of the same session within this time are "
        "suppressed (and counted).",
    )
    watch_strikes: int = setting(
        3,
        kind=Int(min=1),
        doc="Cooldown windows with suppressed matches before a session's watch is disabled "
        "(it then falls back to notify-on-complete).",
    )
    watch_max_deliveries: int = setting(
        8,
        kind=Int(min=1),
        doc="Watch events per session in its lifetime; then watching stops and the session "
        "falls back to notify-on-complete.",
    )
    watch_global_limit: int = setting(
        30,
        kind=Int(min=1),
        doc="Watch events per minute across all sessions; beyond it the global breaker "
        "suppresses (and counts) further matches until the minute has passed.",
    )
