"""OpenTelemetry tracing (``cluster_dq/tracing.py``, ``http/tracing.py``), seen through the
SDK's in-memory exporter: the service (``EnableTracing``) runs in this process behind a real
HTTP server on a loopback port, over the standalone redis-server, and the client and a worker
talk to it. A publish -> process -> ack makes send, receive, process and settle spans on both
sides, named and attributed as the messaging conventions say, the process span linked to the
producer's context (never its child), the context carried in the job's attributes unchanged."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import uvicorn
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

from cluster_dq import tracing
from cluster_dq.client import AsyncClient, Bury, Retry, Worker
from cluster_dq.client.models import Job
from cluster_dq.errors import ConfigError
from cluster_dq.http.tracing import operation
from cluster_dq.localredis import Server, free_port
from cluster_dq.server import Runtime
from cluster_dq.settings import PoolSettings, Settings, load

NS = "traced"
USER_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _unset_provider() -> None:
    # The API sets its global provider once per process; the SDK's own test helpers
    # (opentelemetry.test.globals_test) undo it this way, so that no other test sees one.
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A tracer provider exporting to memory, for this test only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _unset_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _unset_provider()


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the test's process keeps its signals
        yield


@pytest.fixture
async def traced_service(
    standalone_redis: redis.Redis, redis_server: Server
) -> AsyncIterator[tuple[str, str]]:
    """(data URL, token) of the service with ``EnableTracing``, in this process (its spans
    reach this process's provider), served over HTTP on a loopback port."""
    settings = Settings(
        Pool={"default": PoolSettings("default", Addr=f"127.0.0.1:{redis_server.port}")},
        EnableTracing=True,
    )
    runtime = Runtime(settings, run_pump=False)
    await runtime.start()
    port = free_port()
    server = _Server(
        uvicorn.Config(
            runtime.data_app, host="127.0.0.1", port=port, lifespan="off", log_config=None
        )
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), task
            await asyncio.sleep(0.01)
        token = await runtime.service.create_token("default", NS, "tracing", None)
        yield f"http://127.0.0.1:{port}", token
    finally:
        server.should_exit = True
        await task
        await runtime.close()


@pytest.fixture
async def client(traced_service: tuple[str, str]) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(traced_service[0], traced_service[1], NS) as c:
        yield c


def _traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def _one(spans: list[ReadableSpan], name: str, kind: SpanKind) -> ReadableSpan:
    found = [s for s in spans if s.name == name and s.kind is kind]
    assert len(found) == 1, (name, kind, [(s.name, s.kind) for s in spans])
    return found[0]


def _messaging(span: ReadableSpan, op_type: str, op_name: str, queue: str) -> None:
    attrs = span.attributes or {}
    assert attrs["messaging.system"] == "cluster_dq"
    assert attrs["messaging.operation.type"] == op_type
    assert attrs["messaging.operation.name"] == op_name
    assert attrs["messaging.destination.name"] == f"{NS}/{queue}"


def _linked(span: ReadableSpan, to: ReadableSpan) -> bool:
    ctx = to.get_span_context()
    assert ctx is not None
    return any(
        (link.context.trace_id, link.context.span_id) == (ctx.trace_id, ctx.span_id)
        for link in span.links
    )


def _child(span: ReadableSpan, of: ReadableSpan) -> bool:
    ctx = of.get_span_context()
    assert ctx is not None and span.parent is not None
    return (span.parent.trace_id, span.parent.span_id) == (ctx.trace_id, ctx.span_id)


async def _run(client: AsyncClient, handler: Any, done: asyncio.Event) -> Worker:
    worker = Worker(client, "orders", handler, poll_timeout=0.5, announce=False, heartbeat=False)
    await worker.start()
    await asyncio.wait_for(done.wait(), 20)
    await worker.stop()
    return worker


async def test_publish_process_ack_makes_linked_spans(
    spans: InMemorySpanExporter, client: AsyncClient
) -> None:
    seen: list[Job] = []
    done = asyncio.Event()

    async def handle(job: Job) -> None:
        seen.append(job)
        done.set()

    job_id = await client.publish("orders", "close order 42", attributes={"shop": "7"})
    worker = await _run(client, handle, done)
    assert worker.counts["acked"] == 1
    got = spans.get_finished_spans()

    send = _one(list(got), f"send {NS}/orders", SpanKind.PRODUCER)
    _messaging(send, "send", "publish", "orders")
    assert (send.attributes or {})["messaging.message.id"] == job_id
    assert (send.attributes or {})["server.address"] == "127.0.0.1"
    # the producer's context rides in the job, beside the user's attributes, unchanged
    assert seen[0].attributes == {"shop": "7", "traceparent": _traceparent(send)}
    served = _one(list(got), f"send {NS}/orders", SpanKind.SERVER)
    assert _child(served, send)  # the request's traceparent header continued
    assert (served.attributes or {})["messaging.message.id"] == job_id

    receives = [s for s in got if s.name == f"receive {NS}/orders" and s.kind is SpanKind.CLIENT]
    receive = next(s for s in receives if (s.attributes or {})["messaging.batch.message_count"])
    _messaging(receive, "receive", "consume", "orders")
    assert _linked(receive, send)
    served = next(
        s
        for s in got
        if s.kind is SpanKind.SERVER and s.parent and s.parent.span_id == receive.context.span_id
    )
    assert served.name == f"receive {NS}/orders" and _linked(served, send)

    process = _one(list(got), f"process {NS}/orders", SpanKind.CONSUMER)
    _messaging(process, "process", "process", "orders")
    assert (process.attributes or {})["messaging.message.id"] == job_id
    assert process.parent is None  # a trace of its own: linked to the producer, not its child
    assert _linked(process, send)
    assert process.context.trace_id != send.context.trace_id
    assert process.status.status_code is StatusCode.UNSET

    settle = _one(list(got), f"settle {NS}/orders", SpanKind.CLIENT)  # the worker's batch ack
    _messaging(settle, "settle", "ack", "orders")
    assert (settle.attributes or {})["messaging.batch.message_count"] == 1
    assert _linked(settle, send)
    acked = _one(list(got), f"settle {NS}/orders", SpanKind.SERVER)
    assert _child(acked, settle)


async def test_a_users_traceparent_is_kept_and_linked(
    spans: InMemorySpanExporter, client: AsyncClient
) -> None:
    seen: list[Job] = []
    done = asyncio.Event()

    async def handle(job: Job) -> None:
        seen.append(job)
        done.set()

    await client.publish("orders", "x", attributes={"traceparent": USER_PARENT})
    await _run(client, handle, done)
    assert seen[0].attributes == {"traceparent": USER_PARENT}
    process = _one(list(spans.get_finished_spans()), f"process {NS}/orders", SpanKind.CONSUMER)
    assert [(link.context.trace_id, link.context.span_id) for link in process.links] == [
        (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)
    ]


async def test_an_outcome_is_settled_inside_the_process_trace(
    spans: InMemorySpanExporter, client: AsyncClient
) -> None:
    """A release or a bury the worker sends after the handler: a settle span, the process
    span's child; the process span says the handler failed."""
    done = asyncio.Event()

    async def handle(job: Job) -> None:
        if job.deliveries == 1:
            raise Retry(error="not yet")
        done.set()
        raise Bury("enough")

    await client.publish("orders", "x", tries=2)
    await _run(client, handle, done)
    got = list(spans.get_finished_spans())
    processes = [s for s in got if s.kind is SpanKind.CONSUMER]
    settles = [s for s in got if s.kind is SpanKind.CLIENT and s.name.startswith("settle ")]
    assert len(processes) == 2 and len(settles) == 2, [(s.name, s.kind) for s in got]
    names = []
    for process in processes:
        assert process.status.status_code is StatusCode.ERROR
        (settle,) = [s for s in settles if _child(s, process)]
        names.append((settle.attributes or {})["messaging.operation.name"])
        assert (settle.attributes or {})["messaging.message.id"] == (process.attributes or {})[
            "messaging.message.id"
        ]
    assert sorted(names) == ["bury", "release"]
    assert sorted(str((s.attributes or {})["error.type"]) for s in processes) == ["Bury", "Retry"]
    assert {s.name for s in got if s.kind is SpanKind.SERVER} >= {f"settle {NS}/orders"}


async def test_without_a_provider_nothing_is_traced_or_added(
    traced_service: tuple[str, str],
) -> None:
    """No tracer provider (opentelemetry installed): no span, no attribute, no middleware."""
    assert not tracing.enabled() and tracing.middleware() == []
    async with AsyncClient(traced_service[0], traced_service[1], NS) as c:
        await c.publish("orders", "a")
        await c.publish("orders", "b", attributes={"shop": "7"})
        jobs = await c.consume_many("orders", 2, timeout=5)
    assert sorted((j.text, j.attributes) for j in jobs) == [("a", None), ("b", {"shop": "7"})]


def test_the_attributes_are_the_pinned_conventions() -> None:
    from opentelemetry.semconv._incubating.attributes import messaging_attributes as m
    from opentelemetry.semconv.attributes import error_attributes, server_attributes
    from opentelemetry.semconv.schemas import Schemas

    assert tracing.MESSAGING_SYSTEM == m.MESSAGING_SYSTEM
    assert tracing.OPERATION_TYPE == m.MESSAGING_OPERATION_TYPE
    assert tracing.OPERATION_NAME == m.MESSAGING_OPERATION_NAME
    assert tracing.DESTINATION == m.MESSAGING_DESTINATION_NAME
    assert tracing.MESSAGE_ID == m.MESSAGING_MESSAGE_ID
    assert tracing.BATCH_COUNT == m.MESSAGING_BATCH_MESSAGE_COUNT
    assert tracing.ERROR_TYPE == error_attributes.ERROR_TYPE
    assert tracing.SERVER_ADDRESS == server_attributes.SERVER_ADDRESS
    assert tracing.SERVER_PORT == server_attributes.SERVER_PORT
    values = {v.value for v in m.MessagingOperationTypeValues}
    assert {"send", "receive", "process", "settle"} <= values
    assert tracing.SCHEMA_URL == list(Schemas)[-1].value  # the newest the package knows


def test_the_data_ports_messaging_routes() -> None:
    def op(method: str, path: str, query: bytes = b"") -> Any:
        scope = {"type": "http", "method": method, "path": path, "query_string": query}
        return operation(scope)

    assert op("PUT", "/api/n/q") == ("send", "publish", "n", "q", None)
    assert op("PUT", "/api/n/q/bulk") == ("send", "publish", "n", "q", None)
    assert op("GET", "/api/n/a,b") == ("receive", "consume", "n", "a,b", None)
    assert op("DELETE", "/api/n/q/job/J") == ("settle", "ack", "n", "q", "J")
    assert op("POST", "/api/n/q/ack") == ("settle", "ack", "n", "q", None)
    assert op("POST", "/api/n/q/job/J/release") == ("settle", "release", "n", "q", "J")
    assert op("POST", "/api/n/q/job/J/release", b"keep_try=1") == (
        "settle",
        "snooze",
        "n",
        "q",
        "J",
    )
    assert op("POST", "/api/n/q/job/J/bury") == ("settle", "bury", "n", "q", "J")
    for method, path in (
        ("GET", "/api/n/_workers"),
        ("GET", "/api/n/q/size"),
        ("GET", "/api/n/q/job/J"),
        ("PUT", "/api/n/q/job/J"),
        ("POST", "/api/n/q/job/J/touch"),
        ("DELETE", "/api/n/q"),
        ("GET", "/api/n//q"),
    ):
        assert op(method, path) is None, (method, path)


def test_enabling_tracing_names_what_is_missing() -> None:
    env = {"CLUSTER_DQ_ENABLETRACING": "1", "OTEL_TRACES_EXPORTER": "console"}
    assert load(None, env).EnableTracing
    env["OTEL_TRACES_EXPORTER"] = "console,no-such-exporter"
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER=no-such-exporter"):
        load(None, env)


async def test_a_bulk_publish_carries_its_send_span_into_every_job(
    spans: InMemorySpanExporter, client: AsyncClient
) -> None:
    """``publish_many``: one send span, its context in each job's attributes; a job already
    at the attribute limit gets none (the service would refuse a 17th) and is published all
    the same."""
    ids = await client.publish_many("orders", ['"a"', '"b"', '"c"'])
    send = _one(list(spans.get_finished_spans()), f"send {NS}/orders", SpanKind.PRODUCER)
    assert (send.attributes or {})["messaging.batch.message_count"] == 3
    jobs = await client.consume_many("orders", 3, timeout=5)
    assert sorted(j.id for j in jobs) == sorted(ids)
    assert {j.id: j.attributes for j in jobs} == {
        i: {"traceparent": _traceparent(send)} for i in ids
    }
    full = {f"k{i}": "v" for i in range(16)}
    jid = await client.publish("orders", "full", attributes=full)
    job = await client.get_job("orders", jid)
    assert job is not None and job.attributes == full


async def test_the_blocking_client_makes_the_same_spans(
    spans: InMemorySpanExporter, traced_service: tuple[str, str]
) -> None:
    """The blocking client is generated from the asyncio one: its publish is a send span
    whose context rides in the job, its consume a receive span linked to it."""
    from cluster_dq.client import Client

    def work() -> list[Job]:
        with Client(traced_service[0], traced_service[1], NS) as c:
            c.publish("orders", "sync")
            return c.consume_many("orders", 1, timeout=5)

    jobs = await asyncio.to_thread(work)  # (the service serves on this test's event loop)
    got = list(spans.get_finished_spans())
    send = _one(got, f"send {NS}/orders", SpanKind.PRODUCER)
    assert [j.attributes for j in jobs] == [{"traceparent": _traceparent(send)}]
    receive = _one(got, f"receive {NS}/orders", SpanKind.CLIENT)
    assert _linked(receive, send)
    assert _child(_one(got, f"send {NS}/orders", SpanKind.SERVER), send)


def test_a_propagator_that_is_not_installed_breaks_nothing() -> None:
    """``OTEL_PROPAGATORS=b3`` without the b3 package: importing opentelemetry.propagate
    raises, which broke every import of the client and the service (tracing on or off). Now
    the W3C trace context is used, with a warning."""
    import os
    import subprocess
    import sys

    code = (
        "import cluster_dq.client, cluster_dq.settings\n"
        "from cluster_dq import tracing\n"
        "carrier = {}\n"
        "tracing.propagator().inject(carrier)\n"
        "print(type(tracing.propagator()).__name__)\n"
    )
    env = {**os.environ, "OTEL_PROPAGATORS": "b3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "TraceContextTextMapPropagator"
    assert "OTEL_PROPAGATORS" in out.stderr
