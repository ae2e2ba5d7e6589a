"""The OpenAPI documents (``cluster_dq/http/openapi.py``): each port serves one that names every
route of its app, and schemathesis, driven by them, finds against a real ``cluster-dq serve``
on a real Redis no 5xx and no answer (status, content type, headers, body) the document does
not describe. ``DQ_SCHEMATHESIS_EXAMPLES`` sets the examples per operation (default 30)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import httpx
import jsonschema_rs
import pytest
import schemathesis
from schemathesis.generation.stateful import run_state_machine_as_test
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import FlakyStrategyDefinition
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.applications import Starlette
from starlette.routing import Route

from cluster_dq.engine.commands import EngineConfig
from cluster_dq.engine.control import MAX_DEAD_PAGE
from cluster_dq.http.admin import create_admin_app
from cluster_dq.http.app import create_data_app
from cluster_dq.http.middleware import AccessLog
from cluster_dq.http.params import MAX_LIST
from cluster_dq.localredis import Server
from cluster_dq.metrics import SizeBoard
from cluster_dq.pools import RedisPool
from cluster_dq.schedules import MAX_SCHEDULE_PAGE
from cluster_dq.service import Service
from cluster_dq.settings import load
from cluster_dq.testing.service_process import ServiceProcess
from tests.support.run import by_tier

NS = "oas"  # every data request goes to the namespace the suite's token grants
ADMIN_AUTH = ("admin", "s3cret")
# per operation: 10 in the default run (each operation's boundary and explicit cases first,
# then random ones), 75 in the long run
EXAMPLES = int(os.environ.get("DQ_SCHEMATHESIS_EXAMPLES") or by_tier(10, 75))
STATEFUL_RUNS = 3  # runs of the state machine cut short by the server's state (see below)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
ENV = {
    "CLUSTER_DQ_ACCOUNTS__ADMIN": ADMIN_AUTH[1],
    "CLUSTER_DQ_MAXTIMEOUTSECOND": "1",  # the document says so: no long-poll outlasts a second
    "CLUSTER_DQ_LOGLEVEL": "warning",
}


class Running:
    def __init__(self, svc: ServiceProcess, token: str) -> None:
        self.svc, self.token = svc, token


@pytest.fixture(scope="module")
def running(redis_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    log = tmp_path_factory.mktemp("openapi") / "serve.log"
    with ServiceProcess.start(f"127.0.0.1:{redis_server.port}", env=ENV, log=log) as svc:
        r = httpx.post(f"{svc.admin}/token/{NS}", params={"description": "oas"}, auth=ADMIN_AUTH)
        assert r.status_code == 201, r.text
        yield Running(svc, r.json()["token"])
        assert "Traceback" not in svc.logs()


@pytest.fixture(scope="module")
def data_schema(running: Running) -> schemathesis.schemas.BaseSchema:
    return schemathesis.openapi.from_url(f"{running.svc.base}/openapi.json")


@pytest.fixture(scope="module")
def admin_schema(running: Running) -> schemathesis.schemas.BaseSchema:
    return schemathesis.openapi.from_url(f"{running.svc.admin}/openapi.json")


def _routes(app: Starlette) -> set[tuple[str, str]]:
    """The app's API routes: not the dashboard's (its mount at /ui/, and /ui, which goes to
    it), whose pages are no API."""
    return {
        (m, r.path)
        for r in app.routes
        if isinstance(r, Route) and r.path != "/ui"
        for m in (r.methods or ()) - {"HEAD"}  # Starlette's own HEAD for each GET
    }


def _documented(doc: dict[str, dict[str, object]]) -> set[tuple[str, str]]:
    return {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops}  # type: ignore[union-attr]


def test_each_port_documents_every_route_of_its_app(redis_server: Server, running: Running) -> None:
    """The routes of the apps as built, against the documents as served: a route added to an
    app without its declaration in ``http/openapi.py`` fails here (and the other way round)."""
    s = load(None, {"CLUSTER_DQ_POOL__DEFAULT__ADDR": f"127.0.0.1:{redis_server.port}"})
    pool = RedisPool.create(s.Pool["default"], EngineConfig())
    service = Service(s, {"default": pool})
    log = AccessLog(False)
    data = create_data_app(service, s, log)
    admin = create_admin_app(service, s, log, SizeBoard(None, 30.0))
    asyncio.run(pool.close())
    served_data = httpx.get(f"{running.svc.base}/openapi.json").json()
    served_admin = httpx.get(f"{running.svc.admin}/openapi.json").json()
    for app, doc, where in (
        (data, served_data, "openapi_data"),
        (admin, served_admin, "openapi_admin"),
    ):
        routes, documented = _routes(app), _documented(doc)
        assert not routes - documented, (
            f"routes missing from http/{where}.py: {routes - documented}"
        )
        assert not documented - routes, f"documented, not served: {documented - routes}"
    assert ("PUT", "/api/{ns}/{q}") in _routes(data) and ("GET", "/info") in _routes(admin)


def test_documents_carry_the_served_settings(running: Running) -> None:
    """Defaults and bounds come from the running settings and the parsers' constants."""
    doc = httpx.get(f"{running.svc.base}/openapi.json").json()
    assert doc["openapi"] == "3.1.0"
    consume = doc["paths"]["/api/{ns}/{queues}"]["get"]
    by_name = {p["name"]: p["schema"] for p in consume["parameters"]}
    assert by_name["timeout"] == {"type": "integer", "minimum": 0, "maximum": 1, "default": 0}
    assert by_name["count"]["maximum"] == 100 and by_name["ttr"]["default"] == 120
    paths = doc["paths"]
    for path, bound in [
        ("/api/{ns}/{q}/schedules", MAX_SCHEDULE_PAGE),
        ("/api/{ns}/{q}/deadletter/jobs", MAX_DEAD_PAGE),
        ("/api/{ns}", MAX_LIST),
    ]:
        by_name = {p["name"]: p["schema"] for p in paths[path]["get"]["parameters"]}
        assert by_name["limit"]["maximum"] == bound and by_name["limit"]["minimum"] == 1
    ack = paths["/api/{ns}/{q}/job/{job_id}"]["delete"]["responses"]["204"]
    assert ack["headers"]["X-Job-State"]["required"] is True
    admin = httpx.get(f"{running.svc.admin}/openapi.json").json()
    assert admin["components"]["securitySchemes"] == {"basic": {"type": "http", "scheme": "basic"}}
    assert admin["paths"]["/limits"]["get"]["security"] == [{"basic": []}]
    assert admin["paths"]["/healthz"]["get"]["security"] == []


