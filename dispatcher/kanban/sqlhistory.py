"""The board's history and search in SQL: :class:`SqlHistory`, shared by SQLite and PostgreSQL.

The charts' buckets come from the rollup where it holds them (:mod:`dispatcher.rollup`: the
stored answers of settled buckets, exact by triggers); the others are counted, and every read
is a range on an index, never a walk of the whole board or log:

* closed runs by end time (``kanban_runs_closed``, which holds every column the charts read,
  so a month of runs comes from the index alone): streamed once through
  :func:`~dispatcher.kanban.history.run_tally`, the function the in-memory store uses too;
  the runs behind a bar, the timeline (plus the open runs, ``kanban_runs_open``);
* events by sequence number: the log is appended in time order, so the first and the last
  event of a window are found by a binary search on the primary key
  (:meth:`SqlHistory._first_seq`; a margin of :data:`SKEW` covers writers whose clock reading
  and commit are a moment apart), and the window's status changes are counted in the
  database (``GROUP BY`` bucket, kind and the few data fields
  :func:`~dispatcher.kanban.history.transition` reads);
* card search: the statuses' index, the id's primary key; title words are a scan of the
  titles (100,000 cards take tens of milliseconds).

What differs between the two databases is in the class attributes a backend overrides
(:class:`dispatcher.cluster.board.PgBoardStore`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dispatcher.kanban.model import CardStatus
from dispatcher.kanban.rows import CARD_COLUMNS, card_of, run_of
from dispatcher.kanban.sql import SqlBoard, SqlConnection
from dispatcher.rolluptables import STEPS

# The charts', timeline's and search's records and functions are imported where they are used:
# every short write command loads the board store, and none of them reads history (issue 26).
if TYPE_CHECKING:
    from dispatcher.buckets import Bucket, Flows, Window
    from dispatcher.kanban.history import RunLine
    from dispatcher.kanban.search import CardPage, CardQuery

SKEW = 300.0
"""Seconds an event's time may run behind the one appended before it (see the docstring)."""
ROLL_SPANS = 12
"""Spans (two hours each) one :meth:`SqlHistory.roll_up` call stores at most."""

_DATA_KINDS = {
    "from": ("moved", "archived"),
    "to": ("moved",),
    "status": ("created", "unblocked"),
    "by": ("blocked",),
    "outcome": ("exit_ignored",),
}
"""Which kinds' data :func:`~dispatcher.kanban.history.transition` reads each field of."""


