"""The service's data app (and its token route) as one ASGI app with a lifespan, for serving
under Granian in ``bench_cpu.py --granian``: the same Runtime a worker builds, settings from
the environment (``CLUSTER_DQ_*``). A benchmark harness, not a way to run the service: it has
none of the connection rules ``cluster_dq.http.protocol`` adds to uvicorn.

    granian --interface asgi --loop uvloop --workers 1 loadtest.granian_service:app
"""

from __future__ import annotations

from typing import Any

from cluster_dq.server import Runtime
from cluster_dq.settings import load

_runtime: Runtime | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global _runtime
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _runtime = Runtime(load())
                await _runtime.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if _runtime is not None:
                    _runtime.stop_consuming()
                    await _runtime.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    assert _runtime is not None, "served without its lifespan"
    token_route = scope["type"] == "http" and scope["path"].startswith("/token")
    await (_runtime.admin_app if token_route else _runtime.data_app)(scope, receive, send)
