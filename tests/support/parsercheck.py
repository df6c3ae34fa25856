"""Every parser of user text, with hostile inputs and an independent oracle of its grammar.

Each :class:`Target` names a parser, the strategy that feeds it and ``grammar``: an ASCII regular
expression (or check) written from the documented grammar, not from the implementation. A run
of a target on one input has one of four outcomes:

* ``accepted``: the parser returned a value and the oracle agrees the text is in the grammar;
* ``rejected``: the parser raised the project's own error (a ``DispatchError``);
* ``wrong``: the parser returned a value for text outside the grammar (wrongly accepted);
* ``crash``: the parser raised anything else (a traceback for a user).

The property tests (tests/test_props_parsers.py) assert that only the first two happen; the
census (``python -m tests.support.census``) counts all four over many inputs.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

from scope.foundation.errors import DispatchError
from tests.support import hostile


@dataclass(frozen=True, kw_only=True, repr=False)
class Target:
    """One parser under test."""

    name: str
    strategy: st.SearchStrategy[str]
    parse: Callable[[str], object]
    grammar: Callable[[str, object], bool]
    """Whether accepting ``text`` (with the parsed value) is right by the documented grammar."""

    def __repr__(self) -> str:
        return f"Target({self.name})"


def outcome(target: Target, text: str) -> tuple[str, BaseException | None]:
    """``(kind, exception)``: kind is accepted, rejected, wrong or crash (see the docstring)."""
    try:
        value = target.parse(text)
    except DispatchError:
        return "rejected", None
    except Exception as err:  # the point: anything else is a crash
        return "crash", err
    return ("accepted" if target.grammar(text, value) else "wrong"), None


# -- oracles ----------------------------------------------------------------------------------

_B = "[ \\t]*"
_ITEM = "[0-9A-Za-z*/,-]+"
_CRON = re.compile(
    f"{_B}(?:@(?:yearly|annually|monthly|weekly|daily|midnight|hourly)"
    f"|{_ITEM}(?:[ \\t]+{_ITEM}){{4}}){_B}",
    re.ASCII | re.IGNORECASE,
)
_NUM = "[0-9]+(?:\\.[0-9]+)?"
_DURATION = re.compile(
    f"{_B}(?:{_NUM}|(?:{_NUM}(?:ms|s|m|h|d){_B})+){_B}", re.ASCII | re.IGNORECASE
)
_SIZE = re.compile(
    f"{_B}{_NUM}{_B}(?:b|k|kb|kib|m|mb|mib|g|gb|gib|t|tb|tib)?{_B}", re.ASCII | re.IGNORECASE
)
_INT = re.compile(f"{_B}-?[0-9]{{1,18}}{_B}", re.ASCII)
_ISO = re.compile(
    f"{_B}[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}(?:[Tt ][0-9]{{2}}:[0-9]{{2}}"
    f"(?::[0-9]{{2}}(?:[.,][0-9]{{1,6}})?)?(?:[Zz]|[+-][0-9]{{2}}(?::?[0-9]{{2}})?)?)?{_B}",
    re.ASCII,
)
_ZONE = re.compile("[A-Za-z0-9_+/-]+", re.ASCII)
_ENV_NAME = re.compile("[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_HEX_ID = re.compile("c_[0-9a-f]+", re.ASCII)
_UNSAFE = frozenset({"Cc", "Cs", "Zl", "Zp"})


def _digit_runs_at_most(text: str, limit: int) -> bool:
    return all(len(run) <= limit for run in re.findall("[0-9]+", text, re.ASCII))


def _safe_text(text: str, allowed: str = "") -> bool:
    return all(ch in allowed or unicodedata.category(ch) not in _UNSAFE for ch in text)


# -- parsers ----------------------------------------------------------------------------------


_LATE = 253_400_000_000.0  # 9999-12-20: a sparse schedule runs out of calendar here


def _crontab(text: str) -> object:
    """Parsed, then fires computed from 2026 and from just before the end of the calendar."""
    import zoneinfo

    from dispatcher.cron.crontab import parse
    from dispatcher.cron.timeline import CronSchedule

    expr = parse(text)
    schedule = CronSchedule(expr, zoneinfo.ZoneInfo("UTC"))
    schedule.next_instants(1_780_000_000.0, 3)
    schedule.next_instants(_LATE, 3)
    return expr


def _duration(text: str) -> object:
    from scope.foundation.values import MAX_DURATION, parse_duration

    value = parse_duration(text)
    assert 0 <= value <= MAX_DURATION, value
    return value


def _size(text: str) -> object:
    from scope.foundation.values import MAX_SIZE, parse_size

    value = parse_size(text)
    assert 0 <= value <= MAX_SIZE, value
    return value


def _count(text: str) -> object:
    """``--count`` of ``cron next``, as its argparse type converts it."""
    import argparse

    from dispatcher.cli.cron_cmd import MAX_COUNT
    from dispatcher.cli.parser import int_arg
    from scope.foundation.errors import UsageError

    try:
        return int_arg(1, MAX_COUNT)(text)
    except argparse.ArgumentTypeError as err:
        raise UsageError(str(err)) from None  # what the parser turns it into


def _iso(text: str) -> object:
    """``--from`` of ``cron next``: parsed, then the next fires computed from it."""
    from dispatcher.cli.cron_cmd import _parse_from
    from dispatcher.cron.crontab import parse
    from dispatcher.cron.timeline import CronSchedule
    from dispatcher.cron.zones import load_zone

    for zone in ("UTC", "Pacific/Kiritimati", "Etc/GMT+12"):
        at = _parse_from(text, zone)
        for expr in ("* * * * *", "59 23 31 12 *"):
            CronSchedule(parse(expr), load_zone(zone)).next_instants(at, 3)
    return at


def _zone(text: str) -> object:
    from dispatcher.cron.zones import load_zone

    return load_zone(text)


def _host_zone(text: str) -> object:
    from dispatcher.cron.zones import host_zone_name, load_zone

    name = host_zone_name({"TZ": text})
    load_zone(name)  # whatever TZ holds, the answer is a zone that loads
    return name


def _env(text: str) -> object:
    from dispatcher.envfile import parse_env_text

    return parse_env_text(text, "e.env")


def _card_id(text: str) -> object:
    from dispatcher.kanban.rows import CARD_IDS
    from scope.foundation.ids import lookup

    # The one id rule; every well-formed prefix names a card of its own, so what is checked
    # is the grammar of what may be typed.
    return lookup(text, CARD_IDS, starting=lambda prefix: [prefix])


def _title(text: str) -> object:
    from dispatcher.kanban.board import Board

    return Board.check_title(text)


def _body(text: str) -> object:
    from dispatcher.kanban.board import MAX_BODY, check_text

    return check_text("body", text, MAX_BODY, lines=True)


def _config(text: str) -> object:
    from dispatcher.config import parse_config

    return parse_config(text, "config.yaml")


def _fire_key(text: str) -> object:
    from dispatcher.cron.timeline import parse_fire_key

    return parse_fire_key(text)


def _env_ok(text: str, value: object) -> bool:
    assert isinstance(value, dict)
    return all(_ENV_NAME.fullmatch(k) and "\0" not in v for k, v in value.items())


def _title_ok(text: str, value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 500 and _safe_text(value)


_CONFIG_TOKENS = [
    "cron:\n  jobs:\n    - id: x\n      command: [true]\n      schedule: ",
    "cron:\n  jobs:\n    - id: x\n      command: [true]\n      every: ",
    "registry:\n  log_max_bytes: ",
    "kanban:\n  max_in_progress: ",
    "cron:\n  timezone: ",
    "'0 0 * * *'",
    "1h",
    "10MiB",
    "9" * 5000,
    "1e999",
    "2026-01-01",
    "!!python/object:os.system",
    "*a",
    "&a",
    "<<: *a",
    "\n",
]
_FIRE_KEY = re.compile(
    "[a-z0-9][a-z0-9_-]*@[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
    "(?:\\.[0-9]{3})?(?:,fold=1)?",
    re.ASCII,
)

TARGETS = [
    Target(
        name="crontab",
        strategy=hostile.crontab_text(),
        parse=_crontab,
        grammar=lambda t, v: bool(_CRON.fullmatch(t)) and _digit_runs_at_most(t, 9),
    ),
    Target(
        name="duration",
        strategy=hostile.hostile(hostile.DURATION_TOKENS) | hostile.mutated(hostile.durations()),
        parse=_duration,
        grammar=lambda t, v: bool(_DURATION.fullmatch(t)) and _digit_runs_at_most(t, 18),
    ),
    Target(
        name="size",
        strategy=hostile.hostile(hostile.SIZE_TOKENS) | hostile.mutated(hostile.sizes()),
        parse=_size,
        grammar=lambda t, v: bool(_SIZE.fullmatch(t)) and _digit_runs_at_most(t, 19),
    ),
    Target(
        name="count",
        strategy=hostile.hostile(hostile.INT_TOKENS)
        | hostile.mutated(st.integers(-5, 2000).map(str)),
        parse=_count,
        grammar=lambda t, v: bool(_INT.fullmatch(t)) and isinstance(v, int) and 1 <= v <= 1000,
    ),
    Target(
        name="iso-time",
        strategy=hostile.hostile(hostile.ISO_TOKENS, "-:T ") | hostile.mutated(hostile.iso_times()),
        parse=_iso,
        grammar=lambda t, v: bool(_ISO.fullmatch(t)),
    ),
    Target(
        name="zone",
        strategy=hostile.hostile(hostile.ZONE_TOKENS, "/")
        | hostile.mutated(st.sampled_from(hostile.ZONE_NAMES)),
        parse=_zone,
        grammar=lambda t, v: bool(_ZONE.fullmatch(t)),
    ),
    Target(
        name="host-zone",
        strategy=hostile.hostile(hostile.ZONE_TOKENS, "/:")
        | hostile.mutated(st.sampled_from(hostile.ZONE_NAMES).map(lambda z: ":" + z)),
        parse=_host_zone,
        grammar=lambda t, v: isinstance(v, str) and bool(_ZONE.fullmatch(v)),
    ),
    Target(
        name="env-file",
        strategy=hostile.hostile(hostile.ENV_TOKENS, " \t\n")
        | hostile.mutated(st.just("# c\nA=1\nexport B = 'two words'\nC=\"x\"\n")),
        parse=_env,
        grammar=_env_ok,
    ),
    Target(
        name="card-id",
        strategy=hostile.hostile(hostile.ID_TOKENS, "")
        | hostile.mutated(st.from_regex(r"(c_)?[0-9a-f]{4,10}", fullmatch=True)),
        parse=_card_id,
        grammar=lambda t, v: isinstance(v, str) and bool(_HEX_ID.fullmatch(v)),
    ),
    Target(
        name="card-title",
        strategy=hostile.hostile(["title", "a b", "\t", "\n", "é", "🙂"], " ")
        | hostile.mutated(st.text(min_size=1, max_size=30)),
        parse=_title,
        grammar=_title_ok,
    ),
    Target(
        name="card-body",
        strategy=hostile.hostile(["line", "\n", "\t", "\r\n", "é"], " \n"),
        parse=_body,
        grammar=lambda t, v: _safe_text(t, "\t\n\r"),
    ),
    Target(
        name="config-yaml",
        strategy=hostile.hostile(_CONFIG_TOKENS, " \n"),
        parse=_config,
        grammar=lambda t, v: True,
    ),
    Target(
        name="fire-key",
        strategy=hostile.hostile(["nightly", "@", "2026-03-29T02:30:00", ",fold=1", ".500"], "")
        | hostile.mutated(
            st.sampled_from(["nightly@2026-03-29T02:30:00,fold=1", "a@0001-01-02T00:00:00"])
        ),
        parse=_fire_key,
        grammar=lambda t, v: bool(_FIRE_KEY.fullmatch(t)),
    ),
]
