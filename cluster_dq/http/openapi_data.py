"""The data port's OpenAPI document: one ``Op`` per route of ``DataAPI.routes`` (``http/app.py``)."""

from __future__ import annotations

from dataclasses import replace

from cluster_dq.http.openapi import (
    JSON,
    E400,
    E401,
    E404_POOL,
    E409,
    E409_BUSY,
    E409_STATE,
    E413,
    E414,
    E503,
    EITHER,
    INT,
    JOB_ID,
    LEASE_ID,
    NAME,
    NO_CONTENT,
    QUEUE_NAME,
    REASON,
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
from cluster_dq.backoff import KINDS, MAX_BACKOFF_MS
from cluster_dq.engine.control import FOREVER_MS, MAX_DEAD_PAGE
from cluster_dq.http.control import DEFAULT_PAGE, MAX_AT_MS
from cluster_dq.http.params import MAX_LIST, MAX_QUEUES, U32
from cluster_dq.queueconf import MAX_SIZE
from cluster_dq.models import (
    MAX_BATCH_ACK,
    MAX_BATCH_CONSUME,
    MAX_BULK,
    MAX_NAME_LEN,
    MAX_NOTE_BYTES,
    MAX_NOTE_TEXT,
    MAX_PRIORITY,
    MAX_SECONDS,
    MAX_TRIES,
    JobState,
)
from cluster_dq.schedules import (
    DEFAULT_CATCH_UP_MS,
    MAX_CATCH_UP_MS,
    MAX_CRON_LEN,
    MAX_EVERY_MS,
    MAX_SCHEDULE_PAGE,
    MAX_START_MS,
    MAX_TZ_LEN,
    MIN_EVERY_MS,
)
from cluster_dq.names import SCHEDULE_NAME_RE
from cluster_dq.settings import Settings

TOKEN = {
    "token": {"type": "apiKey", "in": "header", "name": "X-Token", "description": "[pool:]token"},
    "tokenQuery": {"type": "apiKey", "in": "query", "name": "token", "description": "[pool:]token"},
}


def data_document(s: Settings) -> Schema:
    return document("data", with_write_limits(data_operations(s)), TOKEN)


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
PROGRESS = (JOB_PATH + "/progress", "put")
BURY, RESCHEDULE = (JOB_PATH + "/bury", "post"), (JOB_PATH + "/reschedule", "post")
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
    **links(
        {**_ID, "q": "$request.path.q"},
        PEEK,
        ACK,
        REPUBLISH,
        TOUCH,
        RELEASE,
        PROGRESS,
        BURY,
        RESCHEDULE,
    ),
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
    PROGRESS,
    BURY,
)
# No links from a POST: schemathesis starts its sequences from the operations with links,
# and only from the POSTs among them when there are any (its "reliable roots"): links from
# bury, kick or reschedule would leave publish and consume out of every sequence.


NS = param("ns", "path", NAME, "namespace")
Q = param("q", "path", QUEUE_NAME, "queue")
JOB = param("job_id", "path", JOB_ID, "job id")
LEASE = param("lease", "query", LEASE_ID, "the lease of the delivery that holds the job")
RESULT = param(
    "result",
    "query",
    {"type": "string", "maxLength": MAX_NOTE_BYTES, "contentMediaType": JSON},
    f"one JSON value, at most {MAX_NOTE_BYTES} bytes of UTF-8 (413 above; 414 when the "
    "request line outgrows its limit first), kept ResultSecond after the ack and shown by a "
    "peek of the job meanwhile",
)


BACKOFF = [
    param(
        "backoff",
        "query",
        {"enum": list(KINDS)},
        "the job's own retry backoff (default: its queue's); none: come back at once",
    ),
    uint(
        "backoff_ms",
        "the backoff's base (required with fixed or exponential)",
        None,
        MAX_BACKOFF_MS,
    ),
    uint("backoff_cap_ms", "the longest exponential wait; 0: none", None, MAX_BACKOFF_MS),
    param(
        "backoff_jitter",
        "query",
        {"type": "number", "minimum": 0, "maximum": 1},
        "the share of each wait a random draw may take off (kept to the thousandth)",
    ),
]


