"""The JSON schemas (2020-12, as OpenAPI 3.1 uses them) of the documents the API answers with.

They describe the CLI's ``--json`` documents (:mod:`dispatcher.app.documents` and the record
builders it names): every key a document always has is required, with its type; ``null``
where the CLI prints null. Objects allow more keys, so a document that gains a field stays
valid for old clients. The OpenAPI generator puts them under ``components.schemas`` and the
property-based test checks every answer of the live server against them.
"""

from __future__ import annotations

from typing import Any

from dispatcher.kanban.model import CardStatus
from registry.abc import SessionState

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
NUMBER: Schema = {"type": "number"}
BOOLEAN: Schema = {"type": "boolean"}
TIME: Schema = {"type": ["string", "null"], "description": "ISO-8601 with a numeric offset"}


def nullable(kind: str) -> Schema:
    """``kind`` or null."""
    return {"type": [kind, "null"]}


def obj(properties: dict[str, Schema], *, optional: tuple[str, ...] = ()) -> Schema:
    """An object whose properties are all required except ``optional``."""
    return {
        "type": "object",
        "properties": properties,
        "required": [name for name in properties if name not in optional],
    }


def array(items: Schema) -> Schema:
    """A JSON array of ``items``."""
    return {"type": "array", "items": items}


def ref(name: str) -> Schema:
    """A reference to ``components.schemas.NAME``."""
    return {"$ref": f"#/components/schemas/{name}"}


CARD = obj(
    {
        "id": STRING,
        "title": STRING,
        "body": STRING,
        "assignee": STRING,
        "group": nullable("string"),
        "status": {"type": "string", "enum": [s.value for s in CardStatus]},
        "priority": INTEGER,
        "created_at": TIME,
        "updated_at": TIME,
        "started_at": TIME,
        "completed_at": TIME,
        "consecutive_failures": INTEGER,
        "failure_limit": nullable("integer"),
        "last_failure_error": nullable("string"),
        "block_kind": nullable("string"),
        "blocked_until": TIME,
        "current_run_id": nullable("string"),
        "idempotency_key": nullable("string"),
        "parents": array(STRING),
        "tempfail_count": INTEGER,
        "retry_at": TIME,
        "cooldown_until": TIME,
        "result": nullable("string"),
    }
)
WAITING: Schema = {
    "description": "the full named limit a ready card waits for (dispatch limits); null: none",
    "type": ["object", "null"],
    "properties": {
        "limit": STRING,
        "kind": {"type": "string", "enum": ["concurrency", "group", "rate"]},
        "in_use": INTEGER,
        "capacity": INTEGER,
        "group": nullable("string"),
        "next_start_in": nullable("integer"),
        "text": STRING,
    },
    "required": ["limit", "kind", "in_use", "capacity", "group", "next_start_in", "text"],
}
LISTED_CARD: Schema = {
    "allOf": [
        ref("Card"),
        obj({"assignee_configured": nullable("boolean"), "waiting": WAITING}),
    ],
}
RESOURCES: dict[str, Schema] = {
    "resources": {
        "type": ["object", "null"],
        "description": "the class its scope got (class, limits, not_enforced); null: no scope",
    },
    "memory_peak": {"type": ["integer", "null"], "description": "bytes, once it ended"},
    "cpu_time": {"type": ["number", "null"], "description": "seconds, once it ended"},
}
"""A run's or fire's resources (docs/resources.md); present where the document has them."""