class SqlHistory(SqlBoard):
    """The history and search reads of the board store contract, in SQL."""

    BUCKET = "CAST(({column} - ?) / ? AS INTEGER)"
    """The bucket of ``{column}`` given the window's start and step (values are >= start)."""
    JSON_TEXT = "json_extract({column}, '$.{key}')"
    """A text field of a JSON text column."""
    TITLE_HAS = "instr(lower(c.title), ?) > 0"
    """The card's title holds the bound text (lowered ASCII letters)."""
    GREATEST = "max"
    TEXT_ORDER = ""
    """Appended to a text column in ``ORDER BY`` (PostgreSQL: byte order, as SQLite's)."""
    RUN_HOST = "NULL"
    """The column naming a run's host (cluster mode)."""
    rollup_steps: tuple[float, ...] = STEPS
    """The steps whose buckets :meth:`roll_up` stores (tests roll up shorter ones)."""

    def _bucket(self, column: str) -> str:
        return self.BUCKET.format(column=column)

    # -- charts ------------------------------------------------------------------------------

    def run_buckets(self, window: Window, *, assignee: str | None = None) -> list[Bucket]:
        from dispatcher import rollup

        with self.db.read() as conn:
            found = {
                i: rollup.decode_split(text, assignee)
                for i, text in self._stored(conn, "runs", window).items()
            }
            return rollup.assemble(window, found, lambda w: self._count_runs(conn, w, assignee))

    def status_flows(self, window: Window) -> tuple[dict[str, int], list[Flows]]:
        from dispatcher import rollup

        with self.db.read() as conn:
            counts = dict.fromkeys((s.value for s in CardStatus), 0)
            for row in conn.execute("SELECT status, count(*) FROM kanban_cards GROUP BY status"):
                counts[str(row[0])] = int(row[1])
            found = {
                i: rollup.decode_flows(text)
                for i, text in self._stored(conn, "flows", window).items()
            }
            return counts, rollup.assemble(window, found, lambda w: self._count_flows(conn, w))

    def _stored(self, conn: SqlConnection, source: str, window: Window) -> dict[int, str]:
        """The rolled-up answers of ``window``'s buckets (none unless its step is rolled up)."""
        from dispatcher import rollup

        if not rollup.rolled(window, self.rollup_steps):
            return {}
        return rollup.stored(conn, source, window)

    def _count_runs(
        self, conn: SqlConnection, window: Window, assignee: str | None
    ) -> list[Bucket]:
        """:meth:`run_buckets` counted from the runs (one range of ``kanban_runs_closed``)."""
        from dispatcher.kanban.history import run_tally

        join = ""
        params: list[Any] = [window.start, window.end]
        if assignee is not None:
            join = " JOIN kanban_cards c ON c.id = r.card_id AND c.assignee = ?"
            params = [assignee, *params]
        rows = conn.execute(
            "SELECT r.ended_at, r.outcome, r.claimed_at, r.started_at, r.ready_at"  # noqa: S608
            f" FROM kanban_runs r{join} WHERE r.ended_at >= ? AND r.ended_at < ?",
            params,
        )
        return run_tally(window, rows)

    def _count_flows(self, conn: SqlConnection, window: Window) -> list[Flows]:
        """:meth:`status_flows`' changes counted from the events (grouped in the database, over
        the sequence numbers that can hold the window's times) and the deferred closes."""
        from dispatcher.buckets import clamp
        from dispatcher.kanban.history import DATA_KEYS, DEFERRED_CLOSE, STATUS_KINDS, transition

        fields = ", ".join(
            "CASE WHEN e.kind IN ({}) THEN {} END".format(
                ", ".join(f"'{k}'" for k in _DATA_KINDS[key]),
                self.JSON_TEXT.format(column="e.data", key=key),
            )
            for key in DATA_KEYS
        )
        b = self._bucket("e.at")
        kinds = ", ".join(f"'{k}'" for k in sorted({*STATUS_KINDS, "exit_ignored"}))
        flows: list[dict[tuple[str, str], int]] = [{} for _ in range(window.count)]

        def add(bucket: Any, change: tuple[str, str] | None, n: int) -> None:
            if change is not None:
                i = clamp(bucket, window)
                flows[i][change] = flows[i].get(change, 0) + n

        first = self._first_seq(conn, window.start - SKEW)
        last = self._first_seq(conn, window.end + SKEW)
        for row in conn.execute(
            f"SELECT {b}, e.kind, {fields}, count(*) FROM kanban_events e"  # noqa: S608
            f" WHERE e.seq >= ? AND e.seq < ? AND e.at >= ? AND e.at < ? AND e.kind IN ({kinds})"
            f" GROUP BY {', '.join(str(1 + i) for i in range(2 + len(DATA_KEYS)))}",
            [window.start, window.step, first, last, window.start, window.end],
        ):
            data = {k: v for k, v in zip(DATA_KEYS, row[2:-1], strict=True) if v is not None}
            add(row[0], transition(str(row[1]), data), int(row[-1]))
        rb = self._bucket("ended_at")
        for row in conn.execute(
            f"SELECT {rb}, count(*) FROM kanban_runs WHERE ended_at >= ? AND ended_at < ?"  # noqa: S608
            " AND outcome = 'deferred' GROUP BY 1",
            [window.start, window.step, window.start, window.end],
        ):
            add(row[0], transition(DEFERRED_CLOSE, {}), int(row[1]))
        return flows

    # -- the rollup --------------------------------------------------------------------------

    def roll_up(self, now: float, *, spans: int = ROLL_SPANS) -> int:
        from dispatcher import rollup

        with self.db.read() as conn:
            # Nothing before the oldest event: every card begins with one.
            first = conn.execute("SELECT at FROM kanban_events ORDER BY seq LIMIT 1").fetchone()
            oldest = None if first is None else float(first[0]) - SKEW
            todo = rollup.todo(conn, ("runs", "flows"), now, self.rollup_steps, oldest)
        return rollup.roll(self.db, todo[: max(0, spans)], self._roll_span, ("runs", "flows"), now)

    def _roll_span(self, conn: SqlConnection, wanted: list[tuple[float, float]]) -> int:
        """Count and store the answers of ``wanted`` buckets (one span's) that are still
        missing, inside the caller's write transaction (see :mod:`dispatcher.rollup`)."""
        from dispatcher import rollup
        from dispatcher.kanban.history import MEASURES, run_samples

        fine = rollup.fine_window(wanted, self.rollup_steps)
        missing = {}
        for source in ("runs", "flows"):
            have = rollup.present(conn, source, self.rollup_steps, fine.start, fine.end)
            missing[source] = [bucket for bucket in wanted if bucket not in have]
        stored = 0
        if missing["runs"]:
            rows = conn.execute(
                "SELECT r.ended_at, r.outcome, r.claimed_at, r.started_at, r.ready_at, c.assignee"
                " FROM kanban_runs r JOIN kanban_cards c ON c.id = r.card_id"
                " WHERE r.ended_at >= ? AND r.ended_at < ?",
                [fine.start, fine.end],
            ).fetchall()
            keyed = zip(
                (str(row[5]) for row in rows),
                run_samples(tuple(row[:5]) for row in rows),
                strict=True,
            )
            answers = rollup.split_answers(fine, MEASURES, keyed, missing["runs"])
            stored += rollup.store(conn, "runs", answers)
        if missing["flows"]:
            answers = rollup.flow_answers(fine, self._count_flows(conn, fine), missing["flows"])
            stored += rollup.store(conn, "flows", answers)
        return stored

    @staticmethod
    def _first_seq(conn: SqlConnection, at: float) -> int:
        """The smallest sequence number from which every event is at ``at`` or later
        (a binary search on the primary key; events are appended in time order)."""
        # Two statements: SQLite answers min() or max() of the key at once, both together
        # by a scan.
        low = conn.execute("SELECT min(seq) FROM kanban_events").fetchone()
        high = conn.execute("SELECT max(seq) FROM kanban_events").fetchone()
        if low is None or low[0] is None:
            return 0
        lo, hi = int(low[0]), int(high[0]) + 1
        while lo < hi:
            mid = (lo + hi) // 2
            probe = conn.execute(
                "SELECT at FROM kanban_events WHERE seq >= ? ORDER BY seq LIMIT 1", (mid,)
            ).fetchone()
            if probe is None or float(probe[0]) >= at:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # -- runs behind a bar, runs on a timeline -----------------------------------------------

    def runs_in(
        self,
        start: float,
        end: float,
        *,
        ended: bool = False,
        outcome: str | None = None,
        assignee: str | None = None,
        limit: int = 500,
    ) -> list[RunLine]:
        from dispatcher.kanban.history import RunLine

        head = (
            f"SELECT r.*, c.assignee AS card_assignee, c.title AS card_title,"  # noqa: S608
            f" {self.RUN_HOST} AS run_host"
            " FROM kanban_runs r JOIN kanban_cards c ON c.id = r.card_id"
        )
        where, params = "", []
        if outcome is not None:
            where += " AND r.outcome = ?"
            params.append(outcome)
        if assignee is not None:
            where += " AND c.assignee = ?"
            params.append(assignee)
        limit = max(0, int(limit))
        with self.db.read() as conn:
            if ended:
                rows = conn.execute(
                    f"{head} WHERE r.ended_at >= ? AND r.ended_at < ?{where}"
                    " ORDER BY r.ended_at, r.run_id LIMIT ?",
                    [start, end, *params, limit],
                ).fetchall()
            else:
                rows = conn.execute(
                    f"{head} WHERE r.ended_at >= ? AND r.claimed_at < ?{where}"
                    " ORDER BY r.claimed_at, r.run_id LIMIT ?",
                    [start, end, *params, limit],
                ).fetchall()
                rows += conn.execute(
                    f"{head} WHERE r.outcome IS NULL AND r.claimed_at < ?{where}"
                    " ORDER BY r.claimed_at, r.run_id LIMIT ?",
                    [end, *params, limit],
                ).fetchall()
                rows.sort(key=lambda row: (row["claimed_at"], row["run_id"]))
        return [
            RunLine(
                run=run_of(row),
                assignee=row["card_assignee"],
                title=row["card_title"],
                host=row["run_host"],
            )
            for row in rows[:limit]
        ]

    # -- search ------------------------------------------------------------------------------

    def search_cards(self, query: CardQuery) -> CardPage:
        from dispatcher.kanban import search

        clauses: list[str] = []
        params: list[Any] = []
        if query.statuses:
            clauses.append(f"c.status IN ({', '.join('?' for _ in query.statuses)})")
            params += [s.value for s in query.statuses]
        else:
            clauses.append("c.status != 'archived'")
        if query.id_prefix:
            clauses.append(self.PREFIX_MATCH.format(column="c.id"))
            params.append(search.CARD_PREFIX + query.id_prefix)
        if query.assignee is not None:
            clauses.append("c.assignee = ?")
            params.append(query.assignee)
        if query.group is not None:
            clauses.append("c.group_name = ?")
            params.append(query.group)
        if query.changed_after is not None:
            clauses.append("c.updated_at >= ?")
            params.append(query.changed_after)
        if query.created_after is not None:
            clauses.append("c.created_at >= ?")
            params.append(query.created_after)
        for word in query.words:
            clauses.append(self.TITLE_HAS)
            params.append(search.fold(word))
        where = " AND ".join(clauses)
        column = "c." + search.SORT_COLUMNS[query.sort]
        if query.sort in (search.SortKey.TITLE, search.SortKey.STATUS, search.SortKey.ASSIGNEE):
            column += self.TEXT_ORDER
        way = " DESC" if query.descending else ""
        with self.db.read() as conn:
            total = conn.execute(
                f"SELECT count(*) FROM kanban_cards c WHERE {where}",  # noqa: S608
                params,
            ).fetchone()[0]
            # The page's ids first (sorting ids, not whole cards, halves the time on a big
            # board), then those cards.
            ids = (
                []
                if query.offset >= total
                else [
                    str(row[0])
                    for row in conn.execute(
                        f"SELECT c.id FROM kanban_cards c WHERE {where}"  # noqa: S608
                        f" ORDER BY {column}{way}, c.id{self.TEXT_ORDER}{way} LIMIT ? OFFSET ?",
                        [*params, query.limit, query.offset],
                    )
                ]
            )
            marks = ", ".join("?" for _ in ids) or "NULL"
            rows = {
                row["id"]: row
                for row in conn.execute(
                    f"SELECT {CARD_COLUMNS} FROM kanban_cards WHERE id IN ({marks})",  # noqa: S608
                    ids,
                )
            }
            parents = self._parents(conn, ids)
        cards = [card_of(rows[i], parents.get(i, [])) for i in ids if i in rows]
        return search.CardPage(cards, int(total))
