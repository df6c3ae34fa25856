"""The status page lists dead notifications (issue 24 §1): what ``notify list --dead`` shows,
with the way to retry, rendered inert."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.launch.outbox import Outbox, Route, Subject
from tests.test_web_http import XSS, Dash


@pytest.fixture
def dash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Dash]:
    board = Dash(tmp_path, capsys)
    try:
        yield board
    finally:
        board.close()


def test_dead_notifications_are_on_the_status_page(dash: Dash) -> None:
    assert "Dead notifications" in dash.client.get("/status").text
    state = dash.source.reader.cluster
    store = state.notify_store()
    outbox = Outbox([Route(events=frozenset({"card.done"}), channels=("hook",))])
    with store.write() as conn:
        outbox.record(conn, "card.done", {"card": {"id": "c_1"}}, Subject(), 1.0)
    (item,) = store.claim(now=2.0, lease=30.0)
    store.settle(item, now=3.0, error=f"HTTP 500 {XSS}", retry_at=None)
    dead = dash.json("notify", "list", "--dead")
    assert [d["id"] for d in dead] == [item.message_id]
    page = dash.client.get("/status").text
    assert item.message_id in page and "dispatch notify retry ID" in page
    assert XSS not in page and "&lt;img" in page