RUN = obj(
    {
        "run_id": STRING,
        "card_id": STRING,
        "attempt": INTEGER,
        "outcome": nullable("string"),
        "exit_code": nullable("integer"),
        "signal": nullable("string"),
        "session_id": nullable("string"),
        "placement": nullable("string"),
        "unit": nullable("string"),
        "claimed_at": TIME,
        "started_at": TIME,
        "ended_at": TIME,
        "error": nullable("string"),
        "infrastructure": BOOLEAN,
        "host": nullable("string"),
        **RESOURCES,
    },
    optional=("host", *RESOURCES),
)
EVENT = obj(
    {
        "id": {"type": "string", "description": "the event's sequence number: the cursor"},
        "card_id": STRING,
        "run_id": nullable("string"),
        "kind": STRING,
        "at": TIME,
        "data": {"type": "object"},
    }
)
CARD_SHOWN: Schema = {
    "allOf": [
        ref("Card"),
        obj(
            {
                "retry": nullable("object"),
                "runs": array(ref("Run")),
                "events": array(ref("Event")),
                "waiting": WAITING,
            }
        ),
    ]
}
ADDED = obj({"id": STRING})
SESSION = obj(
    {
        "id": STRING,
        "state": {"type": "string", "enum": [s.value for s in SessionState]},
        "argv": array(STRING),
        "pid": nullable("integer"),
        "placement": STRING,
        "unit": nullable("string"),
        "owner": STRING,
        "started_at": TIME,
        "finished_at": TIME,
        "exit_code": nullable("integer"),
        "signal": nullable("string"),
        "completion_reason": nullable("string"),
        "log_path": nullable("string"),
    }
)
OUTPUT = obj({"id": STRING, "log_path": nullable("string"), "bytes": INTEGER, "output": STRING})
OUTPUT_CHUNK = obj({"id": STRING, "offset": INTEGER, "output": STRING})
CRON_JOB = obj(
    {
        "id": STRING,
        "schedule": nullable("string"),
        "timezone": nullable("string"),
        "paused": BOOLEAN,
        "active": BOOLEAN,
        "next_fire": TIME,
        "last_outcome": nullable("string"),
        "last_fire": TIME,
        "warnings": array(STRING),
    }
)
FIRE = obj(
    {
        "job_id": STRING,
        "fire_key": STRING,
        "kind": STRING,
        "nominal": TIME,
        "actual": TIME,
        "outcome": nullable("string"),
        "placement": nullable("string"),
        "session_id": nullable("string"),
        "exit_code": nullable("integer"),
        "signal": nullable("string"),
        "started_at": TIME,
        "ended_at": TIME,
        "error": nullable("string"),
        "infrastructure": BOOLEAN,
        "catch_up": BOOLEAN,
        "host": nullable("string"),
        **RESOURCES,
    },
    optional=("host", *RESOURCES),
)
PAUSED = obj({"id": STRING, "paused": BOOLEAN, "changed": BOOLEAN})
LIMIT = obj(
    {
        "name": STRING,
        "scope": {"type": "string", "enum": ["cluster", "host"]},
        "concurrency": nullable("integer"),
        "rate": nullable("string"),
        "per_group": nullable("integer"),
        "in_use": INTEGER,
        "capacity": nullable("integer"),
        "window_starts": nullable("integer"),
        "window_capacity": nullable("integer"),
        "window_seconds": nullable("number"),
        "next_start_in": nullable("integer"),
        "waiting_cards": INTEGER,
        "waiting": array(obj({"id": STRING, "title": STRING, "wait": STRING})),
        "waiting_fires": array(
            obj({"id": STRING, "fire_key": STRING, "job": STRING, "wait": nullable("string")})
        ),
        "busiest_groups": array(
            obj({"group": nullable("string"), "in_use": INTEGER, "capacity": INTEGER})
        ),
    }
)
HOST = obj(
    {
        "host_id": STRING,
        "boot_id": STRING,
        "version": STRING,
        "epoch": INTEGER,
        "last_heartbeat": TIME,
        "lease_until": TIME,
        "lease": {"type": "string", "enum": ["live", "expired"]},
        "running_runs": INTEGER,
        "skew": nullable("number"),
    }
)
STATUS = obj(
    {
        "serve": obj({"running": BOOLEAN}),
        "placement": {"type": "object"},
        "workers": obj({"running": INTEGER, "by_kind": {"type": "object"}}),
        "cards": {"type": "object"},
        "kanban_paused": BOOLEAN,
        "next_cron_fires": {"type": ["array", "null"]},
        "recent_errors": array({"type": "object"}),
        "cron_paused": array(
            obj(
                {
                    "job_id": STRING,
                    "by": {"type": "string", "enum": ["operator", "dispatch"]},
                    "paused_at": TIME,
                    "reason": nullable("string"),
                }
            )
        ),
        "cluster": {"type": ["object", "null"]},
        "admission": obj({"enabled": BOOLEAN, "held": BOOLEAN, "reason": STRING}),
    }
)
DELIVERY = obj(
    {
        "id": STRING,
        "channel": STRING,
        "event": STRING,
        "created_at": TIME,
        "state": {"type": "string", "enum": ["pending", "delivered", "dead"]},
        "attempts": INTEGER,
        "next_at": TIME,
        "last_error": nullable("string"),
        "delivered_at": TIME,
    }
)
RETRIED = obj({"id": STRING, "rows": INTEGER})
PROBLEM = obj(
    {
        "type": STRING,
        "title": STRING,
        "status": INTEGER,
        "detail": {"type": "string", "description": "the CLI's one-line message"},
        "remedy": nullable("string"),
    },
    optional=("remedy",),
)

COMPONENTS: dict[str, Schema] = {
    "Card": CARD,
    "ListedCard": LISTED_CARD,
    "CardShown": CARD_SHOWN,
    "Run": RUN,
    "Event": EVENT,
    "Added": ADDED,
    "Session": SESSION,
    "Output": OUTPUT,
    "OutputChunk": OUTPUT_CHUNK,
    "CronJob": CRON_JOB,
    "Fire": FIRE,
    "Paused": PAUSED,
    "Host": HOST,
    "Limit": LIMIT,
    "Status": STATUS,
    "Delivery": DELIVERY,
    "Retried": RETRIED,
    "Problem": PROBLEM,
}
"""Every named schema (``#/components/schemas/NAME``)."""