def test_a_job_s_life_answers_as_documented(running: Running) -> None:
    """Answers that generated requests seldom reach, each checked against its status's
    schema and required headers: progress, release with an error and a backoff
    (next_attempt_at, last_error), an ack with a result and the acked peek, bury, kick and
    their 409s, the dead-letter listing, a full queue's 429, settings, pause, schedules."""
    headers = {"X-Token": running.token}
    with httpx.Client(base_url=running.svc.base, headers=headers, timeout=30) as c:
        _a_job_s_life(c)


def _a_job_s_life(c: httpx.Client) -> None:
    doc = c.get("/openapi.json").json()
    q = f"/api/{NS}/life"

    def check(method: str, path: str, status: int, r: httpx.Response) -> dict[str, object]:
        assert r.status_code == status, (method, path, r.status_code, r.text)
        documented = doc["paths"][path][method]["responses"][str(status)]
        for name, header in documented.get("headers", {}).items():
            assert not header.get("required") or name in r.headers, (path, name)
        if "content" not in documented:
            return {}
        schema = {**documented["content"]["application/json"]["schema"]}
        jsonschema_rs.validate({**schema, "components": doc["components"]}, r.json())
        return r.json()  # type: ignore[no-any-return]

    job_path, put_job = "/api/{ns}/{q}/job/{job_id}", "/api/{ns}/{q}"
    params = {"tries": 3, "backoff": "fixed", "backoff_ms": 60_000}
    jid = check("put", put_job, 201, c.put(q, params=params, content=b"x"))["job_id"]
    lease = c.get(q).json()["lease"]
    progress = c.put(f"{q}/job/{jid}/progress", params={"lease": lease}, json={"done": 1})
    check("put", job_path + "/progress", 200, progress)
    assert check("get", job_path, 200, c.get(f"{q}/job/{jid}"))["progress"] == {"done": 1}
    released = c.post(f"{q}/job/{jid}/release", params={"lease": lease, "error": "boom"})
    check("post", job_path + "/release", 200, released)
    seen = check("get", job_path, 200, c.get(f"{q}/job/{jid}"))
    assert seen["last_error"] == "boom" and seen["next_attempt_at"]
    check("put", job_path + "/progress", 409, c.put(f"{q}/job/{jid}/progress", json=2))
    moved = c.post(f"{q}/job/{jid}/reschedule", params={"delay": 0})
    check("post", job_path + "/reschedule", 200, moved)
    lease = c.get(q).json()["lease"]
    acked = c.delete(f"{q}/job/{jid}", params={"lease": lease, "result": '{"total": 42}'})
    check("delete", job_path, 204, acked)
    assert acked.headers["X-Job-State"] == "reserved"
    assert check("get", job_path, 200, c.get(f"{q}/job/{jid}"))["state"] == "acked"
    check("post", job_path + "/reschedule", 404, c.post(f"{q}/job/{jid}/reschedule?delay=0"))
    other = check("put", put_job, 201, c.put(q, content=b"y"))["job_id"]
    batch = c.post(f"{q}/ack", json=[{"job_id": other, "result": [1]}, jid])
    check("post", "/api/{ns}/{q}/ack", 200, batch)
    dead = check("put", put_job, 201, c.put(q, content=b"z"))["job_id"]
    bury = job_path + "/bury"
    check("post", bury, 200, c.post(f"{q}/job/{dead}/bury", json={"reason": "bad"}))
    check("post", bury, 409, c.post(f"{q}/job/{dead}/bury"))
    check("post", job_path + "/reschedule", 409, c.post(f"{q}/job/{dead}/reschedule?at=1"))
    check("get", "/api/{ns}/{q}/deadletter/jobs", 200, c.get(f"{q}/deadletter/jobs"))
    kick = "/api/{ns}/{q}/deadletter/{job_id}/kick"
    check("post", kick, 200, c.post(f"{q}/deadletter/{dead}/kick"))
    check("post", kick, 409, c.post(f"{q}/deadletter/{dead}/kick"))
    check("get", "/api/{ns}", 200, c.get(f"/api/{NS}"))
    full = {"max_size": 1, "backoff": "exponential", "backoff_ms": 5, "backoff_jitter": 0.5}
    check("patch", "/api/{ns}/{q}/settings", 200, c.patch(f"{q}/settings", json=full))
    check("put", put_job, 429, c.put(q, content=b"w"))
    check("post", "/api/{ns}/{q}/pause", 200, c.post(f"{q}/pause"))
    check("delete", "/api/{ns}/{q}", 204, c.delete(q))
    clear = {"max_size": None, "backoff": None, "paused": False}  # a destroy keeps settings
    check("put", "/api/{ns}/{q}/settings", 200, c.put(f"{q}/settings", json=clear))
    every = {"every_ms": 3_600_000, "job": {"body": "t"}}
    sched = "/api/{ns}/{q}/schedules/{name}"
    check("put", sched, 201, c.put(f"{q}/schedules/life", json=every))
    check("get", "/api/{ns}/{q}/schedules", 200, c.get(f"{q}/schedules"))
    check("post", sched + "/pause", 200, c.post(f"{q}/schedules/life/pause"))
    check("delete", sched, 204, c.delete(f"{q}/schedules/life"))