def job_spec(s: Settings, with_id: bool = True) -> list[Schema]:
    """The parameters of a published job (``DataAPI._specs``)."""
    out = [
        *seconds("delay", "the job becomes ready after this", s.DelaySecond),
        *seconds(
            "ttl",
            "the job expires this long after publishing; 0: never; else longer than the delay",
            s.TTLSecond,
        ),
        uint(
            "tries",
            f"deliveries allowed (default: the queue's tries setting, else {s.TriesNum})",
            None,
            MAX_TRIES,
            1,  # validate_spec: "tries shouldn't be zero"
        ),
        uint("priority", "higher is delivered first within a queue", 0, MAX_PRIORITY),
        *BACKOFF,
    ]
    if with_id:
        out.append(param("job_id", "query", JOB_ID, "a client-chosen id: idempotent publish"))
    return out


def data_operations(s: Settings) -> list[Op]:
    """Every route of the data port (``DataAPI.routes``), with what it can answer."""
    common = {400: E400, 401: E401, 404: E404_POOL, 503: E503}
    full = reply(
        "the token's rate limit (msg), or the queue holds its max_size (error): nothing written",
        EITHER,
        {"error": "queue demo/orders is full: it holds its max_size; nothing was published"},
    )
    write = {**common, 201: PUBLISHED, 413: E413, 429: full}
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
    cancelled = reply(
        "acked (lmstfy's 204, no body)",
        headers={
            "X-Job-State": {
                "required": True,
                "schema": {"enum": [*(str(st) for st in JobState), "none"]},
                "description": "the state the job was cancelled in; none: no such job",
            }
        },
    )
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
                *seconds(
                    "ttr",
                    "time to run; ttr=0 means 1 s; without ttr, the first listed queue's ttr_ms "
                    "setting, else this default",
                    s.TTRSecond,
                    ms_minimum=1,
                ),
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
            {**common, 204: cancelled, 409: E409, 413: E413, 414: E414},
            [NS, Q, JOB, LEASE, RESULT],
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
            json_body(
                _ack_body(),
                [
                    {"job_id": "01M84CYQJ90007ZG2JKZ9W9AQM", "lease": None},
                    {"job_id": "01M84CYQJ90007ZG2JKZ9W9AQN", "result": {"total": 42}},
                ],
            ),
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
                413: E413,
            },
            [
                NS,
                Q,
                JOB,
                *seconds("delay", "ready again after this", 0),
                LEASE,
                text_param("error", "kept as the job's last_error"),
                uint(
                    "keep_try",
                    "1: a snooze: the delivery is not counted and its try is restored "
                    "(never dead, no backoff)",
                    0,
                    1,
                ),
            ],
            text_body("error", "upstream timed out"),
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
            {
                **common,
                200: reply(
                    "the job (nothing changes), or, for ResultSecond after an ack with a "
                    "result, that result",
                    {"anyOf": [ref("Job"), ref("Acked")]},
                    PEEKED_EXAMPLE,
                ),
                404: error("no such job (nor a kept result), or unknown pool", "job not found"),
            },
            [NS, Q, JOB],
        ),
        Op(
            "PUT",
            "/api/{ns}/{q}/job/{job_id}/progress",
            "Record a reserved job's progress (one JSON value), replacing the last",
            {
                **common,
                200: reply(
                    "saved",
                    obj(
                        ["msg", "job_id", "state"],
                        msg={"const": "progress saved"},
                        job_id={"type": "string"},
                        state={"const": "reserved"},
                    ),
                    {
                        "msg": "progress saved",
                        "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM",
                        "state": "reserved",
                    },
                ),
                404: error("no lease given and no such job, or unknown pool", "job not found"),
                409: reply(
                    "the lease does not hold the job, or (no lease) the job is not in a "
                    "running reservation: nothing was changed",
                    ref("Conflict"),
                    {
                        "error": "job 01M84CYQJ90007ZG2JKZ9W9AQM is not reserved: ready; "
                        "nothing was changed",
                        "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM",
                        "state": "ready",
                        "conflicts": [{"job_id": "01M84CYQJ90007ZG2JKZ9W9AQM", "state": "ready"}],
                    },
                ),
                413: error(
                    f"progress over {MAX_NOTE_BYTES} bytes",
                    f"progress too large (max {MAX_NOTE_BYTES} bytes)",
                ),
            },
            [NS, Q, JOB, LEASE],
            {
                "required": True,
                "description": f"one JSON value, at most {MAX_NOTE_BYTES} bytes as sent",
                "content": {JSON: {"schema": {}, "example": {"done": 120, "of": 500}}},
            },
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
        *schedule_operations(s, common),
        *control_operations(s, common),
        *queue_operations(s, common),
    ]


