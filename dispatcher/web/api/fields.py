"""Parameters and body fields that several operations of the route table share."""

from __future__ import annotations

from dispatcher.kanban.board import FAILURE_LIMIT_RANGE, MAX_BODY, MAX_TITLE, PRIORITY_RANGE
from dispatcher.web.api.spec import Field, Kind, Param

CARD_ID = Param(
    name="card_id",
    where="path",
    required=True,
    description="a card id or a unique prefix (at least 4 characters)",
)
RUN_ID = Param(
    name="run_id", where="path", required=True, description="a run id or a unique prefix"
)
SESSION_ID = Param(
    name="session_id", where="path", required=True, description="a session id or a unique prefix"
)
JOB_ID = Param(name="job_id", where="path", required=True, description="a configured cron job")
LIMIT = Param(
    name="limit",
    kind=Kind.INTEGER,
    default=100,
    minimum=1,
    maximum=1000,
    description="at most this many (default 100)",
)
REDACT = Param(
    name="redact",
    kind=Kind.BOOLEAN,
    default=False,
    description="apply the output hooks (mask secrets), as 'dispatch logs --redact'",
)
TAIL = Param(
    name="tail", kind=Kind.INTEGER, minimum=0, maximum=10**9, description="only the last N lines"
)
START = Param(
    name="start", kind=Kind.INTEGER, default=0, minimum=0, description="the first byte (log offset)"
)
END = Param(
    name="end",
    kind=Kind.INTEGER,
    minimum=0,
    description="the byte after the last one (default: the log's size now)",
)

TITLE = Field(name="title", max_length=MAX_TITLE, description="one line")
ASSIGNEE = Field(name="assignee", max_length=1000, description="a kanban.assignees name")
CARD_BODY = Field(name="body", max_length=MAX_BODY, description="the worker's brief")
PRIORITY = Field(
    name="priority",
    kind=Kind.INTEGER,
    minimum=PRIORITY_RANGE[0],
    maximum=PRIORITY_RANGE[1],
    description="higher = sooner",
)
FAILURE_LIMIT = Field(
    name="failure_limit",
    kind=Kind.INTEGER,
    minimum=FAILURE_LIMIT_RANGE[0],
    maximum=FAILURE_LIMIT_RANGE[1],
    description="overrides kanban.failure_limit",
)


GROUP = Field(
    name="group",
    max_length=1000,
    description='the card\'s group: claims take turns between groups (edit: "" for none)',
)


def required(field: Field) -> Field:
    """The same field, required."""
    return Field(**{**field.__dict__, "required": True})
