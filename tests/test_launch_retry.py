"""The retry policy as a pure function: back-off bounds, rule order, config errors, kanban use."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.config import parse_config
from dispatcher.kanban.model import CardStatus, EventKind
from dispatcher.kanban.taxonomy import Breaker, after_run
from dispatcher.launch.outcome import Outcome, Result
from dispatcher.launch.retry import (
    ANSWERED,
    Action,
    Backoff,
    Jitter,
    RetryPolicy,
    Rule,
    decide,
    parse_exit_range,
)
from scope.foundation.errors import ConfigError, Invalid
from scope.foundation.schema import Record
from tests.support.cards import RUN, card

NOW = 1_800_000_000.0
SAMPLE = {
    "attempts": 4,
    "backoff": {"initial": "10s", "factor": 2, "max": "10m", "jitter": "full"},
    "rules": [
        {"exit_codes": ["2", "64-77"], "action": "fail"},
        {"outcomes": ["timed_out"], "action": "retry"},
        {"outcomes": ["lost"], "action": "retry", "counted": False},
    ],
}


FAIL_LOST = {"rules": [{"outcomes": ["lost"], "action": "fail"}]}


def policy(raw: object = SAMPLE) -> RetryPolicy:
    value = Record(RetryPolicy).convert(raw)
    assert isinstance(value, RetryPolicy)
    return value


def half() -> float:
    return 0.5


# -- back-off ---------------------------------------------------------------------------------

durations = st.floats(min_value=0, max_value=1e6, allow_nan=False)
factors = st.floats(min_value=1, max_value=100, allow_nan=False)
unit = st.floats(min_value=0, max_value=1, exclude_max=True)


@given(durations, factors, durations, st.integers(1, 10_000), unit, st.sampled_from(Jitter))
def test_delay_stays_within_its_jitter_bounds(
    initial: float, factor: float, extra: float, attempt: int, draw: float, jitter: Jitter
) -> None:
    backoff = Backoff(initial=initial, factor=factor, max=initial + extra, jitter=jitter)
    nominal = backoff.nominal(attempt)
    assert nominal <= backoff.max
    delay = backoff.delay(attempt, lambda: draw)
    assert 0 <= delay <= nominal
    if jitter is Jitter.EQUAL:
        assert delay >= nominal / 2
    if jitter is Jitter.NONE:
        assert delay == nominal == backoff.delay(attempt, lambda: 0.99)


def test_nominal_delay_is_initial_times_factor_capped_at_max() -> None:
    backoff = Backoff(initial=10, factor=2, max=600, jitter=Jitter.NONE)
    assert [backoff.nominal(n) for n in range(1, 9)] == [10, 20, 40, 80, 160, 320, 600, 600]
    assert backoff.delay(3, half) == 40
    assert replace(backoff, jitter=Jitter.FULL).delay(3, half) == 20
    assert replace(backoff, jitter=Jitter.EQUAL).delay(3, half) == 30


# -- rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "code", "retry", "counted"),
    [
        (Outcome.FAILED, 2, False, True),  # usage error: fail
        (Outcome.FAILED, 70, False, True),  # in 64-77: fail
        (Outcome.TEMPFAIL, 75, False, True),  # the config's 64-77 overrides the built-in 75
        (Outcome.FAILED, 1, True, True),  # no rule: counted retry
        (Outcome.TIMED_OUT, None, True, True),
        (Outcome.LOST, None, True, False),
        (Outcome.CONFIG_ERROR, 78, False, True),  # in 64-77 too
    ],
)
def test_sample_rules(outcome: Outcome, code: int | None, retry: bool, counted: bool) -> None:
    got = decide(policy(), used=0, outcome=outcome, exit_code=code, rng=half)
    assert (got.retry, got.counted) == (retry, counted)


def test_builtin_rules_give_75_and_78_their_meaning() -> None:
    plain = RetryPolicy()
    tempfail = decide(plain, used=3, outcome=Outcome.TEMPFAIL, exit_code=75, rng=half)
    assert tempfail.retry and not tempfail.counted and tempfail.attempt == 3
    config = decide(plain, used=0, outcome=Outcome.CONFIG_ERROR, exit_code=78, rng=half)
    assert not config.retry


def test_attempts_count_the_first_try_and_uncounted_retries_use_none() -> None:
    sample = policy()
    steps = [
        decide(sample, used=used, outcome=Outcome.FAILED, exit_code=1, rng=half)
        for used in range(4)
    ]
    assert [s.retry for s in steps] == [True, True, True, False]
    assert [s.delay for s in steps[:3]] == [5.0, 10.0, 20.0]
    assert steps[1].reason == "backoff, attempt 3 of 4"
    lost = decide(sample, used=3, outcome=Outcome.LOST, exit_code=None, rng=half)
    assert lost.retry and not lost.counted


@given(st.lists(st.tuples(st.integers(0, 255), st.integers(0, 255)), min_size=1, max_size=4))
def test_the_first_matching_rule_wins(ranges: list[tuple[int, int]]) -> None:
    rules = tuple(
        Rule(exit_codes=((min(a, b), max(a, b)),), action=Action.FAIL if i % 2 else Action.RETRY)
        for i, (a, b) in enumerate(ranges)
    )
    sample = RetryPolicy(rules=rules)
    for code in range(256):
        first = next((r for r in rules if r.matches(Outcome.FAILED, code)), None)
        if first is not None:
            assert sample.match(Outcome.FAILED, code) is first


ranges = st.lists(
    st.tuples(st.integers(0, 255), st.integers(0, 255)).map(lambda r: (min(r), max(r))),
    max_size=3,
).map(tuple)
rules = st.builds(
    Rule,
    exit_codes=ranges,
    outcomes=st.lists(st.sampled_from(sorted(ANSWERED)), max_size=3, unique=True).map(tuple),
)
TRIES = [(o, code) for o in sorted(ANSWERED) for code in (None, *range(256))]


@given(rules, rules)
def test_a_rule_covers_another_exactly_when_it_matches_every_try_the_other_would(
    first: Rule, later: Rule
) -> None:
    escapes = [t for t in TRIES if later.matches(*t) and not first.matches(*t)]
    assert first.covers(later) is (not escapes)


@pytest.mark.parametrize(
    ("rules_text", "ok"),
    [
        # The sample: exit-code rules never cover an outcome rule (a signal has no code).
        ("[{exit_codes: ['2', '64-77'], action: fail}, {outcomes: [timed_out]}]", True),
        ("[{outcomes: [lost]}, {outcomes: [lost, failed]}]", True),
        ("[{exit_codes: ['64-77']}, {exit_codes: ['75'], counted: false}]", False),
        ("[{action: fail}, {outcomes: [lost], action: retry}]", False),
        ("[{outcomes: [lost, failed]}, {outcomes: [lost], exit_codes: ['3']}]", False),
    ],
)
def test_a_rule_that_never_applies_is_refused(rules_text: str, ok: bool) -> None:
    text = f"kanban:\n  retry: {{rules: {rules_text}}}\n"
    if ok:
        parse_config(text, "c.yaml")
        return
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    message = info.value.message
    assert "c.yaml:2: kanban.retry.rules[1]: never applies: rules[0] before it matches" in message
    assert "move it above rules[0] or remove it" in message and "\n" not in message


def test_exit_ranges_parse() -> None:
    assert parse_exit_range("64-77") == (64, 77)
    assert parse_exit_range(2) == (2, 2)
    for bad in ("77-64", "x", "1-", "300", True):
        with pytest.raises(Invalid):
            parse_exit_range(bad)


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry", "expected"),
    [
        ("{rules: [{outcomes: [exploded]}]}", "kanban.retry.rules[0].outcomes[0]: unknown outcome"),
        ("{rules: [{exit_codes: ['9-x']}]}", "kanban.retry.rules[0].exit_codes[0]: invalid exit"),
        ("{attempts: 0}", "kanban.retry.attempts: must be at least 1"),
        ("{backoff: {factor: 0.5}}", "kanban.retry.backoff.factor: must be at least 1"),
        ("{backoff: {initial: 1m, max: 10s}}", "kanban.retry.backoff.max: must be at least"),
        ("{backoff: {jitter: some}}", "kanban.retry.backoff.jitter: invalid value"),
        (
            "{rules: [{outcomes: [failed, completed]}]}",
            "kanban.retry.rules[0].outcomes[1]: outcome 'completed' never reaches the retry policy",
        ),
        ("{rules: [{outcomes: [deferred]}]}", "outcomes[0]: outcome 'deferred' never reaches"),
        ("{rules: [{outcomes: [skipped_overlap]}]}", "outcome 'skipped_overlap' never reaches"),
        (
            "{rules: [{exit_codes: ['1'], action: fail, counted: false}]}",
            "kanban.retry.rules[0].counted: counted: false applies to a retry, but action fail "
            "gives up at once; remove counted, or use action: retry",
        ),
        (
            "{rules: [{outcomes: [oom_killed], action: fail, resources: {memory_max: 1GiB}}]}",
            "kanban.retry.rules[0].resources: resources apply to the next try, but action fail",
        ),
        ("{attempts: 4}\n  failure_limit: 3", "kanban.retry.attempts: conflicts with kanban"),
        # Even when failure_limit is spelled out at its default value.
        ("{attempts: 4}\n  failure_limit: 2", "kanban.retry.attempts: conflicts with kanban"),
    ],
)
def test_bad_retry_config_is_one_line_naming_the_key(retry: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"kanban:\n  retry: {retry}\n", "c.yaml")
    message = info.value.message
    assert expected in message and "\n" not in message, message
    assert info.value.exit_code == 2


def test_the_outcomes_rules_may_name_are_those_both_policies_ask_about() -> None:
    """What the config accepts in ``outcomes`` is exactly what kanban's taxonomy and cron's
    retries consult the rules for: a rule naming anything else could never match."""
    from dispatcher.cron.records import RetryKind
    from dispatcher.cron.retries import after_try
    from tests.test_cron_retry import fire

    asked = {"kanban": set(), "cron": set()}
    for outcome in Outcome:
        probe = Rule(outcomes=(outcome,), action=Action.FAIL, name="probe")
        rules = RetryPolicy(attempts=3, rules=(probe,))
        ended = Result(
            outcome=outcome,
            exit_code=None,
            error="e",
            infrastructure=outcome is Outcome.SPAWN_REFUSED,  # always, by the vocabulary
        )
        change = after_run(card(), RUN, ended, Breaker(retry=rules), NOW)
        if any(data.get("rule") == "probe" for _, data in change.events):
            asked["kanban"].add(outcome)
        # A try ends deferred when its worker stored the time on the row.
        deferred = {"retry_at": NOW + 60, "retry_kind": RetryKind.DEFERRED}
        row = fire(**deferred) if outcome is Outcome.DEFERRED else fire()
        verdict = after_try(row, ended, rules, tempfail_limit=10, now=NOW, rng=half)
        if verdict.why and verdict.why.startswith("probe"):
            asked["cron"].add(outcome)
    assert asked["kanban"] == asked["cron"] == ANSWERED


def test_retry_config_per_assignee_and_default() -> None:
    settings = parse_config(
        "kanban:\n  retry: {attempts: 4}\n  assignees:\n    a: {command: [x]}\n"
        "    b:\n      command: [x]\n      retry: {attempts: 2, backoff: {jitter: none}}\n",
        "c.yaml",
    )
    breaker = Breaker.from_settings(settings.kanban)
    assert (settings.kanban.limit_for(), settings.kanban.limit_for("b")) == (4, 2)
    assert breaker.policy("a").attempts == 4
    assert breaker.policy("b").backoff.jitter is Jitter.NONE
    assert breaker.limit(card(assignee="b")) == 2
    assert breaker.limit(card(assignee="a", failure_limit=7)) == 7


def test_failure_limit_and_attempts_are_one_setting() -> None:
    def limit(text: str) -> int:
        return parse_config(f"kanban:\n{text}", "c.yaml").kanban.limit_for()

    assert limit("  failure_limit: 5\n") == 5
    assert limit("  retry: {attempts: 5}\n") == 5
    assert limit("  failure_limit: 5\n  retry: {attempts: 5}\n") == 5  # the same answer twice
    assert limit("  retry: {backoff: {initial: 1s}}\n") == 2


# -- kanban -----------------------------------------------------------------------------------


def failed(code: int | None, outcome: Outcome = Outcome.FAILED) -> Result:
    return Result(outcome=outcome, exit_code=code, error="e")


def test_kanban_counted_failure_backs_off_by_default() -> None:
    breaker = Breaker(rng=random.Random(7).random)
    change = after_run(card(), RUN, failed(1), breaker, NOW)
    assert change.fields["status"] is CardStatus.READY
    assert NOW <= change.fields["retry_at"] <= NOW + 10
    assert change.events[0][1]["reason"] == "backoff, attempt 2 of 2"


def test_kanban_rules_fail_at_once_or_retry_uncounted() -> None:
    breaker = Breaker(retry=policy(), rng=half)
    usage = after_run(card(), RUN, failed(2), breaker, NOW)
    assert usage.fields["status"] is CardStatus.BLOCKED
    assert [kind for kind, _ in usage.events][-1] is EventKind.GAVE_UP
    lost = after_run(card(consecutive_failures=3), RUN, failed(None, Outcome.LOST), breaker, NOW)
    assert lost.fields["status"] is CardStatus.READY and lost.fields["retry_at"] == NOW + 5
    assert "consecutive_failures" not in lost.fields
    third = after_run(card(consecutive_failures=2), RUN, failed(1), breaker, NOW)
    assert third.fields["retry_at"] == NOW + 20  # attempt 3 of 4: 40 s nominal, half of it
    last = after_run(card(consecutive_failures=3), RUN, failed(1), breaker, NOW)
    assert last.fields["status"] is CardStatus.BLOCKED
    stopped = Result(outcome=Outcome.LOST, infrastructure=True, error="gateway stopped")
    interrupted = after_run(card(), RUN, stopped, Breaker(retry=policy(FAIL_LOST)), NOW)
    assert [kind for kind, _ in interrupted.events] == [EventKind.INTERRUPTED]


def test_list_and_board_show_a_card_backing_off() -> None:
    from dispatcher.kanban.views import backing_off, board_text, card_table
    from dispatcher.timefmt import TimeView

    waiting = card(status=CardStatus.READY, retry_at=NOW + 40)
    assert backing_off(waiting, NOW) == " [backing off, next try in 40s]"
    assert backing_off(waiting, NOW + 40) == ""
    view = TimeView(now=NOW, zone=None)
    assert any("backing off" in line for line in board_text([waiting], paused=False, times=view))
    assert "backing off" in card_table([waiting], times=view)[1]


def test_a_configured_rule_overrides_what_78_means_for_kanban() -> None:
    # "Exit 75 and exit 78 keep their meaning ... as built-in rules that a config may override."
    retry_78 = policy({"attempts": 3, "rules": [{"exit_codes": ["78"], "action": "retry"}]})
    config = failed(78, Outcome.CONFIG_ERROR)
    change = after_run(card(), RUN, config, Breaker(retry=retry_78, rng=half), NOW)
    assert change.fields["status"] is CardStatus.READY
    assert change.fields["retry_at"] == NOW + 5
    assert change.fields["consecutive_failures"] == 1
    at_limit = after_run(card(consecutive_failures=2), RUN, config, Breaker(retry=retry_78), NOW)
    assert at_limit.fields["status"] is CardStatus.BLOCKED
    # Without a rule of its own, 78 still trips the breaker at once.
    plain = after_run(card(), RUN, config, Breaker(retry=policy({"attempts": 3})), NOW)
    assert plain.fields["status"] is CardStatus.BLOCKED


def test_retry_starts_over_and_show_says_no_attempt() -> None:
    # "`kanban retry ID` starts over with a fresh attempt count": no stale "attempt 0 of 4".
    from dispatcher.kanban.model import Event
    from dispatcher.kanban.views import retry_state, show_text
    from dispatcher.timefmt import TimeView

    def event(seq: int, kind: str, **data: object) -> Event:
        return Event(seq=seq, card_id="c_0000000001", kind=kind, at=NOW, data=data)

    gave_up = [
        event(1, "failed", attempt=4, attempts=4, consecutive_failures=4),
        event(2, "gave_up", reason="4 consecutive failures"),
    ]
    blocked = card(status=CardStatus.BLOCKED, consecutive_failures=4, current_run_id=None)
    assert retry_state(blocked, gave_up) is not None
    retried = [*gave_up, event(3, "moved", action="retry", to="ready")]
    fresh = card(status=CardStatus.READY, current_run_id=None)
    assert retry_state(fresh, retried) is None
    lines = show_text(fresh, [], retried, times=TimeView(now=NOW, zone=None))
    assert not any(line.startswith("attempt") for line in lines)


def test_event_lines_spell_their_times() -> None:
    # A deferral's `until` and a failure's `retry_at` are stored as epoch seconds; the terminal
    # and the web show times, as the JSON does.
    from dispatcher.kanban.model import Event
    from dispatcher.kanban.views import show_text
    from dispatcher.timefmt import TimeView, iso
    from dispatcher.web.views import event_summary

    deferred = Event(
        seq=1,
        card_id="c_0000000001",
        kind="deferred",
        at=NOW,
        data={"by": "worker", "until": NOW + 300.25, "reason": "rate limited"},
    )
    failed_ = Event(seq=2, card_id="c_0000000001", kind="failed", at=NOW, data={"retry_at": NOW})
    view = TimeView(now=NOW, zone=None)
    lines = show_text(card(status=CardStatus.READY), [], [deferred, failed_], times=view)
    assert any(f"until={view.at(NOW + 300.25)}" in line for line in lines), lines
    assert not any(str(NOW)[:6] in line for line in lines if "=" in line), lines
    assert f"until={iso(NOW + 300.25)}" in event_summary(deferred)
    assert event_summary(failed_) == f"retry_at={iso(NOW)}"


def test_list_board_and_tile_tell_a_deferred_card_from_one_backing_off() -> None:
    # "kanban list/board and the web tile show a card that is backing off or deferred, with when."
    from dispatcher.kanban.model import Run
    from dispatcher.kanban.views import board_text, card_table, deferred_cards
    from dispatcher.timefmt import TimeView
    from dispatcher.web.views import tiles

    later = card(
        id="c_00000000d1", status=CardStatus.READY, retry_at=NOW + 300, current_run_id=None
    )
    backing = card(status=CardStatus.READY, retry_at=NOW + 40, current_run_id=None)
    runs = {
        later.id: [replace(RUN, card_id=later.id, outcome=Outcome.DEFERRED)],
        backing.id: [replace(RUN, outcome=Outcome.FAILED)],
    }
    asked: list[str] = []

    def runs_of(card_id: str) -> list[Run]:
        asked.append(card_id)
        return runs.get(card_id, [])

    idle = card(id="c_00000000e1", status=CardStatus.READY, current_run_id=None)
    deferred = deferred_cards([later, backing, idle], runs_of, NOW)
    assert deferred == {later.id} and asked == [later.id, backing.id]  # only cards that wait
    view = TimeView(now=NOW, zone=None)
    table = card_table([later, backing], times=view, deferred=deferred)
    assert table[1].endswith("[deferred, next try in 5m]")
    assert table[2].endswith("[backing off, next try in 40s]")
    board = "\n".join(board_text([later, backing], paused=False, times=view, deferred=deferred))
    assert "[deferred, next try in 5m]" in board and "[backing off, next try in 40s]" in board
    shown = tiles([later, backing], [], local_host="h", limit_for=lambda _: 2, deferred=deferred)
    assert [t.deferred for t in shown] == [True, False]


@pytest.mark.parametrize("status", [CardStatus.DONE, CardStatus.BLOCKED, CardStatus.REVIEW])
def test_a_workers_report_after_its_defer_forgets_the_deferral(status: CardStatus) -> None:
    # A worker that deferred and then reported (complete wins) leaves no stale "retry at" that
    # would show on the done card, or hold it back once an operator moves it to ready.
    from dispatcher.kanban.rules import worker_move_change

    deferred = card(retry_at=NOW + 300)
    change = worker_move_change(
        deferred,
        RUN.run_id,
        run_card_id=deferred.id,
        run_open=True,
        status=status,
        now=NOW,
        block_kind=None,
        blocked_until=None,
        reason="r",
        result=None,
    )
    assert change.fields["retry_at"] is None


def test_show_gives_a_deferred_card_its_attempts_too() -> None:
    # "attempt n of m" also while the worker's deferral is pending (it failed nothing yet, so
    # no failure event says m: the assignee's limit does).
    from dispatcher.kanban.model import Event
    from dispatcher.kanban.views import show_json, show_text
    from dispatcher.timefmt import TimeView

    waiting = card(status=CardStatus.READY, retry_at=NOW + 300, current_run_id=None)
    deferred = Event(seq=1, card_id=waiting.id, kind="deferred", at=NOW, data={"until": NOW + 300})
    doc = show_json(waiting, [], [deferred], limit=4)
    assert (doc["retry"]["attempt"], doc["retry"]["attempts"]) == (1, 4)
    lines = show_text(waiting, [], [deferred], times=TimeView(now=NOW, zone=None), limit=4)
    assert "attempt   1 of 4" in lines
