"""The data port's OpenAPI document: one ``Op`` per route of ``DataAPI.routes`` (``http/app.py``)."""

from __future__ import annotations


from cluster_dq.http.openapi import (
    E400,
    E401,
    E404_POOL,
    E409,
    E413,
    E429,
    E503,
    EITHER,
    INT,
    JOB_ID,
    LEASE_ID,
    NAME,
    NO_CONTENT,
    QUEUE_NAME,
    Op,
    Schema,
    document,
    error,
    json_body,
    obj,
    param,
    raw_body,
    ref,
    reply,
    seconds,
    uint,
)
from cluster_dq.http.params import MAX_QUEUES, U32
from cluster_dq.models import (
    MAX_BATCH_ACK,
    MAX_BATCH_CONSUME,
    MAX_BULK,
    MAX_NAME_LEN,
    MAX_PRIORITY,
    MAX_TRIES,
)
from cluster_dq.settings import Settings

TOKEN = {
    "token": {"type": "apiKey", "in": "header", "name": "X-Token", "description": "[pool:]token"},
    "tokenQuery": {"type": "apiKey", "in": "query", "name": "token", "description": "[pool:]token"},
}


def data_document(s: Settings) -> Schema:
    return document("data", data_operations(s), TOKEN)


JOB_EXAMPLE = {
    "msg": "new job",
    "namespace": "demo",
    "queue": "orders",
    "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM",
    "data": "Y2xvc2Ugb3JkZXIgNDI=",
    "ttl": 3598,
    "elapsed_ms": 2003,
    "remain_tries": 2,
    "attributes": None,
    "state": "reserved",
    "deliveries": 1,
    "lease": "2c37b9d38f700001",
}
PEEKED_EXAMPLE = {k: v for k, v in JOB_EXAMPLE.items() if k not in ("msg", "lease")}
PUBLISHED = reply(
    "published", ref("Published"), {"msg": "published", "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM"}
)
JOB_PATH = "/api/{ns}/{q}/job/{job_id}"
PEEK, ACK, REPUBLISH = (JOB_PATH, "get"), (JOB_PATH, "delete"), (JOB_PATH, "put")
TOUCH, RELEASE = (JOB_PATH + "/touch", "post"), (JOB_PATH + "/release", "post")
CONSUME = ("/api/{ns}/{queues}", "get")


def links(values: dict[str, object], *targets: tuple[str, str]) -> Schema:
    """What a client does next with the id it was given (schemathesis follows these)."""
    return {
        f"{method} {path}": {
            "operationRef": "#/paths/" + path.replace("/", "~1") + "/" + method,
            "parameters": values,
        }
        for path, method in targets
    }


_ID = {"ns": "$request.path.ns", "job_id": "$response.body#/job_id"}
PUBLISHED["links"] = {
    **links({**_ID, "q": "$request.path.q"}, PEEK, ACK, REPUBLISH, TOUCH, RELEASE),
    # take it: one job, so the answer is one job object with its lease
    **links({"ns": "$request.path.ns", "queues": "$request.path.q", "query.count": 1}, CONSUME),
}
# A delivery's own lease (count=1: one job object).
DELIVERED = links(
    {**_ID, "q": "$response.body#/queue", "lease": "$response.body#/lease"},
    ACK,
    REPUBLISH,
    TOUCH,
    RELEASE,
)


NS = param("ns", "path", NAME, "namespace")
Q = param("q", "path", QUEUE_NAME, "queue")
JOB = param("job_id", "path", JOB_ID, "job id")
LEASE = param("lease", "query", LEASE_ID, "the lease of the delivery that holds the job")


def job_spec(s: Settings, with_id: bool = True) -> list[Schema]:
    """The parameters of a published job (``DataAPI._specs``)."""
    out = [
        *seconds("delay", "the job becomes ready after this", s.DelaySecond),
        *seconds(
            "ttl",
            "the job expires this long after publishing; 0: never; else longer than the delay",
            s.TTLSecond,
        ),
        uint("tries", "deliveries allowed", s.TriesNum, MAX_TRIES),
        uint("priority", "higher is delivered first within a queue", 0, MAX_PRIORITY),
    ]
    if with_id:
        out.append(param("job_id", "query", JOB_ID, "a client-chosen id: idempotent publish"))
    return out


