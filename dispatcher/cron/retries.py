"""What a fire does after one of its tries ended: try again (when, and whether it counts), or
end with the try's outcome. A pure function of the row, the try's result, the job's retry
policy, an injected random source and the time; the fire runner writes the answer.

A fire's retries belong to it: the same row and fire key, the next try numbered on the row
(``attempt``; an uncounted retry repeats its number), every ended try kept in ``tries``. The
launch core's :func:`~dispatcher.launch.retry.decide` makes the policy's decision; cron adds
what only cron has:

* a fire without a retry policy (``attempts`` None on the row: none configured, or a manual
  ``dispatch cron run``) has one try, as before retries existed;
* a try whose worker ran ``dispatch kanban defer`` (the row carries its time while the try
  runs) ends ``deferred``: retried at that time, not counted;
* an infrastructure failure (no scope could be made, a degraded worker stopped with its
  gateway) never reaches the rules: retried behind the back-off, not counted;
* uncounted retries in a row are capped by ``cron.tempfail_limit``, so no fire retries forever.

A fire whose last try failed with every attempt used is *exhausted* (``on_exhausted`` applies);
one stopped by a ``fail`` rule, the cap above or an infrastructure failure is not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dispatcher.cron.records import FAILURE_OUTCOMES, FireRecord, RetryKind, Try
from dispatcher.launch.outcome import Outcome, Result
from dispatcher.launch.retry import Action, Random, RetryPolicy, decide

__all__ = ["NextTry", "Verdict", "after_try", "as_tried"]

RETRIED = FAILURE_OUTCOMES | {Outcome.DEFERRED}
"""Outcomes of a try that the retry policy may answer with another try."""


@dataclass(frozen=True, kw_only=True)
class NextTry:
    """The fire's next try."""

    at: float
    attempt: int
    """The attempt it will be (the same as the last one after an uncounted retry)."""
    kind: RetryKind
    reason: str
    """``backoff, attempt 3 of 4``, or the worker's reason for deferring."""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What one ended try comes to."""

    tried: Try
    """The try as it is recorded in the row's ``tries``."""
    next: NextTry | None = None
    """The next try, or None: the fire ends with ``tried.outcome``."""
    exhausted: bool = False
    """The fire failed and every attempt it had is used (``on_exhausted`` applies)."""
    why: str | None = None
    """Why there is no next try (None when the fire had no retry policy, or succeeded)."""


def as_tried(row: FireRecord, result: Result) -> Result:
    """``result`` as ``deferred`` when the try's worker chose the time of the next one
    (``dispatch kanban defer`` stored it on the row while the try ran), unless the try ended
    for reasons of its own host (infrastructure) or was replaced."""
    deferred = row.retry_kind is RetryKind.DEFERRED and row.retry_at is not None
    if deferred and not result.infrastructure and result.outcome is not Outcome.REPLACED:
        return replace(result, outcome=Outcome.DEFERRED, error=None)
    return result


def _streak(row: FireRecord) -> int:
    """Uncounted tries at the end of the row's tries."""
    count = 0
    for tried in reversed(row.tries):
        if tried.counted:
            break
        count += 1
    return count


def after_try(
    row: FireRecord,
    result: Result,
    policy: RetryPolicy | None,
    *,
    tempfail_limit: int,
    now: float,
    rng: Random,
    started_at: float | None = None,
    ended_at: float | None = None,
) -> Verdict:
    """Decide after the current try of ``row`` ended with ``result`` (see the module
    docstring); ``result`` is taken as :func:`as_tried` makes it. The next try is timed from
    ``now`` (the scheduler's clock: the database's in cluster mode); ``started_at`` and
    ``ended_at`` (default ``now``) are the try's own times, as recorded."""
    result = as_tried(row, result)
    outcome = result.outcome

    def tried(counted: bool = True) -> Try:
        return Try(
            attempt=row.attempt,
            outcome=outcome,
            counted=counted,
            exit_code=result.exit_code,
            signal=result.signal,
            session_id=result.session_id,
            started_at=started_at,
            ended_at=now if ended_at is None else ended_at,
            error=result.error,
        )

    if row.attempts is None or policy is None or outcome not in RETRIED:
        failed = outcome in FAILURE_OUTCOMES and not result.infrastructure
        return Verdict(tried=tried(), exhausted=failed and row.attempts in (None, 1))
    limit = row.attempts
    if outcome is Outcome.DEFERRED or result.infrastructure:
        if outcome is Outcome.DEFERRED:
            assert row.retry_at is not None
            kind, at, why = RetryKind.DEFERRED, max(row.retry_at, now), row.retry_reason or ""
        else:
            delay = policy.backoff.delay(max(row.attempt, 1), rng)
            why = f"backoff, attempt {row.attempt} of {limit} (not counted: infrastructure)"
            kind, at = RetryKind.BACKOFF, now + delay
        return _uncounted(
            row,
            tried(False),
            tempfail_limit,
            NextTry(at=at, attempt=row.attempt, kind=kind, reason=why),
        )
    decision = decide(
        policy,
        used=row.attempt - 1,
        outcome=outcome,
        exit_code=result.exit_code,
        rng=rng,
        attempts=limit,
    )
    if not decision.retry:
        stopped = decision.rule is not None and decision.rule.action is Action.FAIL
        return Verdict(tried=tried(), exhausted=not stopped, why=decision.reason)
    following = NextTry(
        at=now + decision.delay,
        attempt=decision.attempt + 1,
        kind=RetryKind.BACKOFF,
        reason=decision.reason,
    )
    if decision.counted:
        return Verdict(tried=tried(), next=following)
    return _uncounted(row, tried(False), tempfail_limit, following)


def _uncounted(row: FireRecord, tried: Try, limit: int, following: NextTry) -> Verdict:
    """An uncounted retry, unless the fire already had ``limit`` of them in a row."""
    streak = _streak(row) + 1
    if streak >= limit:
        why = f"{streak} uncounted tries in a row (cron.tempfail_limit {limit})"
        return Verdict(tried=tried, why=why)
    return Verdict(tried=tried, next=following)
