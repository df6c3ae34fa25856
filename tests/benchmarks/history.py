"""A state database with a long history, written fast: the charts, timeline and search
benchmarks' data.

Rows are inserted with plain SQL in big batches (a million runs through the board's own calls
would take hours), in the shape the board and the ledger write them: every card has a
``created`` event, every run its ``claimed`` and (when its worker started) ``spawned`` event and
the event its end records (none for a ``deferred`` close), a done card's next run comes after
an operator's retry, all in time order, so the events count back to the cards' statuses; cron
fires are the ledger's settled rows. The mix of outcomes is a busy but healthy board's.
"""

from __future__ import annotations

import random
from pathlib import Path

from dispatcher.app.database import open_state

DAY = 86400.0
OUTCOMES = (
    ("completed", 0.85, "completed"),
    ("failed", 0.07, "failed"),
    ("tempfail", 0.03, "tempfail"),
    ("spawn_refused", 0.02, "spawn_refused"),
    ("oom_killed", 0.01, "failed"),
    ("timed_out", 0.01, "failed"),
    ("deferred", 0.01, None),
)
"""(run outcome, share, the kind of the event its close writes)."""
ASSIGNEES = ("build", "test", "deploy", "report", "sync")
JOBS = ("nightly", "hourly", "backup", "rotate", "digest")
GROUPS = 40
"""Card groups (``customer-0`` ...): a third of the cards are in one."""


def _outcome(rng: random.Random) -> tuple[str, str | None]:
    pick = rng.random()
    for outcome, share, kind in OUTCOMES:
        if pick < share:
            return outcome, kind
        pick -= share
    return "completed", "completed"


def fill(
    state: Path,
    *,
    runs: int,
    cards: int,
    days: float,
    now: float,
    fires: int = 0,
    seed: int = 1,
    finished: bool = False,
) -> None:
    """``runs`` runs of ``cards`` cards, spread evenly over the ``days`` before ``now``, and
    ``fires`` settled cron fires over the same time. ``finished``: every card ends done (an
    operator moved the unfinished ones), so a gateway on the state has nothing to claim."""
    rng = random.Random(seed)
    start = now - days * DAY
    gap = days * DAY / runs
    card_ids = [f"c_{i:010x}" for i in range(cards)]
    card_rows, run_rows, events = [], [], []
    last: dict[str, tuple[str, float]] = {}
    for i in range(runs):
        at = start + i * gap
        card = card_ids[i % cards]
        if card not in last:
            card_rows.append(card)
            events.append((card, None, "created", at - 1, '{"status": "ready"}'))
        elif last[card][0] == "completed":
            # A done card runs again after an operator's retry.
            retry = '{"from": "done", "to": "ready", "by": "operator", "action": "retry"}'
            events.append((card, None, "moved", at - 0.5, retry))
        run_id = f"r_{i:010x}"
        outcome, kind = _outcome(rng)
        started = None if outcome == "spawn_refused" else at + 0.05 + rng.random() * 0.2
        ended = at + 0.5 + rng.expovariate(1 / 60.0) if started else at + 0.1
        ended = min(ended, now - 1)
        events.append((card, run_id, "claimed", at, "{}"))
        if started is not None:
            events.append((card, run_id, "spawned", started, "{}"))
        if kind is not None:
            events.append((card, run_id, kind, ended, f'{{"outcome": "{outcome}"}}'))
        run_rows.append((run_id, card, i // cards + 1, outcome, at, started, ended))
        last[card] = (outcome, ended)
    if finished:
        for card, (outcome, ended) in last.items():
            if outcome != "completed":
                moved = '{"from": "ready", "to": "done", "by": "operator"}'
                events.append((card, None, "moved", ended + 0.5, moved))
                last[card] = ("completed", ended + 0.5)
    events.sort(key=lambda e: e[3])
    with open_state(state) as db, db.write() as conn:
        conn.executemany(
            "INSERT INTO kanban_cards (id, title, body, assignee, status, priority, created_at,"
            " updated_at, completed_at, group_name) VALUES (?, ?, '', ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    card,
                    f"{('deploy', 'build', 'report', 'sync')[n % 4]} {n} of the fleet",
                    ASSIGNEES[n % len(ASSIGNEES)],
                    "done" if last[card][0] == "completed" else "ready",
                    n % 3,
                    start + n * gap - 1,
                    last[card][1],
                    last[card][1] if last[card][0] == "completed" else None,
                    # A third of the cards in one of GROUPS customers' groups.
                    f"customer-{n % GROUPS}" if n % 3 == 0 else None,
                )
                for n, card in enumerate(card_rows)
            ],
        )
        conn.executemany(
            "INSERT INTO kanban_runs (run_id, card_id, attempt, outcome, claimed_at, started_at,"
            " ended_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            run_rows,
        )
        conn.executemany(
            "INSERT INTO kanban_events (card_id, run_id, kind, at, data) VALUES (?, ?, ?, ?, ?)",
            events,
        )
        _fires(conn, rng, fires, start, days)


def _fires(conn: object, rng: random.Random, fires: int, start: float, days: float) -> None:
    if not fires:
        return
    gap = days * DAY / fires
    rows = []
    for i in range(fires):
        due = start + i * gap
        job = JOBS[i % len(JOBS)]
        if rng.random() < 0.03:
            rows.append((f"{job}@{i}", job, due, due, due, None, None, None, "skipped_overlap"))
            continue
        began = due + rng.random() * 0.5
        ended = began + rng.expovariate(1 / 20.0)
        outcome = "completed" if rng.random() < 0.95 else "failed"
        rows.append((f"{job}@{i}", job, due, due, due, began, began, ended, outcome))
    conn.executemany(  # type: ignore[attr-defined]
        "INSERT INTO cron_fires (fire_key, job_id, kind, nominal_wall, zone, nominal,"
        " decided_at, due_at, actual, started_at, ended_at, status, outcome)"
        " VALUES (?, ?, 'schedule', '2026-01-01T00:00:00', 'UTC', ?, ?, ?, ?, ?, ?, 'done', ?)",
        rows,
    )
