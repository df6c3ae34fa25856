"""The one id rule (scope/foundation/ids.py): a table of what users type, and properties.

The stores' own suites (tests/contracts/test_registry_contract.py, test_board_store.py) check
that every registry and board store answers by this rule; here is the rule itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scope.foundation.errors import NotFoundError, UsageError
from scope.foundation.ids import MIN_PREFIX, AmbiguousId, IdKind, IdTooShort, lookup

KIND = IdKind(name="card", prefix="c_", digits=10, listing="dispatch kanban list")
IDS = ("c_abcdef0001", "c_abcdef0002", "c_0123456789", "c_ffff000000")


def _starting(ids: Sequence[str]) -> Callable[[str], list[str]]:
    return lambda prefix: sorted(i for i in ids if i.startswith(prefix))


@pytest.mark.parametrize(
    ("typed", "found"),
    [
        ("c_0123456789", "c_0123456789"),
        ("0123456789", "c_0123456789"),
        ("c_01", "c_0123456789"),
        ("0123", "c_0123456789"),
        ("  c_ffff", "c_ffff000000"),
        ("c_FFFF0", "c_ffff000000"),
        ("\tc_abcdef0002 ", "c_abcdef0002"),
    ],
)
def test_what_a_user_types_finds_the_one_id(typed: str, found: str) -> None:
    assert lookup(typed, KIND, starting=_starting(IDS)) == found


@pytest.mark.parametrize(
    ("typed", "error", "needle"),
    [
        ("c_0", IdTooShort, "at least 4 characters"),
        ("012", IdTooShort, "see 'dispatch kanban list'"),
        ("c_xyz!", NotFoundError, "card ids look like c_1a2b3c4d5e"),
        ("c_", NotFoundError, "look like"),
        ("", NotFoundError, "look like"),
        ("c_9999", NotFoundError, "no card 'c_9999'"),
        ("c_abcd", AmbiguousId, "c_abcdef0001, c_abcdef0002"),
    ],
)
def test_every_failure_is_exit_2_with_one_line(typed: str, error: type, needle: str) -> None:
    with pytest.raises(error) as caught:
        lookup(typed, KIND, starting=_starting(IDS))
    assert isinstance(caught.value, UsageError) and caught.value.exit_code == 2
    assert needle in caught.value.message and "\n" not in caught.value.message


def test_a_whole_id_needs_no_prefix_search() -> None:
    def never(prefix: str) -> list[str]:
        raise AssertionError("the prefix search ran")

    assert lookup("c_0123456789", KIND, exists=lambda i: i in IDS, starting=never) == IDS[2]


@given(st.lists(st.text("0123456789abcdef", min_size=10, max_size=10), min_size=1, unique=True))
def test_a_unique_prefix_of_four_or_more_finds_its_id(bodies: list[str]) -> None:
    ids = [KIND.prefix + body for body in bodies]
    for wanted in ids:
        for length in range(MIN_PREFIX, len(wanted) + 1):
            typed = wanted[:length]
            matches = [i for i in ids if i.startswith(typed)]
            if len(matches) == 1:
                assert lookup(typed, KIND, starting=_starting(ids)) == wanted
            else:
                with pytest.raises(AmbiguousId):
                    lookup(typed, KIND, starting=_starting(ids))


def test_new_ids_have_the_kind_s_shape() -> None:
    made = {KIND.new() for _ in range(50)}
    assert len(made) == 50
    for ident in made:
        assert lookup(ident, KIND, starting=_starting([ident])) == ident
        assert len(ident) == len(KIND.example) == 12
