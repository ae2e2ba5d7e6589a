"""The fleet's yardstick for ``bench_scale.py --bare``: the least an instance can do to serve
the load profile's requests. An in-process delayed queue with the service's routes and reply
shapes, served by uvicorn with the service's options (uvloop, httptools, no access log): no
Redis, no auth, no metrics, no pump, no notices. A job published to one instance is delivered
by that instance only, each job due wakes exactly one waiting long-poll, and an ack is a 204.

What it costs per request over 1 and 8 instances is what the HTTP hop, nginx's spreading and a
process serving a smaller share of the load cost by themselves; what cluster_dq costs above it
is coordination.

    python -m uvicorn loadtest.bare_queue:app --loop uvloop --http httptools --no-access-log
"""

from __future__ import annotations

import asyncio
import base64
import collections
import itertools

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

_ids = itertools.count()
_ready: dict[str, collections.deque[tuple[str, bytes]]] = collections.defaultdict(collections.deque)
_waiters: collections.deque[asyncio.Future[None]] = collections.deque()


def _due(queue: str, job_id: str, body: bytes) -> None:
    _ready[queue].append((job_id, body))
    while _waiters:  # one waiter per job
        w = _waiters.popleft()
        if not w.done():
            w.set_result(None)
            return


async def publish(request: Request) -> Response:
    body = await request.body()
    delay_ms = int(request.query_params.get("delay_ms", "0"))
    job_id = f"01JBARE{next(_ids):019d}"
    q = request.path_params["q"]
    asyncio.get_running_loop().call_later(delay_ms / 1000, _due, q, job_id, body)
    return JSONResponse({"msg": "published", "job_id": job_id}, 201)


def _take(ns: str, queues: list[str]) -> Response | None:
    for q in queues:
        if _ready[q]:
            job_id, body = _ready[q].popleft()
            return JSONResponse(
                {
                    "msg": "new job",
                    "namespace": ns,
                    "queue": q,
                    "data": base64.b64encode(body).decode(),
                    "job_id": job_id,
                    "elapsed_ms": 0,
                    "remain_tries": 2,
                }
            )
    return None


async def consume(request: Request) -> Response:
    ns, queues = request.path_params["ns"], request.path_params["q"].split(",")
    deadline = asyncio.get_running_loop().time() + float(request.query_params.get("timeout", "0"))
    while True:
        found = _take(ns, queues)
        if found is not None:
            return found
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return JSONResponse({"msg": "no job available"}, 404)
        w = asyncio.get_running_loop().create_future()
        _waiters.append(w)
        try:
            await asyncio.wait_for(w, left)
        except TimeoutError:
            pass


async def ack(request: Request) -> Response:
    return Response(status_code=204)


async def token(request: Request) -> Response:
    return JSONResponse({"token": "bare"}, 201)


async def ready(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


app = Starlette(
    routes=[
        Route("/api/{ns}/{q}", publish, methods=["PUT"]),
        Route("/api/{ns}/{q}", consume, methods=["GET"]),
        Route("/api/{ns}/{q}/job/{job_id}", ack, methods=["DELETE"]),
        Route("/token/{ns}", token, methods=["POST"]),
        Route("/readyz", ready, methods=["GET"]),
    ]
)