# Requests that change a queue but are not counted against the token's write limit: they finish
# a delivery its consume counted (docs/api.md#rate-limits). Every other one but a GET is.
NOT_COUNTED = {ACK, TOUCH, RELEASE, PROGRESS, ("/api/{ns}/{q}/ack", "post")}
E429_WRITE = error(
    "the token's write limit: nothing was changed",
    "token(01M84CYQJ90007ZG2JKZ9W9AQM) produce reach the limit rate, please retry later",
    "Message",
)
E403_WRITE = error(
    "the token has a write limit: a schedule would publish past it; nothing was written",
    "token(01M84CYQJ90007ZG2JKZ9W9AQM) has a write limit: a schedule would publish past it",
)


def with_write_limits(ops: list[Op]) -> list[Op]:
    """Every counted write may answer the token's 429; creating, replacing or resuming a
    schedule, a token with a write limit's 403."""
    starts_schedule = ((SCHEDULE_PATH, "put"), (SCHEDULE_PATH + "/resume", "post"))
    out = []
    for op in ops:
        key = (op.path, op.method.lower())
        if op.method not in ("GET", "HEAD") and key not in NOT_COUNTED:
            extra = {403: E403_WRITE} if key in starts_schedule else {}
            op = replace(op, responses={429: E429_WRITE, **extra, **op.responses})
        out.append(op)
    return out


def text_param(name: str, what: str) -> Schema:
    return param(
        name,
        "query",
        {"type": "string", "maxLength": MAX_NOTE_TEXT},
        f"{what}: at most {MAX_NOTE_TEXT} bytes of UTF-8 (wins over the body's)",
    )


def text_body(name: str, example: str) -> Schema:
    """``params.text``'s body: read only with a JSON Content-Type."""
    return json_body(
        {
            "type": "object",
            "properties": {name: {"type": ["string", "null"], "maxLength": MAX_NOTE_TEXT}},
            "additionalProperties": False,
        },
        {name: example},
        required=False,
    )


def kick_args(s: Settings) -> list[Schema]:
    """``ControlAPI._kick_args``: a kick's or a redrive's delay, tries and fresh ttl."""
    return [
        *seconds("delay", "ready after this", 0),
        uint("tries", "the tries it gets", 1, MAX_TRIES, 1),
        *seconds("ttl", "a fresh ttl; 0: never; else longer than the delay", s.TTLSecond),
    ]


