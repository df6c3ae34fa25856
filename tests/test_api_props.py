"""A property-based run of the whole OpenAPI document against a live ``dispatch web``.

For every operation the served ``/api/v1/openapi.json`` describes (streams aside: they never
end; tests/test_api.py reads them), Hypothesis builds requests from the document itself: path
parameters from real ids, their prefixes and generated text; query parameters and JSON bodies
generated from their schemas (:func:`from_schema`, for the subset of JSON Schema the route
table writes, with a share of values outside it). Every answer must be no 5xx, a status
the document lists for that operation, and a body valid against the schema it names (the
problem schema for errors), checked with jsonschema. The server's log must show no bug.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.api import Api, make_token
from tests.support.browser import WebHome, WebProcess
from tests.test_api import CONFIG

EXAMPLES = int(os.environ.get("DISPATCH_API_EXAMPLES", "12"))
"""Requests per operation in the suite (the ``thorough`` profile multiplies them)."""


class Live:
    """A web process with a few cards, a finished session and a cron fire to aim at."""

    def __init__(self, root: Path) -> None:
        self.home = WebHome(root, CONFIG)
        self.home.dispatch("kanban", "list")
        self.web = WebProcess(self.home.config, self.home.state, self.home.env)
        self.api = Api(self.web.url, make_token(self.home, "fuzz", "operate"))
        card = self.api.post("/cards", {"title": "target", "assignee": "echo"}).json["id"]
        self.home.dispatch("kanban", "tick")
        self.doc = self.api.get("/openapi.json").json
        show = self.api.get(f"/cards/{card}").json
        ids = [card, *(r["run_id"] for r in show["runs"])]
        ids += [r["session_id"] for r in show["runs"] if r["session_id"]]
        self.ids = (
            ids + [i[:6] for i in ids] + ["nightly", "c_", "s_zz", "%", "..", "r_" + "f" * 40]
        )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    made = Live(tmp_path_factory.mktemp("props"))
    try:
        yield made
    finally:
        made.api.close()
        for session in made.home.json("ps"):
            made.home.dispatch("kill", session["id"], check=False)
        assert made.web.stop() == 0, made.web.errors


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values for a parameter or body schema of the route table (type, enum, bounds, maxLength,
    object properties, arrays), now and then a value of the wrong type or an unknown field."""
    kind = schema.get("type")
    wrong = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.booleans())
    if "enum" in schema:
        valid: st.SearchStrategy[Any] = st.sampled_from(schema["enum"])
    elif kind == "integer":
        valid = st.integers(schema.get("minimum"), schema.get("maximum"))
    elif kind == "boolean":
        valid = st.booleans()
    elif kind == "string":
        size = min(40, schema.get("maxLength", 40))
        valid = st.text(min_size=schema.get("minLength", 0), max_size=size)
    elif kind == "array":
        valid = st.lists(from_schema(schema["items"]), max_size=3)
    else:
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        valid = st.fixed_dictionaries(
            {k: from_schema(v) for k, v in props.items() if k in required},
            optional={k: from_schema(v) for k, v in props.items() if k not in required},
        )
        extra = st.dictionaries(st.text(max_size=8), wrong, max_size=2)
        return st.one_of(valid, valid, valid, extra, wrong)
    return st.one_of(valid, valid, valid, wrong)


def _operations() -> list[tuple[str, str]]:
    from dispatcher.web.api.table import OPERATIONS

    return [("/api/v1" + op.path, op.method.lower()) for op in OPERATIONS if not op.stream]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _request(draw: Any, live: Live, path: str, op: dict[str, Any]) -> tuple[str, Any]:
    url = path.removeprefix("/api/v1")
    query: list[tuple[str, str]] = []
    for param in op["parameters"]:
        schema = param["schema"]
        if param["in"] == "path":
            value = draw(st.one_of(st.sampled_from(live.ids), from_schema(schema)))
            url = url.replace("{" + param["name"] + "}", urllib.parse.quote(str(value), safe=""))
        elif param["in"] == "query" and draw(st.booleans()):
            value = draw(from_schema(schema))
            values = value if isinstance(value, list) else [value]
            query += [(param["name"], _text(v)) for v in values]
    if query:
        url += "?" + urllib.parse.urlencode(query)
    body = None
    if "requestBody" in op and draw(st.booleans()):
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        body = draw(from_schema(schema))
    return url, body


def _check(live: Live, path: str, method: str, op: dict[str, Any], answer: Any) -> None:
    assert answer.status < 500, (method, path, answer.status, answer.raw[:500])
    documented = op["responses"].get(str(answer.status))
    assert documented is not None, (method, path, answer.status, answer.raw[:500])
    media, content = next(iter(documented["content"].items()))
    assert answer.media == media, (method, path, answer.status, answer.media)
    schema = {**content["schema"], "components": live.doc["components"]}
    jsonschema.validate(answer.json, schema, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize(("path", "method"), _operations())
def test_every_operation_keeps_to_the_document(live: Live, path: str, method: str) -> None:
    op = live.doc["paths"][path][method]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(st.data())
    def run(data: st.DataObject) -> None:
        url, body = _request(data.draw, live, path, op)
        answer = live.api.request(method.upper(), url, body)
        _check(live, url, method, op, answer)

    run()
    bugs = [line for line in live.web.errors if "failed" in line and "authentication" not in line]
    assert not bugs, bugs


def test_the_document_is_valid_openapi_3_1_shape(live: Live) -> None:
    doc = live.doc
    assert doc["openapi"] == "3.1.0" and doc["components"]["securitySchemes"]["bearer"]
    for name, schema in doc["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert json.dumps(schema), name
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["operationId"] and op["responses"], (path, method)
            for param in op.get("parameters", []):
                jsonschema.Draft202012Validator.check_schema(param["schema"])
