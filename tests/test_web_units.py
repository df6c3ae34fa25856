"""dispatch web's pure parts: the secret file and what it signs, inert text, the board's order,
--listen and the Host rule, the form reader's limits, the metrics fold."""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from dispatcher.kanban.model import Card, CardStatus, Event
from dispatcher.web import render, views
from dispatcher.web.actions import safe_next
from dispatcher.web.errors import ListenRefused, SecretUnusable
from dispatcher.web.guard import Access
from dispatcher.web.keys import SECRET_NAME, Keys, load_secret
from dispatcher.web.metrics import Histogram, ReadyToRunning
from dispatcher.web.server import allowed_hosts, check_remote, parse_listen
from dispatcher.web.text import LogChunker, clean, inert, tail_start
from scope.foundation.clock import FakeClock

NOW = 1_800_000_000.0

# -- the secret -------------------------------------------------------------------------------


def test_the_secret_is_made_once_private_and_kept(tmp_path: Path) -> None:
    first = load_secret(tmp_path)
    path = tmp_path / SECRET_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) >= 32 and load_secret(tmp_path) == first
    assert [p.name for p in tmp_path.iterdir()] == [SECRET_NAME]  # no temporary file left


def test_concurrent_first_starts_agree_on_one_secret(tmp_path: Path) -> None:
    found: list[str] = []
    threads = [
        threading.Thread(target=lambda: found.append(load_secret(tmp_path))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(found) == 8 and len(set(found)) == 1


@pytest.mark.parametrize(
    ("mode", "content", "problem"),
    [(0o644, "x" * 40, "readable by others"), (0o600, "short", "damaged")],
)
def test_an_unsafe_or_damaged_secret_is_refused(
    tmp_path: Path, mode: int, content: str, problem: str
) -> None:
    path = tmp_path / SECRET_NAME
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(SecretUnusable, match=problem) as caught:
        load_secret(tmp_path)
    assert str(path) in caught.value.message and caught.value.exit_code == 1
    assert path.read_text() == content  # left as it was


def test_a_symlinked_secret_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("y" * 40)
    (tmp_path / SECRET_NAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SecretUnusable, match="symbolic link"):
        load_secret(tmp_path)


def test_sessions_and_csrf_tokens_are_signed_and_bound() -> None:
    clock = FakeClock(NOW)
    keys = Keys("s" * 40, clock=clock)
    cookie = keys.new_session()
    nonce = keys.session_nonce(cookie)
    assert nonce is not None and nonce in cookie and "s" * 40 not in cookie
    assert keys.session_nonce(cookie + "0") is None and keys.session_nonce(None) is None
    assert Keys("t" * 40).session_nonce(cookie) is None  # another secret: signed out
    token = keys.csrf_token(nonce, "card.archive")
    assert keys.csrf_problem(nonce, "card.archive", token) is None
    assert "not from this session" in str(keys.csrf_problem(nonce, "card.move", token))
    assert "not from this session" in str(keys.csrf_problem("other", "card.archive", token))
    assert "no CSRF token" in str(keys.csrf_problem(nonce, "card.archive", ""))
    clock.advance(keys.csrf_ttl + 1)
    assert "older than" in str(keys.csrf_problem(nonce, "card.archive", token))
    assert keys.is_secret("s" * 40) and not keys.is_secret("s" * 39) and not keys.is_secret(None)
    assert "s" * 40 not in repr(keys)


# -- inert text -------------------------------------------------------------------------------


def test_terminal_escapes_and_controls_are_removed() -> None:
    raw = (
        b"\x1b[31mred\x1b[0m \x1b]0;title\x07plain \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\"
        b" \x1b(Bok\x00\x07\x7f \xff\xfe end\n"
    )
    assert inert(raw) == "red plain link ok \ufffd\ufffd end\n"


def test_a_carriage_return_overwrites_like_a_terminal() -> None:
    assert clean("10%\r50%\r100%\ndone\r\n") == "100%\ndone\n"
    assert clean("tab\tkept\n") == "tab\tkept\n"


def test_an_unterminated_osc_eats_only_its_line() -> None:
    assert clean("\x1b]0;never ends\nnext line\n") == "\nnext line\n"


def test_the_chunker_returns_whole_lines_and_counts_offsets() -> None:
    chunker = LogChunker(100)
    assert chunker.feed(b"one\ntw") == b"one\n" and chunker.offset == 104
    assert chunker.pending == 2
    assert chunker.feed("o é".encode()[:4]) == b"" and chunker.offset == 104
    assert chunker.feed("o é\n".encode()[4:]) == "two é\n".encode()
    assert chunker.finish() == b"" and chunker.offset == 100 + len("one\ntwo é\n".encode())


def test_the_chunker_cuts_a_line_that_never_ends() -> None:
    chunker = LogChunker()
    assert chunker.feed(b"x" * (64 * 1024)) == b"x" * (64 * 1024)
    assert chunker.feed(b"tail") == b"" and chunker.finish() == b"tail"


def test_a_tail_starts_after_the_first_newline_unless_at_the_start() -> None:
    assert tail_start(b"abc\ndef", 0) == 0
    assert tail_start(b"bc\ndef\n", 10) == 13
    assert tail_start(b"no newline", 10) == 20


# -- the board's order ------------------------------------------------------------------------


def _card(card_id: str, status: CardStatus, **kw: object) -> Card:
    fields: dict[str, object] = {
        "id": card_id,
        "title": card_id,
        "body": "",
        "assignee": "a",
        "status": status,
        "priority": 0,
        "created_at": NOW,
        "updated_at": NOW,
        **kw,
    }
    return Card(**fields)  # type: ignore[arg-type]


def test_rank_orders_like_the_board() -> None:
    cards = [
        _card("c_old", CardStatus.READY, created_at=NOW - 5),
        _card("c_new", CardStatus.READY),
        _card("c_high", CardStatus.READY, priority=3),
        _card("c_neg", CardStatus.READY, priority=-2, created_at=NOW - 99),
    ]
    ordered = sorted(cards, key=views.rank)
    assert [c.id for c in ordered] == ["c_high", "c_old", "c_new", "c_neg"]
    done = [
        _card("c_d1", CardStatus.DONE, completed_at=NOW - 10),
        _card("c_d2", CardStatus.DONE, completed_at=NOW),
    ]
    assert [c.id for c in sorted(done, key=views.rank)] == ["c_d2", "c_d1"]


def test_columns_count_what_they_do_not_show() -> None:
    done = [_card(f"c_{i:04d}", CardStatus.DONE, completed_at=NOW + i) for i in range(60)]
    tiles = views.tiles(done[-views.DONE_PAGE :], [], local_host="h", limit_for=lambda _a: 3)
    columns = views.columns(tiles, {CardStatus.DONE: 120}, done_offset=50)
    done_column = next(c for c in columns if c.status == "done")
    assert done_column.total == 120 and done_column.hidden == 120 - views.DONE_PAGE
    assert done_column.tiles[0].id == "c_0059" and done_column.offset == 50
    assert [c.status for c in columns] == ["todo", "ready", "running", "blocked", "review", "done"]


def test_times_read_like_the_cli() -> None:
    from dispatcher.timefmt import span

    env = render.environment()
    assert [env.filters["span"](s) for s in (None, 5, 72, 7500, 3 * 86400 + 3600)] == [
        "-",
        *(span(s) for s in (5, 72, 7500, 3 * 86400 + 3600)),
    ]


# -- --listen and Host ------------------------------------------------------------------------


def test_listen_addresses_parse_and_loopback_is_judged() -> None:
    assert parse_listen("127.0.0.1:8470").loopback
    assert parse_listen("localhost:0").host == "127.0.0.1"
    six = parse_listen("[::1]:9000")
    assert six.family == socket.AF_INET6 and six.loopback and six.origin() == "http://[::1]:9000"
    wild = parse_listen("0.0.0.0:8470")
    assert wild.wildcard and not wild.loopback
    for bad in ("8470", "127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000", ":8470"):
        with pytest.raises(ListenRefused) as caught:
            parse_listen(bad)
        assert caught.value.exit_code == 2 and bad in caught.value.message


def test_a_non_loopback_listen_needs_allow_remote() -> None:
    wild = parse_listen("0.0.0.0:8470")
    with pytest.raises(ListenRefused, match="--allow-remote"):
        check_remote(wild, allow_remote=False)
    check_remote(wild, allow_remote=True)
    check_remote(parse_listen("127.0.0.1:1"), allow_remote=False)


def test_the_host_rule_names_this_dashboard_only() -> None:
    keys = Keys("k" * 40)
    hosts = allowed_hosts(parse_listen("127.0.0.1:8470"), 8470)
    access = Access(keys=keys, hosts=hosts, pages_need_secret=False, cookie="c", origin="o")
    for good in ("127.0.0.1:8470", "LOCALHOST:8470", "[::1]:8470"):
        assert access.host_allowed(good)
    for bad in ("evil.example:8470", "127.0.0.1:8471", "127.0.0.1", ""):
        assert not access.host_allowed(bad)
    assert allowed_hosts(parse_listen("0.0.0.0:80"), 80) is None
    named = allowed_hosts(parse_listen("0.0.0.0:80"), 80, ["Board.Example", "proxy:443"])
    assert named is not None and {"board.example:80", "proxy:443"} <= named


def test_next_pages_stay_on_this_site() -> None:
    assert safe_next("/cards/c_1?x=1", "/") == "/cards/c_1?x=1"
    for bad in ("//evil.example/", "https://evil.example/", "/\\evil", "", None, "/a\r\nb"):
        assert safe_next(bad, "/home") == "/home"


# -- metrics ----------------------------------------------------------------------------------


def test_histogram_buckets_are_cumulative() -> None:
    histogram = Histogram((1.0, 5.0))
    for value in (0.5, 1.0, 3.0, 9.0):
        histogram.observe(value)
    family = histogram.family("x_seconds", "x")
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("x_seconds_bucket", "1.0")] == 2
    assert samples[("x_seconds_bucket", "5.0")] == 3
    assert samples[("x_seconds_bucket", "+Inf")] == 4
    assert samples[("x_seconds_count", None)] == 4 and samples[("x_seconds_sum", None)] == 13.5


def test_ready_to_running_is_measured_from_the_last_change_before_the_claim() -> None:
    fold = ReadyToRunning()

    def event(seq: int, kind: str, at: float, run: str | None = None, **data: object) -> Event:
        return Event(seq=seq, card_id="c_1", kind=kind, at=at, run_id=run, data=data)

    for item in (
        event(1, "created", NOW),
        event(2, "claimed", NOW + 2, "r_1"),
        event(3, "spawned", NOW + 2.5, "r_1"),  # 2.5 s after it became ready
        event(4, "tempfail", NOW + 9, "r_1"),
        event(5, "claimed", NOW + 10, "r_2"),
        event(6, "spawn_refused", NOW + 10, "r_2"),  # never ran: not observed
        event(7, "claimed", NOW + 40, "r_3"),
        event(8, "spawned", NOW + 40.1, "r_3"),  # 30.1 s after the refusal left it ready
    ):
        fold.fold(item)
    assert fold.seq == 8
    assert sum(fold.histogram.counts) == 2
    assert fold.histogram.total == pytest.approx(2.5 + 30.1)


def test_the_umask_does_not_widen_the_secret(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        load_secret(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / SECRET_NAME).stat().st_mode) == 0o600


def test_an_unfinished_line_is_let_out_at_a_safe_place() -> None:
    chunker = LogChunker()
    assert chunker.feed("dots ... é".encode()[:-1]) == b""
    assert chunker.flush_partial() == b"dots ... "  # not half of the é
    assert chunker.feed("é".encode()[1:] + b" \x1b[3") == b""
    assert chunker.flush_partial() == "é ".encode()  # not half of the escape
    assert chunker.feed(b"1mred\n") == b"\x1b[31mred\n"
    assert chunker.offset == len("dots ... é \x1b[31mred\n".encode())


def test_the_contrib_unit_serves_loopback_and_passes_the_doctors_checks() -> None:
    import shlex

    from dispatcher.gateway.units import UnitFile, inspect_unit, parse_unit

    path = Path(__file__).resolve().parent.parent / "contrib" / "dispatch-web.service"
    service = parse_unit(path.read_text())["Service"]
    argv = shlex.split(service["ExecStart"][0])
    assert argv[1] == "web" and parse_listen(argv[argv.index("--listen") + 1]).loopback
    checked = inspect_unit(
        UnitFile(path=path, manager="user"), degrade_without_scope=False, current_user="root"
    )
    assert checked["role"] == "other" and checked["checks"]["kill_mode"]["ok"]


def test_web_help_names_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    from dispatcher.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["web", "--help"], environ={})
    assert done.value.code == 0
    text = capsys.readouterr().out
    for option in ("--listen", "--allow-remote", "--allow-host", "--require-secret", "--url"):
        assert option in text
    assert "127.0.0.1:8470" in text and "/metrics" in text