def control_operations(s: Settings, common: dict[int, Schema]) -> list[Op]:
    """Per-job control and the dead letter (``http/control.py``)."""
    dead_job = {
        **PEEKED_EXAMPLE,
        "state": "dead",
        "reason": "buried",
        "died_at": 1795466635814,
        "last_error": "malformed payload: no customer id",
    }
    moved = reply("the job in its new state", ref("Job"), dead_job)
    no_job = error("no such job, or unknown pool", "job not found")
    cursor = param(
        "cursor",
        "query",
        {"type": "string"},
        "where the previous page or call stopped (as answered); absent: from the start",
    )
    limit = uint("limit", "per page / per call", DEFAULT_PAGE, MAX_DEAD_PAGE, 1)
    filters = [
        param("reason", "query", REASON, "only the dead jobs that died for this reason"),
        uint("from", "only those that died at or after this (Unix ms)", 0, MAX_AT_MS),
        uint("to", "only those that died at or before this (Unix ms)", FOREVER_MS, FOREVER_MS),
        limit,
        cursor,
    ]

    def swept(what: str) -> Schema:
        return reply(
            f"{what}; call again with cursor while more is true",
            obj(
                ["msg", "count", "more", "cursor"],
                msg={"const": what},
                count=INT,
                more={"type": "boolean"},
                cursor={"type": ["string", "null"]},
            ),
            {"msg": what, "count": 500, "more": True, "cursor": "0:1795466635814:01M84CYQJ9"},
        )

    return [
        Op(
            "POST",
            JOB_PATH + "/bury",
            "Bury a reserved, ready or delayed job into the dead letter, with a reason",
            {
                **common,
                200: moved,
                404: no_job,
                409: reply(
                    "dead already (state), or the lease does not hold the job (conflicts): "
                    "nothing was changed",
                    {"anyOf": [ref("WrongState"), ref("Conflict")]},
                    E409_STATE["content"][JSON]["example"],
                ),
                413: E413,
            },
            [NS, Q, JOB, LEASE, text_param("reason", "kept as the job's last_error")],
            text_body("reason", "malformed payload: no customer id"),
            tag="job control",
        ),
        Op(
            "POST",
            JOB_PATH + "/reschedule",
            "Give a ready or delayed job a new due time (exactly one of delay, delay_ms, at)",
            {
                **common,
                200: reply("the job, delayed until then (or ready)", ref("Job"), PEEKED_EXAMPLE),
                404: no_job,
                409: E409_STATE,
            },
            [
                NS,
                Q,
                JOB,
                uint("delay", "due this long from now (seconds)", None, U32),
                uint("delay_ms", "due this long from now (milliseconds)", None, U32 * 1000),
                uint("at", "due at this time (Unix ms)", None, MAX_AT_MS),
            ],
            tag="job control",
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/deadletter/{job_id}/kick",
            "Move one dead job back to ready (or delayed), with fresh tries and ttl",
            {
                **common,
                200: reply("the job, ready or delayed", ref("Job"), PEEKED_EXAMPLE),
                404: no_job,
                409: E409_STATE,
            },
            [NS, Q, JOB, *kick_args(s)],
            tag="dead letter",
        ),
        Op(
            "GET",
            "/api/{ns}/{q}/deadletter/jobs",
            "Dead jobs, oldest death first, a page at a time (no bodies)",
            {
                **common,
                200: reply(
                    "one page; cursor null: the end",
                    obj(
                        ["jobs", "cursor"],
                        jobs={"type": "array", "items": ref("DeadLetter")},
                        cursor={"type": ["string", "null"]},
                    ),
                    {
                        "jobs": [
                            {
                                "job_id": "01M84CYQJ90007ZG2JKZ9W9AQM",
                                "reason": "ttr_expired",
                                "died_at": 1795466635814,
                                "deliveries": 3,
                                "last_error": "upstream timed out",
                                "size": 118,
                                "published_at": 1795466500000,
                            }
                        ],
                        "cursor": None,
                    },
                ),
            },
            [NS, Q, limit, cursor],
            tag="dead letter",
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/deadletter/redrive",
            f"Move back the dead jobs that match (one bounded step: at most {MAX_DEAD_PAGE} "
            "looked at)",
            {**common, 200: swept("redriven")},
            [NS, Q, *filters, *kick_args(s)],
            tag="dead letter",
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/deadletter/purge",
            f"Delete the dead jobs that match (one bounded step: at most {MAX_DEAD_PAGE} "
            "looked at)",
            {**common, 200: swept("purged")},
            [NS, Q, *filters],
            tag="dead letter",
        ),
    ]


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def queue_operations(s: Settings, common: dict[int, Schema]) -> list[Op]:
    """Queue settings, pause and resume, the namespace's queue listing."""
    ms = {"type": "integer", "minimum": 1, "maximum": MAX_SECONDS * 1000}
    settings_schema = obj(
        ["namespace", "queue", "paused", "ttr_ms", "tries", "max_size"]
        + ["backoff", "backoff_ms", "backoff_cap_ms", "backoff_jitter"],
        namespace={"type": "string"},
        queue={"type": "string"},
        paused={"type": "boolean"},
        ttr_ms={"type": ["integer", "null"], "minimum": 1},
        tries={"type": ["integer", "null"], "minimum": 1, "maximum": MAX_TRIES},
        max_size={"type": ["integer", "null"], "minimum": 1},
        backoff={"enum": ["fixed", "exponential", None]},
        backoff_ms={"type": ["integer", "null"], "minimum": 0},
        backoff_cap_ms={"type": ["integer", "null"], "minimum": 0},
        backoff_jitter={"type": ["number", "null"], "minimum": 0, "maximum": 1},
    )
    example = {
        "namespace": "demo",
        "queue": "orders",
        "paused": False,
        "ttr_ms": None,
        "tries": 3,
        "max_size": 100000,
        "backoff": "exponential",
        "backoff_ms": 1000,
        "backoff_cap_ms": 60000,
        "backoff_jitter": 0.2,
    }
    the_settings = reply("the queue's settings (null: not set)", settings_schema, example)
    backoff_ms = {"type": "integer", "minimum": 0, "maximum": MAX_BACKOFF_MS}
    changes = {
        "type": "object",
        "description": "the settings to change; null removes one; a backoff is given whole",
        "properties": {
            "paused": {"type": "boolean"},
            "ttr_ms": nullable(ms),
            "tries": nullable({"type": "integer", "minimum": 1, "maximum": MAX_TRIES}),
            "max_size": nullable({"type": "integer", "minimum": 1, "maximum": MAX_SIZE}),
            "backoff": {"enum": [*KINDS, None]},
            "backoff_ms": nullable(backoff_ms),
            "backoff_cap_ms": nullable(backoff_ms),
            "backoff_jitter": nullable({"type": "number", "minimum": 0, "maximum": 1}),
        },
        "additionalProperties": False,
    }
    body = json_body(
        changes,
        {"max_size": 100000, "tries": 3, "backoff": "exponential", "backoff_ms": 1000},
        required=False,
    )
    change = {**common, 200: the_settings, 413: E413}
    listed = obj(
        ["queue", "ready", "delayed", "reserved", "dead", "paused"]
        + ["oldest_due_ms", "lateness_ms"],
        queue={"type": "string"},
        ready=INT,
        delayed=INT,
        reserved=INT,
        dead=INT,
        paused={"type": "boolean"},
        oldest_due_ms={
            "type": ["integer", "null"],
            "description": "the due time of the head of the ready set; null: nothing ready",
        },
        lateness_ms={"type": ["integer", "null"], "description": "how long ago that was"},
    )
    unknown_queue = error(
        "the queue does not exist (no job, settings or schedule), or the pool is unknown; "
        "nothing was written",
        "queue demo/ordres not found (no job, settings or schedule); nothing was changed. …",
    )
    create = uint(
        "create", "1: the queue need not exist yet (a pause before its first publish)", 0, 1
    )
    return [
        Op(
            "GET",
            "/api/{ns}/{q}/settings",
            "The queue's own settings",
            {**common, 200: the_settings},
            [NS, Q],
            tag="queue control",
        ),
        *(
            Op(
                method,
                "/api/{ns}/{q}/settings",
                "Change the queue's settings: the fields given (400 naming a bad one, and "
                "nothing changes)",
                change,
                [NS, Q],
                body,
                tag="queue control",
            )
            for method in ("PATCH", "PUT")
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/pause",
            "Pause the queue: publishes still accepted, consumes get nothing from it",
            {**common, 200: the_settings, 404: unknown_queue},
            [NS, Q, create],
            tag="queue control",
        ),
        Op(
            "POST",
            "/api/{ns}/{q}/resume",
            "Resume the queue (wakes waiting long-polls)",
            {**common, 200: the_settings, 404: unknown_queue},
            [NS, Q, create],
            tag="queue control",
        ),
        Op(
            "GET",
            "/api/{ns}",
            "The namespace's queues, by name, a page at a time, with sizes and lateness",
            {
                **common,
                200: reply(
                    'one page; cursor "": the last',
                    obj(
                        ["namespace", "queues", "cursor"],
                        namespace={"type": "string"},
                        queues={"type": "array", "items": listed},
                        cursor={"type": "string"},
                    ),
                    {
                        "namespace": "demo",
                        "queues": [
                            {
                                "queue": "orders",
                                "ready": 40,
                                "delayed": 0,
                                "reserved": 3,
                                "dead": 2,
                                "paused": True,
                                "oldest_due_ms": 1795550000000,
                                "lateness_ms": 5120,
                            }
                        ],
                        "cursor": "",
                    },
                ),
            },
            [
                NS,
                uint("limit", "queues per page", 100, MAX_LIST, 1),
                param(
                    "cursor",
                    "query",
                    {"anyOf": [{"const": ""}, NAME]},
                    "the cursor answered (the last name of the previous page); empty: start",
                ),
            ],
            tag="queue control",
        ),
    ]


