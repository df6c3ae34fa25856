"""The gateway's one-line summaries of what it found at start and left running at stop.

Pure functions of the counts, so the wording (one plural rule,
:func:`scope.foundation.text.plural`) is tested without booting a gateway.
"""

from __future__ import annotations

from scope.foundation.text import plural


def adopted(running: int, finished: int, lost: int) -> str:
    """``adopted 1 running worker, 0 finished while nobody watched, 0 lost``."""
    return (
        f"adopted {plural(running, 'running worker')}, {finished} finished while nobody "
        f"watched, {lost} lost"
    )


def stopping(kept: int) -> str:
    """``stopping; 1 worker keeps running in its own scope or session``."""
    if kept == 1:
        return "stopping; 1 worker keeps running in its own scope or session"
    return f"stopping; {kept} workers keep running in their own scopes or sessions"


def degraded_lost(count: int, names: str) -> str:
    """The warning for degraded workers a stopping unit takes down with it."""
    verb = "is" if count == 1 else "are"
    return (
        f"{plural(count, 'degraded (unscoped) worker')} {verb} lost when this unit stops, "
        f"unless its KillMode=process: {names}"
    )
