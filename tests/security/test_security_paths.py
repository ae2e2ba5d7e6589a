"""Path tricks against a real `cluster-dq serve`: a name that hides a separator in a path
segment never reaches another route. The server routes on the decoded path, so an encoded
``/`` (``%2F``) moved a name into another verb: ``PUT /api/demo/victim%2Fjob%2F<id>`` was a
republish that acked ``<id>`` without its lease, ``destroy("wk/deadletter")`` deleted a dead
job, ``publish("wk/bulk", ...)`` published and then reported failure. Both ports refuse such a
path with a 400 before any routing, and the Python client refuses, before sending, every name
the service refuses."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pytest

from cluster_dq.client import AdminClient, Client, InvalidName, Sizes, TransportError
from cluster_dq.http.paths import MESSAGE
from cluster_dq.localredis import free_port
from cluster_dq.testing.service_process import ServiceProcess
from tests.support import ADMIN_AUTH
from tests.support.clients import NS

REFUSED = {"error": MESSAGE}


def raw(svc: ServiceProcess, token: str, method: str, path: str, body: bytes = b"") -> Any:
    """A request whose path is sent as written (its percent-escapes kept)."""
    with httpx.Client(base_url=svc.base, headers={"X-Token": token}, timeout=10) as http:
        return http.request(method, httpx.URL(svc.base + path), content=body)


async def test_an_encoded_slash_is_no_republish_of_another_job(
    served: ServiceProcess, token: str, dq: Any
) -> None:
    victim = await dq.publish("victim", b"mine")
    got = await dq.consume("victim", ttr=60)
    assert got.id == victim
    for hidden in ("%2F", "%2f"):
        path = f"/api/{NS}/victim{hidden}job{hidden}{victim}"
        r = raw(served, token, "PUT", path, b"theirs")
        assert (r.status_code, r.json()) == (400, REFUSED), r.text
    assert await dq.size("victim") == Sizes(ready=0, delayed=0, reserved=1, dead=0)
    assert (await dq.get_job("victim", victim)).state == "reserved"
    await dq.ack("victim", victim, lease=got.lease)  # the lease still holds it


async def test_an_encoded_slash_is_no_dead_letter_delete(
    served: ServiceProcess, token: str, dq: Any
) -> None:
    dead = await dq.publish("wk", b"x")
    await dq.bury("wk", dead, reason="kept")
    for path in (f"/api/{NS}/wk%2Fdeadletter", f"/api/{NS}/wk%5Cdeadletter"):
        r = raw(served, token, "DELETE", path)
        assert (r.status_code, r.json()) == (400, REFUSED), r.text
    with pytest.raises(InvalidName, match="queue 'wk/deadletter'") as e:
        await dq.destroy("wk/deadletter")
    assert isinstance(e.value, ValueError) and e.value.status == 400
    assert await dq.size("wk") == Sizes(ready=0, delayed=0, reserved=0, dead=1)
    assert (await dq.get_job("wk", dead)).state == "dead"


async def test_an_encoded_slash_is_no_bulk_publish(
    served: ServiceProcess, token: str, dq: Any
) -> None:
    r = raw(served, token, "PUT", f"/api/{NS}/wk%2Fbulk", b"[1, 2]")
    assert (r.status_code, r.json()) == (400, REFUSED), r.text
    with pytest.raises(InvalidName, match="queue 'wk/bulk'"):
        await dq.publish("wk/bulk", b"[1, 2]")
    assert await dq.size("wk") == Sizes(ready=0, delayed=0, reserved=0, dead=0)
    assert (await dq.queues()).queues == []


def test_encoded_dots_and_separators_are_refused_on_the_admin_port(
    served: ServiceProcess, token: str
) -> None:
    """``DELETE /token/{ns}%2F{token}`` routed to the token's delete; the dashboard's routes
    go the same way."""
    with httpx.Client(auth=ADMIN_AUTH, timeout=10) as admin:
        for method, path in (
            ("DELETE", f"/token/{NS}%2F{token}"),
            ("DELETE", f"/token/{NS}/{token}%2F%2E%2E"),
            ("GET", f"/ui/queue/{NS}%2Fq"),
            ("GET", f"/ui/queue/{NS}/q%2e%2e"),
        ):
            r = admin.request(method, httpx.URL(served.admin + path))
            assert (r.status_code, r.json()) == (400, REFUSED), (path, r.text)
        assert token in admin.get(f"{served.admin}/token/{NS}").json()["tokens"]
    r = raw(served, token, "GET", f"/api/{NS}/q/size")
    assert r.status_code == 200  # the token still works


def test_other_encodings_still_reach_the_route_and_its_check(
    served: ServiceProcess, token: str
) -> None:
    """Only the separators are refused before routing: another escape (``%21``, ``%25``)
    reaches the route, whose own check names the parameter."""
    for path, message in (
        (f"/api/{NS}/q%21", "queue name contains forbidden characters"),
        (f"/api/{NS}/q%252F", "queue name contains forbidden characters"),  # a literal "%2F"
        (f"/api/{NS}/q/job/a%20b", "invalid job id"),
    ):
        r = raw(served, token, "PUT" if path.count("/") == 3 else "DELETE", path, b"x")
        assert (r.status_code, r.json()) == (400, {"error": message}), (path, r.text)


CANDIDATES = [
    "q",
    "a-b_C9",
    "x" * 255,
    "x" * 256,
    "_q",
    "a/b",
    "a\\b",
    "..",
    ".",
    "a.b",
    "a b",
    "a,b",
    "a:b",
    "é",
    "q\n",
    "%2F",
    "x" * 64,
    "x" * 65,
]


@pytest.mark.parametrize("name", CANDIDATES)
def test_the_client_refuses_before_sending_every_name_the_service_refuses(
    served: ServiceProcess, token: str, name: str
) -> None:
    """For each name, as a namespace, queue, job id, schedule name and token: the service's
    answer (400 or not) and the client's (``InvalidName``, a BadRequest and ValueError, before
    sending; or a request sent to a port nobody listens on: a TransportError) agree."""
    nowhere = f"http://127.0.0.1:{free_port()}"
    seg = quote(name, safe="").replace(".", "%2E")  # as sent: a URL folds a bare "." away
    cases = [  # a namespace that no header can carry is refused by the constructor already
        (f"/api/{seg}/q/size", lambda c: Client(nowhere, token, name, retries=0).size("q")),
        (f"/api/{NS}/{seg}/size", lambda c: c.size(name)),
        (f"/api/{NS}/q/job/{seg}", lambda c: c.get_job("q", name)),
        (f"/api/{NS}/q/schedules/{seg}", lambda c: c.get_schedule("q", name)),
    ]
    with Client(nowhere, token, NS, retries=0) as client:
        for i, (path, call) in enumerate(cases):
            r = raw(served, token, "GET", path)
            refused = r.status_code == 400
            if refused:
                with pytest.raises(ValueError if i == 0 else InvalidName):
                    call(client)
            else:
                with pytest.raises(TransportError):
                    call(client)
    # the admin port's token routes: [pool:]token
    admin = AdminClient(nowhere, ADMIN_AUTH, retries=0)
    with httpx.Client(auth=ADMIN_AUTH, timeout=10) as http:
        r = http.request("DELETE", httpx.URL(f"{served.admin}/token/{NS}/{seg}/limit"))
    with pytest.raises(InvalidName if r.status_code == 400 else TransportError):
        admin.delete_limit(NS, name)