SCHEDULE_PATH = "/api/{ns}/{q}/schedules/{name}"
SCHEDULE_EXAMPLE = {
    "namespace": "demo",
    "queue": "reports",
    "name": "nightly",
    "cron": "0 3 * * *",
    "tz": "Europe/Paris",
    "job": {"body": "build", "delay_ms": 0, "ttl_ms": 86400000, "tries": 3, "priority": 0},
    "catch_up_ms": DEFAULT_CATCH_UP_MS,
    "paused": False,
    "next_at_ms": 1795744800000,
    "fired": 12,
    "missed": 0,
}


def _ms(what: str, maximum: int, minimum: int = 0) -> Schema:
    return {"type": "integer", "minimum": minimum, "maximum": maximum, "description": what}


def schedule_operations(s: Settings, common: dict[int, Schema]) -> list[Op]:
    """The recurring-job routes (``schedules.parse`` reads the PUT body)."""
    name = param(
        "name",
        "path",
        {
            "type": "string",
            "pattern": SCHEDULE_NAME_RE.pattern.replace("\\A", "^").replace("\\Z", "$"),
        },
        "the schedule's name",
    )
    job = {
        "type": "object",
        "description": "the job each occurrence publishes (a publish's limits)",
        "properties": {
            "body": {"type": "string", "description": f"UTF-8, at most {s.MaxBodyBytes} bytes"},
            "delay_ms": _ms("ready this long after the occurrence", MAX_SECONDS * 1000),
            "ttl_ms": _ms("counted from the publish; 0: never; else > delay_ms", MAX_SECONDS * 1000)
            | {"default": s.TTLSecond * 1000},
            "tries": {"type": "integer", "minimum": 1, "maximum": MAX_TRIES, "default": s.TriesNum},
            "priority": {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY, "default": 0},
        },
        "additionalProperties": False,
    }
    shared = {
        "catch_up_ms": _ms("occurrences at most this old are still published late", MAX_CATCH_UP_MS)
        | {"default": DEFAULT_CATCH_UP_MS},
        "paused": {"type": "boolean", "default": False, "description": "create it paused"},
        "job": job,
    }
    cron = {
        "type": "string",
        "maxLength": MAX_CRON_LEN,
        "description": "five fields (croniter's) or an @alias",
    }
    tz = {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_TZ_LEN,
        "default": "UTC",
        "description": "an IANA time zone",
    }
    every = _ms("occurrences at start_ms + k * every_ms", MAX_EVERY_MS, MIN_EVERY_MS)
    start = _ms("every_ms's anchor (ms since the epoch)", MAX_START_MS) | {"default": 0}
    body = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"cron": cron, "tz": tz, **shared},
                "required": ["cron"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"every_ms": every, "start_ms": start, **shared},
                "required": ["every_ms"],
                "additionalProperties": False,
            },
        ]
    }
    schedule = obj(
        ["namespace", "queue", "name", "job", "catch_up_ms", "paused", "next_at_ms"]
        + ["fired", "missed"],
        namespace={"type": "string"},
        queue={"type": "string"},
        name={"type": "string"},
        cron={"type": "string"},
        tz={"type": "string"},
        every_ms=INT,
        start_ms=INT,
        job=obj(
            ["body", "delay_ms", "ttl_ms", "tries", "priority"],
            body={"type": "string"},
            delay_ms=INT,
            ttl_ms=INT,
            tries=INT,
            priority=INT,
        ),
        catch_up_ms=INT,
        paused={"type": "boolean"},
        next_at_ms={
            "type": ["integer", "null"],
            "description": "the next occurrence to publish; null while paused or never",
        },
        fired={**INT, "description": "occurrences published"},
        missed={
            **INT,
            "description": "occurrences skipped: older than catch_up_ms, or refused by a "
            "full queue (max_size)",
        },
    )
    the_schedule = reply("the schedule", schedule, SCHEDULE_EXAMPLE)
    by_name: dict[str, object] = {
        "ns": "$request.path.ns",
        "q": "$request.path.q",
        "name": "$response.body#/name",
    }
    targets = [(SCHEDULE_PATH, m) for m in ("get", "delete")] + [
        (SCHEDULE_PATH + "/pause", "post"),
        (SCHEDULE_PATH + "/resume", "post"),
    ]
    saved = links(by_name, *targets)
    missing = error("no such schedule, or unknown pool", "schedule not found")
    return [
        Op(
            "GET",
            "/api/{ns}/{q}/schedules",
            "List a queue's schedules, a page at a time (HSCAN: in no set order)",
            {
                **common,
                200: reply(
                    'one page; go on with cursor until it is "0"',
                    obj(
                        ["namespace", "queue", "schedules", "cursor"],
                        namespace={"type": "string"},
                        queue={"type": "string"},
                        schedules={"type": "array", "items": schedule},
                        cursor={"type": "string", "pattern": "^[0-9]+$"},
                    ),
                    {
                        "namespace": "demo",
                        "queue": "reports",
                        "schedules": [SCHEDULE_EXAMPLE],
                        "cursor": "0",
                    },
                ),
            },
            [
                NS,
                Q,
                uint("cursor", "0 to start, then the cursor answered", 0, 2**64 - 1),
                uint("limit", "a hint, as HSCAN's COUNT", MAX_SCHEDULE_PAGE, MAX_SCHEDULE_PAGE, 1),
            ],
            tag="schedules",
        ),
        Op(
            "PUT",
            SCHEDULE_PATH,
            "Create or replace a schedule (the same definition again changes only paused)",
            {
                **common,
                200: the_schedule | {"links": saved},
                201: reply("created", schedule, SCHEDULE_EXAMPLE) | {"links": saved},
                409: E409_BUSY,
                413: E413,
            },
            [NS, Q, name],
            json_body(body, {"cron": "0 3 * * *", "tz": "Europe/Paris", "job": {"body": "build"}}),
            tag="schedules",
        ),
        Op(
            "GET",
            SCHEDULE_PATH,
            "One schedule",
            {**common, 200: the_schedule, 404: missing},
            [NS, Q, name],
            tag="schedules",
        ),
        Op(
            "DELETE",
            SCHEDULE_PATH,
            "Delete a schedule (jobs already published stay)",
            {**common, 204: NO_CONTENT, 404: missing, 409: E409_BUSY},
            [NS, Q, name],
            tag="schedules",
        ),
        Op(
            "POST",
            SCHEDULE_PATH + "/pause",
            "Stop firing",
            {**common, 200: the_schedule, 404: missing, 409: E409_BUSY},
            [NS, Q, name],
            tag="schedules",
        ),
        Op(
            "POST",
            SCHEDULE_PATH + "/resume",
            "Fire again, from the next occurrence after now",
            {**common, 200: the_schedule, 404: missing, 409: E409_BUSY},
            [NS, Q, name],
            tag="schedules",
        ),
    ]


def _ack_body() -> Schema:
    element = {
        "anyOf": [
            JOB_ID,
            {
                "type": "object",
                "properties": {
                    "job_id": JOB_ID,
                    "lease": {"anyOf": [LEASE_ID, {"type": "null"}]},
                    "result": {
                        "description": f"kept ResultSecond after the ack; any JSON value, "
                        f"at most {MAX_NOTE_BYTES} bytes compact"
                    },
                },
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
