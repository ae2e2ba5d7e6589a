"""The yardstick of ``bench_cpu.py``: the least a Starlette endpoint can do for one request
(route it, read the body, answer a small JSON object), served by uvicorn with the service's
own options (uvloop, httptools, no access log). No Redis, no auth, no metrics.

    python -m uvicorn loadtest.bare_app:app --loop uvloop --http httptools --no-access-log
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def publish(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse(
        {"msg": "published", "job_id": "01JBARE0000000000000000000", "n": len(body)}, 201
    )


app = Starlette(routes=[Route("/api/{ns}/{q}", publish, methods=["PUT"])])
