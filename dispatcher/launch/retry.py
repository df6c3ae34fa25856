"""The retry policy shared by kanban and cron: back-off with jitter and rules by outcome and exit.

A :class:`RetryPolicy` is configured as ``retry:`` (``kanban.retry``, per assignee,
``cron.retry``, per job)::

    retry:
      attempts: 4                 # tries in all, the first included
      backoff: {initial: 10s, factor: 2, max: 10m, jitter: full}
      rules:                      # first match wins
        - {exit_codes: ["2", "64-77"], action: fail}
        - {outcomes: [lost], action: retry, counted: false}
        - {outcomes: [oom_killed], action: retry, resources: {memory_max: 2GiB}}

:func:`decide` is the one pure decision: given the policy, how many counted tries have been
used (this one included), the outcome and exit code of the try that just ended, and an injected
random source, it says whether to retry, whether this try counts, and after how long. The
configured rules are matched first, then :data:`BUILTIN_RULES` (exit 75: retry, not counted;
exit 78: fail now), so a config may override what 75 and 78 mean. An outcome no rule names
retries, counted, while attempts remain. A retry rule's ``resources`` is a resource class over
the worker's own (key by key) for the next try only; it must fit over the worker's class and
``scope.resources`` like any class (checked at load).

Back-off for try ``n`` (1-based): ``d = min(max, initial * factor^(n-1))``, then jitter:
``full`` draws uniformly from [0, d], ``equal`` from [d/2, d], ``none`` is d itself. Nothing
here reads the clock or a global random source: callers pass both in.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dispatcher.launch.outcome import EX_CONFIG, EX_TEMPFAIL, Outcome
from scope.foundation.errors import Invalid
from scope.foundation.schema import (
    Bool,
    Choice,
    Duration,
    Int,
    Kind,
    ListOf,
    Optional,
    Record,
    Str,
    setting,
)
from scope.foundation.text import quote
from scope.resources import ScopeProperties

__all__ = [
    "ANSWERED",
    "BUILTIN_RULES",
    "Action",
    "Backoff",
    "Decision",
    "ExitCodes",
    "Jitter",
    "RetryPolicy",
    "Rule",
    "decide",
    "parse_exit_range",
]

ANSWERED = frozenset(
    {
        Outcome.FAILED,
        Outcome.TIMED_OUT,
        Outcome.LOST,
        Outcome.FAILED_START,
        Outcome.CONFIG_ERROR,
        Outcome.OOM_KILLED,
        Outcome.TEMPFAIL,
    }
)
"""The outcomes a policy's rules are asked about: a try that failed by the worker's own doing.
Kanban's taxonomy and cron's :mod:`~dispatcher.cron.retries` consult the rules only for these
(and never for an infrastructure failure); every other outcome is settled before any rule is
read (``completed``, ``deferred``, ``spawn_refused``, ``reclaimed``, ``replaced``, cron's own
decisions), so a rule naming one of them could never match and is refused at load."""

Random = Callable[[], float]
"""A random source: returns a float in [0, 1) (``random.Random().random``)."""


class Jitter(enum.StrEnum):
    """How the back-off delay is spread (so a burst of failures does not return in lock-step)."""

    FULL = "full"
    """Uniform in [0, d]."""
    EQUAL = "equal"
    """d/2 plus uniform in [0, d/2]."""
    NONE = "none"
    """Exactly d."""


class Action(enum.StrEnum):
    """What a matching rule does with the try that just ended."""

    RETRY = "retry"
    FAIL = "fail"


class _Factor(Kind):
    """A number ≥ 1 (the back-off growth factor)."""

    label = "number ≥ 1"

    def convert(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid(f"expected a number, got {quote(value)}")
        if not math.isfinite(value) or value < 1:
            raise Invalid(f"must be at least 1, got {quote(value)}")
        return float(value)


def parse_exit_range(value: Any) -> tuple[int, int]:
    """``"2"``, ``2`` or ``"64-77"`` → an inclusive (low, high) range of exit codes 0..255."""
    if isinstance(value, bool):
        raise Invalid(f"expected an exit code or a range like '64-77', got {quote(value)}")
    text = str(value).strip()
    low, sep, high = text.partition("-")
    try:
        bounds = (int(low), int(high) if sep else int(low))
    except ValueError:
        raise Invalid(
            f"invalid exit code {quote(value)}; write a code like '2' or a range like '64-77'"
        ) from None
    if not (0 <= bounds[0] <= bounds[1] <= 255):
        raise Invalid(f"invalid exit code range {quote(value)}; codes are 0-255, low ≤ high")
    return bounds


class ExitCodes(Kind):
    """A list of exit codes and inclusive ranges (``["2", "64-77"]``)."""

    label = "list of exit codes or ranges ('64-77')"

    def convert(self, value: Any) -> Any:
        if not isinstance(value, list):
            raise Invalid(f"expected a list of exit codes, got {quote(value)}")
        out = []
        for index, item in enumerate(value):
            try:
                out.append(parse_exit_range(item))
            except Invalid as err:
                raise Invalid(err.problem, (index,)) from None
        return tuple(out)

    def dump(self, value: Any) -> Any:
        return [str(a) if a == b else f"{a}-{b}" for a, b in value]


class _Outcomes(Kind):
    """A list of names from the shared outcome vocabulary."""

    label = "list of outcome names"

    def convert(self, value: Any) -> Any:
        if not isinstance(value, list):
            raise Invalid(f"expected a list of outcome names, got {quote(value)}")
        names = {member.value: member for member in Outcome}
        allowed = ", ".join(o.value for o in Outcome if o in ANSWERED)
        out = []
        for index, item in enumerate(value):
            if item not in names:
                raise Invalid(f"unknown outcome {quote(item)}; use one of: {allowed}", (index,))
            if names[item] not in ANSWERED:
                raise Invalid(
                    f"outcome {quote(item)} never reaches the retry policy (it is settled "
                    f"before any rule is read); name one of: {allowed}",
                    (index,),
                )
            out.append(names[item])
        return tuple(out)

    def dump(self, value: Any) -> Any:
        return [member.value for member in value]


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """``retry.backoff``: the delay before the next try."""

    initial: float = setting(10.0, kind=Duration(min=0), doc="Delay before the second try.")
    factor: float = setting(2.0, kind=_Factor(), doc="Growth of the delay per try (≥ 1).")
    max: float = setting(600.0, kind=Duration(min=0), doc="Cap on the delay (≥ initial).")
    jitter: Jitter = setting(
        Jitter.FULL, kind=Choice(Jitter), doc="full: [0, d]; equal: [d/2, d]; none: d."
    )

    def check(self) -> None:
        """``max`` below ``initial`` would make the cap meaningless."""
        if self.max < self.initial:
            raise Invalid("must be at least backoff.initial", ("max",))

    def nominal(self, attempt: int) -> float:
        """The delay before try ``attempt + 1`` without jitter: ``min(max, initial *
        factor^(attempt-1))``."""
        if attempt < 1:
            return 0.0
        # The exponent is capped so a long streak cannot overflow the float.
        return min(self.max, self.initial * self.factor ** min(attempt - 1, 64))

    def delay(self, attempt: int, rng: Random) -> float:
        """The jittered delay after try ``attempt`` (1-based) ended; always within [0, max]."""
        base = self.nominal(attempt)
        if self.jitter is Jitter.FULL:
            return base * rng()
        if self.jitter is Jitter.EQUAL:
            return base / 2 + base / 2 * rng()
        return base


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One entry of ``retry.rules``: every criterion given must match (none: matches all)."""

    exit_codes: tuple[tuple[int, int], ...] = setting(
        (), kind=ExitCodes(), doc="Exit codes and ranges this rule matches ('2', '64-77')."
    )
    outcomes: tuple[Outcome, ...] = setting(
        (), kind=_Outcomes(), doc="Outcomes this rule matches (the shared vocabulary)."
    )
    action: Action = setting(
        Action.RETRY, kind=Choice(Action), doc="retry, or fail: stop now (no more tries)."
    )
    counted: bool = setting(
        True, kind=Bool(), doc="A retry uses an attempt (false: backs off, no attempt used)."
    )
    name: str | None = setting(
        None,
        kind=Optional(Str()),
        doc="Label in a card's events and a fire's history (default: the rule's criteria).",
    )
    resources: ScopeProperties | None = setting(
        None,
        kind=Optional(Record(ScopeProperties)),
        doc="A resource class for the next try only, over the worker's own key by key (e.g. "
        "{memory_max: 2GiB} after oom_killed); kanban only for now. See docs/resources.md.",
    )

    def check(self) -> None:
        """``fail`` ends the tries now: an uncounted retry or a class for the next try
        contradicts it."""
        if self.action is Action.FAIL and not self.counted:
            raise Invalid(
                "counted: false applies to a retry, but action fail gives up at once; "
                "remove counted, or use action: retry",
                ("counted",),
            )
        if self.action is Action.FAIL and self.resources is not None:
            raise Invalid(
                "resources apply to the next try, but action fail gives up at once; "
                "remove resources, or use action: retry",
                ("resources",),
            )

    @property
    def label(self) -> str:
        """How events and history name the rule: its ``name``, else its criteria
        (``rule exit 2,64-77``, ``rule timed_out``)."""
        if self.name:
            return self.name
        parts = [", ".join(o.value for o in self.outcomes)] if self.outcomes else []
        if self.exit_codes:
            codes = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.exit_codes)
            parts.append(f"exit {codes}")
        return "rule " + (" ".join(parts) or "(any)")

    def covers(self, later: Rule) -> bool:
        """Whether this rule matches every try ``later`` would (of those a policy is asked
        about, :data:`ANSWERED`, with any exit code or none): placed after this one, ``later``
        never decides (the first match wins)."""
        if not set(later.outcomes or ANSWERED) <= set(self.outcomes or ANSWERED):
            return False
        if not self.exit_codes:
            return True
        return bool(later.exit_codes) and _codes(later.exit_codes) <= _codes(self.exit_codes)

    def matches(self, outcome: Outcome, exit_code: int | None) -> bool:
        """Whether the try that ended with ``outcome``/``exit_code`` falls under this rule."""
        if self.outcomes and outcome not in self.outcomes:
            return False
        if self.exit_codes:
            if exit_code is None:
                return False
            return any(low <= exit_code <= high for low, high in self.exit_codes)
        return True


