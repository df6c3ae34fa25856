"""Where named limits and groups show: ``kanban list/show/board`` (text and ``--json``),
``dispatch limits``, the web's board tile, status page and ``/metrics``; bad groups refused.

A limit is filled by a real claim on the state database (a run of this test process, so no
reconcile closes it), and every reader is the real command or page."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from dispatcher.app.database import open_state
from dispatcher.cli.main import main
from dispatcher.config import load_config
from dispatcher.cron.changes import FireChange
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.records import Kind, Status
from dispatcher.kanban.model import Limits, NewCard
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant
from dispatcher.web.app import create_app, create_site
from dispatcher.web.guard import Access, cookie_name
from dispatcher.web.keys import Keys, load_secret
from dispatcher.web.server import allowed_hosts, parse_listen
from dispatcher.web.source import Source
from tests.support.env import no_bus_env

BASE = "http://127.0.0.1:8471"
CONFIG = """
limits:
  openai: {concurrency: 1, rate: 10/1m}
  tenants: {per_group: {concurrency: 2}}
kanban:
  assignees:
    coder: {command: ["true"], uses: [openai, tenants]}
cron:
  jobs:
    - {id: release, schedule: "0 3 * * *", command: ["true"], uses: [openai]}
"""
WAIT = "limit openai (1 of 1 running)"


class Rig:
    """A state dir whose ``openai`` limit is full, the CLI on it and a dashboard."""

    def __init__(self, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.config = root / "config.yaml"
        self.config.write_text(CONFIG)
        self.state = root / "state"
        self.env = no_bus_env(root)
        settings = load_config(self.config).settings
        with open_state(self.state) as db:
            board = SqliteBoardStore(db)
            now = time.time()
            holder, _ = board.add_card(NewCard(title="holder", assignee="coder"), now=now)
            wants = tuple(settings.limits.items())
            claim = board.claim(
                holder.id,
                now=now,
                claimer=Claimant.current(),
                limits=Limits(max_in_progress=9, wants=wants),
            )
            assert claim.run is not None
            self.holder = holder.id
        self.source = Source(settings, self.state, self.env, config_path=self.config)
        listen = parse_listen("127.0.0.1:8471")
        access = Access(
            keys=Keys(load_secret(self.state)),
            hosts=allowed_hosts(listen, 8471),
            pages_need_secret=False,
            cookie=cookie_name(8471),
            origin=BASE,
        )
        self.client = TestClient(create_app(create_site(self.source, access)), base_url=BASE)

    def cli(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(
            ["--config", str(self.config), "--state-dir", str(self.state), *argv],
            environ=self.env,
        )
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str) -> Any:
        code, out, err = self.cli(*argv, "--json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def rig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Rig]:
    made = Rig(tmp_path, capsys)
    yield made
    made.client.close()
    made.source.close()


def test_a_card_waiting_on_a_limit_says_so_everywhere(rig: Rig) -> None:
    code, out, err = rig.cli("kanban", "add", "next", "--assignee", "coder", "--group", "c-42")
    assert code == 0, err
    card_id = out.strip()
    listed = {c["id"]: c for c in rig.json("kanban", "list")}
    assert listed[card_id]["group"] == "c-42"
    assert listed[card_id]["waiting"]["text"] == WAIT
    assert listed[card_id]["waiting"]["limit"] == "openai"
    assert listed[rig.holder]["waiting"] is None  # running: it holds the limit
    assert f"[waiting: {WAIT}]" in rig.cli("kanban", "list")[1]
    shown = rig.cli("kanban", "show", card_id)[1]
    assert f"waiting   {WAIT}" in shown and "group c-42" in shown
    assert rig.json("kanban", "show", card_id)["waiting"]["text"] == WAIT
    assert f"[c-42] [waiting: {WAIT}]" in rig.cli("kanban", "board")[1]
    board = rig.json("kanban", "board")
    assert board["ready"][0]["waiting"]["text"] == WAIT
    page = rig.client.get("/").text
    assert f"waiting: {WAIT}" in page and ">c-42<" in page
    page = rig.client.get(f"/cards/{card_id}").text
    assert f'<p class="wait">waiting: {WAIT}</p>' in page
    assert "<span>group <b>c-42</b></span>" in page


def test_dispatch_limits_lists_use_capacity_window_and_what_waits(rig: Rig) -> None:
    card_id = rig.cli("kanban", "add", "next", "--assignee", "coder")[1].strip()
    with open_state(rig.state) as db:
        ledger = Ledger(db)
        with ledger.transaction() as tx:
            fire = tx.insert(
                fire_key="release@x",
                job_id="release",
                kind=Kind.SCHEDULE,
                nominal_wall="x",
                zone="UTC",
                nominal=1.0,
                decided_at=1.0,
                status=Status.CLAIMED,
            )
        assert fire is not None
        ledger.update(fire, (Status.CLAIMED,), FireChange(error=f"waiting: {WAIT}"))
    doc = {entry["name"]: entry for entry in rig.json("limits")}
    openai = doc["openai"]
    assert (openai["in_use"], openai["capacity"], openai["scope"]) == (1, 1, "cluster")
    assert (openai["window_starts"], openai["window_capacity"], openai["rate"]) == (1, 10, "10/1m")
    assert openai["waiting_cards"] == 1 and openai["waiting"][0]["id"] == card_id
    assert openai["waiting"][0]["wait"] == WAIT
    assert [f["fire_key"] for f in openai["waiting_fires"]] == ["release@x"]
    tenants = doc["tenants"]
    assert tenants["busiest_groups"] == [{"group": None, "in_use": 1, "capacity": 2}]
    text = rig.cli("limits")[1]
    assert "openai" in text and "in use 1 of 1" in text and "starts 1 of 10/1m" in text
    assert f"waiting cards: 1 ({card_id})" in text and "waiting cron fire: release@x" in text
    status = rig.client.get("/status").text
    assert 'id="limit-openai"' in status and f"{card_id}</a> {WAIT}" in status
    metrics = {
        (sample.name, sample.labels.get("limit")): sample.value
        for family in text_string_to_metric_families(rig.client.get("/metrics").text)
        for sample in family.samples
    }
    assert metrics[("dispatch_limit_in_use", "openai")] == 1
    assert metrics[("dispatch_limit_capacity", "openai")] == 1
    assert metrics[("dispatch_limit_waiting", "openai")] == 2
    assert metrics[("dispatch_limit_window_starts", "openai")] == 1
    assert metrics[("dispatch_limit_window_capacity", "openai")] == 10
    assert ("dispatch_limit_capacity", "tenants") not in metrics


@pytest.mark.parametrize("group", ["bad\x1bname", "two\nlines", " ", "x" * 101])
def test_a_bad_group_is_one_line_exit_2_and_stores_nothing(rig: Rig, group: str) -> None:
    before = rig.json("kanban", "list")
    code, out, err = rig.cli("kanban", "add", "t", "--assignee", "coder", "--group", group)
    assert code == 2 and out == "" and err.count("\n") == 1 and "--group" in err
    assert rig.json("kanban", "list") == before
    code, out, err = rig.cli("kanban", "list", "--group", group)
    assert code == 2 and out == "" and err.count("\n") == 1 and "--group" in err


def test_kanban_list_group_is_the_api_group_filter(rig: Rig) -> None:
    made = [
        rig.cli("kanban", "add", t, "--assignee", "coder", "--group", g)[1].strip()
        for t, g in (("a", "c-42"), ("b", "c-7"), ("c", "c-42"))
    ]
    listed = rig.json("kanban", "list", "--group", " c-42 ")
    assert sorted(c["id"] for c in listed) == sorted([made[0], made[2]])
    assert rig.json("kanban", "list", "--group", "nobody") == []
    token = rig.cli("web", "token", "create", "--name", "ci", "--scope", "read")[1].strip()
    answer = rig.client.get(
        "/api/v1/cards?group=c-42", headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200 and answer.json() == listed