def test_a_tile_shows_a_card_backing_off_with_when() -> None:
    waiting = views.tile(
        _card("c_r1", CardStatus.READY, retry_at=NOW + 40), None, host=None, limit_for=lambda _a: 2
    )
    html = render.Renderer().macro("_tile.html", "tile", waiting, NOW)
    assert "backing off · next try in 40s" in html
    later = render.Renderer().macro("_tile.html", "tile", waiting, NOW + 41)
    assert "backing off" not in later


def test_a_tile_says_when_its_assignee_is_not_configured() -> None:
    """Issue 19 §4: the web tile shows what `kanban list` marks, not only an event."""
    cards = [
        _card("c_gone", CardStatus.READY, assignee="gone"),
        _card("c_here", CardStatus.READY),
        _card("c_done", CardStatus.DONE, assignee="gone", completed_at=NOW),
    ]
    marked = views.tiles(cards, [], local_host="h", limit_for=lambda _a: 3, assignees={"a"})
    assert [t.unconfigured for t in marked] == [True, False, False]
    unknown = views.tiles(cards, [], local_host="h", limit_for=lambda _a: 3)
    assert not any(t.unconfigured for t in unknown)


def test_a_tile_counts_failures_against_its_assignees_own_attempts() -> None:
    """An assignee's ``retry.attempts`` is its cards' limit on the tile, as in ``kanban show``;
    a card's own ``--failure-limit`` still wins."""
    limits = {"a": 5, "b": 2}
    cards = [
        _card("c_a", CardStatus.READY),
        _card("c_b", CardStatus.READY, assignee="b"),
        _card("c_own", CardStatus.READY, failure_limit=9),
    ]
    shown = views.tiles(cards, [], local_host="h", limit_for=limits.__getitem__)
    assert [t.failure_limit for t in shown] == [5, 2, 9]
