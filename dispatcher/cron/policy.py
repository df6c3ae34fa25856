"""Pure decisions: which due occurrences run, which are missed or coalesced (catch-up), and
what a fire does while the job is still running (overlap). No I/O; the scheduler applies them.

A due occurrence is *on time* when it is at most ``on_time_grace`` late (the scheduler was up and
merely woke a little late); anything later fell in downtime and follows the job's ``catch_up``:

* ``latest``: the most recent late fire inside ``catch_up_window`` runs once (flagged catch-up);
  the older ones inside the window are ``coalesced``. When an on-time fire is due in the same
  batch it covers them all (they are ``coalesced`` into it, nothing extra runs).
* ``skip``: every late fire is ``missed``.
* ``all``: every late fire inside the window runs (flagged), at most ``catch_up_max`` of them, the
  most recent ones; older ones beyond the cap are ``missed``.

Late fires older than the window are ``missed`` under every policy. DST-gap fires folded into the
first fire of their gap are ``coalesced`` whatever else happens.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from dispatcher.cron.settings import CatchUpPolicy, OverlapPolicy
from dispatcher.cron.timeline import Occurrence, format_wall
from scope.foundation.schema import format_duration


class Verdict(enum.StrEnum):
    """What the catch-up rules make of one due occurrence."""

    RUN = "run"
    MISSED = "missed"
    COALESCED = "coalesced"


@dataclass(frozen=True, kw_only=True)
class Judged:
    """An occurrence with its verdict; ``note`` explains a non-run verdict."""

    occurrence: Occurrence
    verdict: Verdict
    catch_up: bool = False
    note: str | None = None


def judge(
    due: Sequence[Occurrence],
    *,
    now: float,
    catch_up: CatchUpPolicy,
    window: float,
    limit: int,
    grace: float,
) -> list[Judged]:
    """Apply the catch-up rules to the occurrences due at ``now`` (ordered by ``at``)."""
    out: list[Judged] = []
    live: list[int] = []
    inside: list[int] = []
    for index, occ in enumerate(due):
        late = now - occ.at
        if occ.coalesced:
            note = "DST gap: folded into the first fire of the same gap"
            out.append(Judged(occurrence=occ, verdict=Verdict.COALESCED, note=note))
            continue
        if late <= grace:
            live.append(index)
            out.append(Judged(occurrence=occ, verdict=Verdict.RUN))
            continue
        if late <= window:
            inside.append(index)
            note = "missed while the scheduler was down"
        else:
            note = f"missed while the scheduler was down (older than catch_up_window {_d(window)})"
        out.append(Judged(occurrence=occ, verdict=Verdict.MISSED, note=note))
    if not inside:
        return out
    if catch_up is CatchUpPolicy.LATEST:
        cover = live[0] if live else inside[-1]
        covered = f"covered by {format_wall(due[cover].wall)}"
        for index in inside:
            if index != cover:
                out[index] = Judged(occurrence=due[index], verdict=Verdict.COALESCED, note=covered)
        if not live:
            out[cover] = Judged(occurrence=due[cover], verdict=Verdict.RUN, catch_up=True)
    elif catch_up is CatchUpPolicy.ALL:
        keep = inside[-limit:] if limit > 0 else []
        beyond = f"missed: beyond catch_up_max ({limit})"
        for index in inside[: len(inside) - len(keep)]:
            out[index] = Judged(occurrence=due[index], verdict=Verdict.MISSED, note=beyond)
        for index in keep:
            out[index] = Judged(occurrence=due[index], verdict=Verdict.RUN, catch_up=True)
    return out


class OverlapAction(enum.StrEnum):
    """What a fire that should run does, given the job's open fires."""

    RUN = "run"
    QUEUE = "queue"
    SKIP = "skip"
    REPLACE = "replace"


def overlap_action(policy: OverlapPolicy, *, active: int, queued: int) -> OverlapAction:
    """The overlap rule: ``active`` fires of the job are running (or about to), ``queued`` wait.

    ``skip`` records the new fire ``skipped_overlap``; ``queue_one`` lets one fire wait (later
    ones are skipped); ``replace`` stops the running fire (recorded ``replaced``) and runs the
    new one; ``allow`` runs it alongside."""
    if active == 0 and queued == 0:
        return OverlapAction.RUN
    if policy is OverlapPolicy.ALLOW:
        return OverlapAction.RUN
    if policy is OverlapPolicy.REPLACE:
        return OverlapAction.REPLACE
    if policy is OverlapPolicy.QUEUE_ONE and queued == 0:
        return OverlapAction.QUEUE
    return OverlapAction.SKIP


def _d(seconds: float) -> str:
    return format_duration(seconds)