def data_operations(s: Settings) -> list[Op]:
    """Every route of the data port (``DataAPI.routes``), with what it can answer."""
    common = {400: E400, 401: E401, 404: E404_POOL, 503: E503}
    write = {**common, 201: PUBLISHED, 413: E413, 429: E429}
    job_404 = error("no such job, or it is not reserved", "job is not reserved")
    consume_404 = reply(
        "nothing ready within the timeout (msg), or the token's pool is unknown (error)",
        EITHER,
        {"msg": "no job available"},
    )
    too_many = error("rate-limited, or too many consumers waiting", "retry later", "Message")
    too_many["headers"]["Retry-After"] = {"schema": {"type": "string"}}
    size = reply("sizes", ref("Size"), {"namespace": "demo", "queue": "orders", "size": 0})
    peeked = reply("the job; nothing changes", ref("Job"), PEEKED_EXAMPLE)
    return [
        Op(
            "PUT",
            "/api/{ns}/{q}",
            "Publish one job (the raw body)",
            write,
            [NS, Q, *job_spec(s)],
            raw_body(f"the job, at most MaxBodyBytes ({s.MaxBodyBytes}) bytes"),
        ),
        Op(
            "PUT",
            "/api/{ns}/{q}/bulk",
            f"Publish up to {MAX_BULK} jobs, all or nothing",
            {
                **write,
                201: reply(
                    "published",
                    obj(["msg", "job_ids"], msg={"const": "published"}, job_ids={"type": "array"}),
                    {"msg": "published", "job_ids": ["01M84CYQJ90007ZG2JKZ9W9AQM"]},
                ),
            },
            [NS, Q, *job_spec(s, with_id=False)],
            json_body(
                {"type": "array", "minItems": 1, "maxItems": MAX_BULK, "items": {}},
                ["close order 42", {"order": 43}],
            ),
        ),
        Op(
            "PUT",
            "/api/{ns}/{q}/job/{job_id}",
            "Ack a job and publish the body as a new job, atomically",
            {**write, 409: E409},
            [NS, Q, JOB, *job_spec(s), LEASE],
            raw_body("the new job"),
        ),
        Op(
            "GET",
            "/api/{ns}/{queues}",
            "Consume (long-poll) from one or more queues, in priority order",
            {
                **common,
                200: reply(
                    "one job object (count=1) or an array of them",
                    {"anyOf": [ref("Job"), {"type": "array", "items": ref("Job")}]},
                    JOB_EXAMPLE,
                    headers={"X-Lease": {"schema": LEASE_ID, "description": "count=1: the lease"}},
                )
                | {"links": DELIVERED},
                404: consume_404,
                429: too_many,
            },
            [
                NS,
                param(
                    "queues",
                    "path",
                    {
                        "type": "string",
                        "pattern": "^[-_A-Za-z0-9,]+$",
                        "maxLength": MAX_QUEUES * (MAX_NAME_LEN + 1),
                    },
                    f"queue names, comma-separated (at most {MAX_QUEUES}); first is served first",
                ),
                *seconds("ttr", "time to run; ttr=0 means 1 s", s.TTRSecond, ms_minimum=1),
                *seconds(
                    "timeout",
                    "long-poll: wait this long for a job",
                    s.TimeoutSecond,
                    s.MaxTimeoutSecond,
                ),
                uint("count", "jobs to take at most", 1, MAX_BATCH_CONSUME, 1),
            ],
        ),
        Op(
            "DELETE",
            "/api/{ns}/{q}/job/{job_id}",
            "Ack (delete) a job in any state; 204 also when it does not exist",
            {**common, 204: NO_CONTENT, 409: E409},
            [NS, Q, JOB, LEASE],
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/ack",
            "Batch ack, one atomic step",
            {
                **common,
                200: reply(
                    "acked",
                    obj(
                        ["msg", "acked", "not_found"],
                        msg={"const": "acked"},
                        acked=INT,
                        not_found={"type": "array", "items": {"type": "string"}},
                    ),
                    {"msg": "acked", "acked": 1, "not_found": []},
                ),
                409: E409,
                413: E413,
            },
            [NS, Q],
            json_body(_ack_body(), [{"job_id": "01M84CYQJ90007ZG2JKZ9W9AQM", "lease": None}]),
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/job/{job_id}/touch",
            "Extend (or shorten) a reservation: it now ends ttr from now",
            {
                **common,
                200: reply(
                    "touched",
                    obj(
                        ["msg", "job_id", "ttr_ms"],
                        msg={"const": "touched"},
                        job_id={"type": "string"},
                        ttr_ms=INT,
                    ),
                ),
                404: job_404,
                409: E409,
            },
            [NS, Q, JOB, *seconds("ttr", "the new time to run", s.TTRSecond, U32, 1, 1), LEASE],
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/job/{job_id}/release",
            "Give a reserved job back (nack), now or after a delay",
            {
                **common,
                200: reply(
                    "released",
                    obj(
                        ["msg", "job_id", "state"],
                        msg={"const": "released"},
                        job_id={"type": "string"},
                        state={"enum": ["ready", "delayed", "dead", "expired"]},
                    ),
                ),
                404: job_404,
                409: E409,
            },
            [NS, Q, JOB, *seconds("delay", "ready again after this", 0), LEASE],
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/peek",
            "The head of the ready queue",
            {
                **common,
                200: peeked,
                404: error("empty queue or unknown pool", "the queue is empty"),
            },
            [NS, Q],
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/job/{job_id}",
            "One job by id, in any state",
            {**common, 200: peeked, 404: error("no such job or unknown pool", "job not found")},
            [NS, Q, JOB],
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/size",
            "Sizes per state (size: ready)",
            {**common, 200: size},
            [NS, Q],
        ),
        Op(
            "DELETE",
            "/api/{ns}/{q}",
            "Destroy the queue: every job in every state",
            {**common, 204: NO_CONTENT},
            [NS, Q],
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/deadletter",
            "Dead-letter size and head",
            {
                **common,
                200: reply(
                    "size and head (empty string: none)",
                    obj(
                        ["namespace", "queue", "deadletter_size", "deadletter_head"],
                        namespace={"type": "string"},
                        queue={"type": "string"},
                        deadletter_size=INT,
                        deadletter_head={"type": "string"},
                    ),
                ),
            },
            [NS, Q],
            tag="dead letter",
        ),
        Op(
            "PUT",
            "/api/{ns}/{q}/deadletter",
            "Respawn up to limit of the oldest dead jobs to ready",
            {
                **common,
                200: reply(
                    "respawned",
                    obj(["msg", "count"], msg={"const": "respawned"}, count=INT),
                    {"msg": "respawned", "count": 1},
                ),
            },
            [
                NS,
                Q,
                uint("limit", "dead jobs to respawn at most", 1, U32, 1),
                *seconds("ttl", "the respawned jobs' new ttl", s.TTLSecond),
            ],
            tag="dead letter",
        ),
        Op(
            "DELETE",
            "/api/{ns}/{q}/deadletter",
            "Delete up to limit of the oldest dead jobs",
            {**common, 204: NO_CONTENT},
            [NS, Q, uint("limit", "dead jobs to delete at most", 1, U32, 1)],
            tag="dead letter",
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/deadletter/size",
            "Dead-letter size",
            {**common, 200: size},
            [NS, Q],
            tag="dead letter",
        ),
    ]


def _ack_body() -> Schema:
    element = {
        "anyOf": [
            JOB_ID,
            {
                "type": "object",
                "properties": {"job_id": JOB_ID, "lease": {"anyOf": [LEASE_ID, {"type": "null"}]}},
                "required": ["job_id"],
                "additionalProperties": False,
            },
        ]
    }
    ids = {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_ACK, "items": element}
    return {
        "anyOf": [
            ids,
            {
                "type": "object",
                "properties": {"job_ids": ids},
                "required": ["job_ids"],
                "additionalProperties": False,
            },
        ]
    }
