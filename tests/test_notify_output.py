"""Notifications carry the end of the worker's output: the message of a run's or a fire's end
has the last ``notify.output_tail`` bytes, read through the registry (the transform and
redaction hooks applied), cut at a whole line, and ``output_cut`` when earlier output was left
out; a Slack body shows it in a code block, inert."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.config import parse_config
from dispatcher.launch.outbox import capped
from dispatcher.notify.sender import slack_text
from scope.foundation.errors import ConfigError
from tests.support.wait import wait_for
from tests.test_notify import receiving

SECRET = "sekrit-4711"


@pytest.mark.parametrize(
    ("text", "cut", "limit", "shown", "was_cut"),
    [
        ("a\nb\n", False, 10, "a\nb\n", False),
        ("a\nb\n", True, 10, "b\n", True),  # the reader cut it: start at a whole line
        ("one\ntwo\nthree\n", False, 8, "three\n", True),
        ("one\ntwo\nthree\n", False, 3, "ee\n", True),  # no whole line fits: its end
        ("x\né€\n", False, 5, "€\n", True),  # a character split by the cut is dropped whole
        ("abc", False, 0, "", True),
    ],
)
def test_a_tail_is_capped_in_bytes_at_a_whole_line(
    text: str, cut: bool, limit: int, shown: str, was_cut: bool
) -> None:
    tail = capped(text, cut, limit)
    assert (tail.text, tail.cut) == (shown, was_cut)


@given(st.text(), st.booleans(), st.integers(min_value=0, max_value=64))
def test_a_capped_tail_is_an_end_of_the_text_within_the_limit(
    text: str, cut: bool, limit: int
) -> None:
    tail = capped(text, cut, limit)
    assert len(tail.text.encode()) <= limit or (not cut and tail.text == text)
    assert text.endswith(tail.text)
    assert tail.cut == (cut or len(text.encode()) > limit)


def test_output_tail_is_bounded() -> None:
    base = "notify:\n  output_tail: %s\n"
    assert parse_config(base % "512", "c.yaml").notify.output_tail == 512
    assert parse_config("{}", "c.yaml").notify.output_tail == 2048
    with pytest.raises(ConfigError, match=r"notify\.output_tail: must be at most 16KiB"):
        parse_config(base % "1MiB", "c.yaml")


def test_a_slack_body_shows_the_output_in_a_code_block_inert() -> None:
    message = {
        "event": "card.failed",
        "card": {"id": "c_1", "title": "<!channel> fix", "assignee": "coder"},
        "output": "x ``` y <b>&\n",
        "output_cut": True,
    }
    text = slack_text(message)
    head, rest = text.split("\n", 1)
    assert head == "card.failed: card c_1 '&lt;!channel&gt; fix' (coder)"
    assert rest == "(earlier output cut)\n```\nx `\u200b`` y &lt;b&gt;&amp;\n```"
    assert "```" not in slack_text({"event": "card.added", "card": {"id": "c_2"}})


def test_a_failing_workers_last_lines_arrive_redacted_and_capped(tmp_path: Path) -> None:
    """A real serve, a worker that fails after writing a secret: its message's output is its
    last lines, masked by the configured pattern, at most ``output_tail`` bytes."""
    from dispatcher.app.workspace import Workspace
    from dispatcher.config import load_config
    from dispatcher.gateway.serve import Gateway
    from tests.support.env import no_bus_env

    script = f"for i in $(seq 1 50); do echo line $i; done; echo key {SECRET}; echo last; exit 3"
    with receiving() as receiver:
        url = f"http://127.0.0.1:{receiver.port}"
        config = tmp_path / "config.yaml"
        config.write_text(
            f"kanban:\n  assignees:\n    w: {{command: [sh, -c, '{script}']}}\n"
            "registry: {redact_patterns: ['sekrit-[0-9]+']}\n"
            "notify:\n  output_tail: 40\n"
            f"  channels: {{hook: {{webhook: {{url: '{url}/j'}}}},"
            f" chat: {{webhook: {{url: '{url}/s', format: slack}}}}}}\n"
            "  rules: [{on: [card.failed], to: [hook, chat]}]\n"
        )
        settings = load_config(config).settings
        environ = no_bus_env(tmp_path)
        gateway = Gateway(
            settings=settings, state_dir=tmp_path / "state", environ=environ, config_path=config
        )
        gateway.start()
        try:
            workspace = Workspace(settings, tmp_path / "state", environ=environ)
            try:
                card, _ = workspace.board.add("fails", assignee="w", now=time.time())
            finally:
                workspace.close()

            def delivered() -> bool:
                gateway.step(time.monotonic(), poked=True)  # claim, then settle the failure
                return len(receiver.got) >= 2

            wait_for(delivered, timeout=20, interval=0.1, what="both card.failed posts")
        finally:
            gateway.shutdown()
            gateway.close()
    messages = [json.loads(body) for _, body in receiver.got]
    message = next(m for m in messages if "card" in m)
    assert (message["event"], message["card"]["id"]) == ("card.failed", card.id)
    output = message["output"]
    assert output == "line 48\nline 49\nline 50\nkey ***\nlast\n", output
    assert message["output_cut"] is True and len(output.encode()) <= 40
    slack = next(m["text"] for m in messages if "text" in m)
    assert slack.endswith(
        "(earlier output cut)\n```\nline 48\nline 49\nline 50\nkey ***\nlast\n```"
    )
    assert SECRET not in json.dumps(messages)


def test_a_failed_cron_fire_carries_its_output(tmp_path: Path) -> None:
    """``dispatch cron run --wait`` settles the fire itself: its queued cron.failed message
    carries the worker's output (masked); with ``output_tail: 0`` none."""
    from dispatcher.app.database import open_state
    from dispatcher.cli.main import main
    from dispatcher.notify.store import NotifyStore
    from tests.support.cli import state_env

    config = tmp_path / "config.yaml"
    env = state_env(tmp_path)
    for tail in (2048, 0):
        config.write_text(
            "cron:\n  jobs:\n    - {id: nightly, schedule: '0 3 * * *',"
            f" command: [sh, -c, 'echo password={SECRET}; echo done; exit 4']}}\n"
            f"notify:\n  output_tail: {tail}\n"
            "  channels: {hook: {webhook: {url: 'http://127.0.0.1:9/'}}}\n"
            "  rules: [{on: [cron.failed], to: [hook]}]\n"
        )
        assert main(["--config", str(config), "cron", "run", "nightly", "--wait"], environ=env) == 4
        with open_state(tmp_path / "state") as db:
            (row,) = NotifyStore(db.read, db.write).list()
            with db.write() as conn:
                conn.execute("DELETE FROM notify_outbox")
        body = json.loads(row.body)
        assert (body["event"], body["fire"]["exit_code"]) == ("cron.failed", 4)
        if tail:
            assert (body["output"], body["output_cut"]) == ("password=***\ndone\n", False)
        else:
            assert "output" not in body