def _codes(ranges: tuple[tuple[int, int], ...]) -> frozenset[int]:
    return frozenset(code for low, high in ranges for code in range(low, high + 1))


BUILTIN_RULES: tuple[Rule, ...] = (
    Rule(
        exit_codes=((EX_TEMPFAIL, EX_TEMPFAIL),),
        action=Action.RETRY,
        counted=False,
        name="exit 75 (temporary failure)",
    ),
    Rule(exit_codes=((EX_CONFIG, EX_CONFIG),), action=Action.FAIL, name="exit 78 (config)"),
    Rule(outcomes=(Outcome.CONFIG_ERROR,), action=Action.FAIL, name="configuration error"),
)
"""What 75 and 78 mean unless a configured rule says otherwise (checked after the config's)."""


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """A ``retry:`` section (see the module docstring)."""

    attempts: int | None = setting(
        None,
        kind=Optional(Int(min=1)),
        doc="Tries in all, the first included (kanban default: kanban.failure_limit; cron: "
        "required, tries per fire).",
    )
    backoff: Backoff = setting(
        default_factory=Backoff, kind=Record(Backoff), doc="The delay before the next try."
    )
    rules: tuple[Rule, ...] = setting(
        (), kind=ListOf(Record(Rule)), doc="Rules by exit code or outcome; first match wins."
    )

    def check(self) -> None:
        """Every configured rule can decide: none comes after one that already matches every
        try it would (it could never apply)."""
        for index, later in enumerate(self.rules):
            first = next(
                (i for i, rule in enumerate(self.rules[:index]) if rule.covers(later)), None
            )
            if first is not None:
                raise Invalid(
                    f"never applies: rules[{first}] before it matches every try this rule "
                    f"would (the first matching rule decides); move it above rules[{first}] "
                    "or remove it",
                    ("rules", index),
                )

    def match(self, outcome: Outcome, exit_code: int | None) -> Rule | None:
        """The first configured rule, then built-in rule, matching; None when none does."""
        for rule in (*self.rules, *BUILTIN_RULES):
            if rule.matches(outcome, exit_code):
                return rule
        return None

    def configured(self, outcome: Outcome, exit_code: int | None) -> Rule | None:
        """The first *configured* rule matching (the built-ins left out)."""
        return next((r for r in self.rules if r.matches(outcome, exit_code)), None)


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What to do after one failed try."""

    retry: bool
    counted: bool
    delay: float = 0.0
    """Seconds before the next try (0 when not retrying)."""
    attempt: int
    """Counted tries used, this one included when it counts."""
    reason: str
    rule: Rule | None = field(default=None, compare=False)


def decide(
    policy: RetryPolicy,
    *,
    used: int,
    outcome: Outcome,
    exit_code: int | None,
    rng: Random,
    attempts: int | None = None,
) -> Decision:
    """Decide after a failed try (see the module docstring).

    ``used`` is the number of counted tries before this one; ``attempts`` overrides the
    policy's (kanban passes the card's limit). Without either, a retry is always possible."""
    rule = policy.match(outcome, exit_code)
    limit = attempts if attempts is not None else policy.attempts
    why = rule.label if rule is not None else None
    if rule is not None and rule.action is Action.FAIL:
        return Decision(
            retry=False, counted=True, attempt=used + 1, reason=f"{why}: no retry", rule=rule
        )
    counted = rule.counted if rule is not None else True
    attempt = used + 1 if counted else used
    if counted and limit is not None and attempt >= limit:
        return Decision(
            retry=False,
            counted=True,
            attempt=attempt,
            reason=f"{attempt} of {limit} attempts used",
            rule=rule,
        )
    delay = policy.backoff.delay(max(attempt, 1), rng)
    total = f" of {limit}" if limit is not None else ""
    return Decision(
        retry=True,
        counted=counted,
        delay=delay,
        attempt=attempt,
        reason=f"backoff, attempt {attempt + 1}{total}"
        + ("" if counted else f" (not counted: {why})"),
        rule=rule,
    )