data_api = schemathesis.pytest.from_fixture("data_schema")
admin_api = schemathesis.pytest.from_fixture("admin_schema")
bounded = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)


@data_api.parametrize()
@bounded
def test_data_port_conforms_to_its_document(case: schemathesis.Case, running: Running) -> None:
    if "ns" in (case.path_parameters or {}):
        case.path_parameters["ns"] = NS  # type: ignore[index]
    case.call_and_validate(headers={"X-Token": running.token}, checks=CHECKS)


@admin_api.parametrize()
@bounded
def test_admin_port_conforms_to_its_document(case: schemathesis.Case, running: Running) -> None:
    headers = {"Authorization": httpx.BasicAuth(*ADMIN_AUTH)._auth_header}
    case.call_and_validate(headers=headers, checks=CHECKS)


def test_data_port_follows_its_links(
    data_schema: schemathesis.schemas.BaseSchema, running: Running
) -> None:
    """Stateful: sequences that follow the document's links (publish, then peek, touch,
    release, progress, republish, bury, reschedule or ack that job; consume, then ack, touch,
    release, progress or bury with the lease; a schedule PUT, then read, pause, resume or
    delete it), each answer checked against the document as above."""
    # The document's own links only: schemathesis would infer more (a job_id in an answer
    # feeds every route taking one), and start every sequence from the POSTs among them
    # (bury, kick, reschedule with ids that exist nowhere), never from publish or consume.
    data_schema.config.phases.stateful.inference.algorithms = []
    base = data_schema.as_state_machine()

    class Client(base):  # type: ignore[valid-type,misc]
        def before_call(self, case: schemathesis.Case) -> None:
            if "ns" in (case.path_parameters or {}):
                case.path_parameters["ns"] = NS  # type: ignore[index]

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, object]:
            return {"headers": {"X-Token": running.token}}

        def validate_response(self, response: object, case: schemathesis.Case, **_: object) -> None:
            try:
                case.validate_response(response, checks=CHECKS)  # type: ignore[arg-type]
            except BaseException as e:
                failures.append(e)
                raise

    failures: list[BaseException] = []
    for _ in range(STATEFUL_RUNS):
        try:
            run_state_machine_as_test(
                Client,
                settings=settings(
                    max_examples=EXAMPLES,
                    stateful_step_count=8,
                    phases=[Phase.generate],  # a replay meets another server state: no shrinking
                    deadline=None,
                    suppress_health_check=list(HealthCheck),
                    database=None,
                ),
            )
            return
        except FlakyStrategyDefinition:
            # The server's state made a step answer otherwise than in an earlier sequence that
            # began alike (a schedule PUT again is a 200, not a 201; a queue consumed since is
            # a 404), so other links were open: not a defect. schemathesis's own runner counts
            # it a success unless a check failed; here, a fresh run goes on with the rest.
            if failures:
                raise failures[0] from None
