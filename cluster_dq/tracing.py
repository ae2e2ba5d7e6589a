"""OpenTelemetry tracing, an optional extra (``pip install 'cluster_dq[otel]'``): the one module
that imports opentelemetry. Spans follow the messaging semantic conventions of ``SEMCONV``
(the version ``opentelemetry-semantic-conventions`` 0.66b2 carries; the conventions are still
marked in development): ``send`` (publish), ``receive`` (consume), ``process`` (a worker's
handler) and ``settle`` (ack, release, snooze, bury), each named ``{operation} {ns}/{queue}``,
``messaging.system`` ``cluster_dq``. A publish carries its span's context in the job's
attributes (``traceparent``, ``tracestate``), and a ``process`` span links to it.

Everything here is a no-op, costing one check, when opentelemetry is not installed or no
tracer provider is configured; the service makes spans only with ``EnableTracing``
(``configure_service``; its data port's spans: ``http/tracing.py``). See docs/observability.md.
"""

from __future__ import annotations

import logging

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Protocol
from urllib.parse import urlsplit

from cluster_dq import __version__
from cluster_dq.names import MAX_ATTR_VALUE, MAX_ATTRIBUTES

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, SpanKind, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    W3C = TraceContextTextMapPropagator()
    OTEL = True
except ImportError:  # the otel extra is not installed: every helper below is a no-op
    OTEL = False

_PROPAGATOR: Any = None
log = logging.getLogger(__name__)


def propagator() -> Any:
    """The process's propagator (``OTEL_PROPAGATORS``), looked up at first use: importing
    ``opentelemetry.propagate`` raises when that variable names a propagator that is not
    installed (``b3``, ``xray``...), which must not break the import of the client or the
    service. Then the W3C trace context is used, and a warning says so."""
    global _PROPAGATOR
    if _PROPAGATOR is None:
        try:
            from opentelemetry import propagate

            _PROPAGATOR = propagate.get_global_textmap()
        except Exception as e:
            log.warning("OTEL_PROPAGATORS: %s; the W3C trace context is used instead", e)
            _PROPAGATOR = W3C
    return _PROPAGATOR


SEMCONV = "1.44.0"  # the messaging conventions followed (opentelemetry-semantic-conventions 0.66b2)
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV}"
SYSTEM = "cluster_dq"  # messaging.system: not one of the conventions' well-known values

# The attributes' names, as the conventions spell them (tests/client/test_tracing.py checks
# them against the pinned package, which is not needed at run time).
MESSAGING_SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
STATUS_CODE = "http.response.status_code"

# Where a job carries its producer's context: W3C Trace Context, whatever the process's
# propagator (the attributes are the job's, read by any consumer).
TRACEPARENT, TRACESTATE = "traceparent", "tracestate"

_cached: list[Any] = [None, None]  # [the provider, its tracer]: asked again when it changes


def _tracer() -> Any:
    """The configured provider's tracer, or None: opentelemetry absent, or no provider set
    (the API's proxy or no-op one)."""
    if not OTEL:
        return None
    provider = trace.get_tracer_provider()
    if provider is _cached[0]:
        return _cached[1]
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    _cached[:] = [provider, provider.get_tracer("cluster_dq", __version__, schema_url=SCHEMA_URL)]
    return _cached[1]


def enabled() -> bool:
    """Whether spans are made now: opentelemetry installed and a tracer provider configured."""
    return _tracer() is not None


class _Job(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def attributes(self) -> Mapping[str, str] | None: ...


def job_context(attributes: Mapping[str, str] | None) -> Any:
    """The producer's span context a job carries in its attributes, or None."""
    if not OTEL or not attributes or TRACEPARENT not in attributes:
        return None
    got = W3C.extract(attributes)
    ctx = trace.get_current_span(got).get_span_context()
    return ctx if ctx.is_valid else None


def _links(attributes: Iterable[Mapping[str, str] | None]) -> list[Any]:
    return [Link(c) for c in map(job_context, attributes) if c is not None]


class Traced:
    """One span, the current one while its block runs; the block's exception is recorded on
    it (``error.type``, status ERROR). Its context goes on a request (``headers``) and, for a
    publish, into the job's attributes (``carry``)."""

    __slots__ = ("span", "_token")

    def __init__(self, span: Any) -> None:
        self.span = span
        self._token: Any = None

    def __enter__(self) -> Traced:
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(
        self,
        typ: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None:
                self.failed(type(exc).__qualname__, exc)
            self.span.end()
        finally:
            otel_context.detach(self._token)

    def failed(self, error_type: str, exc: BaseException | None = None) -> None:
        self.span.set_attribute(ERROR_TYPE, error_type)
        if exc is not None:
            self.span.record_exception(exc)
        self.span.set_status(StatusCode.ERROR)

    def headers(self, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` with this span's context (the process's propagator: ``traceparent``)."""
        propagator().inject(headers, context=trace.set_span_in_context(self.span))
        return headers

    def carry(self, attributes: Mapping[str, str] | None) -> Mapping[str, str] | None:
        """A publish's attributes with this span's context added (``traceparent``, and
        ``tracestate`` when there is one), unless they name a ``traceparent`` already (the
        user's, kept as it is), or the job could not take them (16 attributes at most; a
        ``tracestate`` over 128 characters is left out, as the service would cut it)."""
        given = dict(attributes or {})
        if any(k.lower() == TRACEPARENT for k in given):
            return attributes
        carrier: dict[str, str] = {}
        W3C.inject(carrier, trace.set_span_in_context(self.span))
        if len(carrier.get(TRACESTATE, "")) > MAX_ATTR_VALUE or any(
            k.lower() == TRACESTATE for k in given
        ):
            carrier.pop(TRACESTATE, None)
        if len(given) + len(carrier) > MAX_ATTRIBUTES:  # room for the traceparent alone?
            carrier.pop(TRACESTATE, None)
        if not carrier or len(given) + len(carrier) > MAX_ATTRIBUTES:
            return attributes
        return {**given, **carrier}

    def message(self, job_id: str) -> None:
        self.span.set_attribute(MESSAGE_ID, job_id)

    def jobs(self, jobs: Sequence[_Job], batch: bool) -> None:
        """What a receive got: the job's id (or, ``batch``, how many) and a link to each job's
        producer."""
        if batch:
            self.span.set_attribute(BATCH_COUNT, len(jobs))
        elif jobs:
            self.span.set_attribute(MESSAGE_ID, jobs[0].id)
        for link in _links(j.attributes for j in jobs):
            self.span.add_link(link.context)

    def set(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)


class _Off:
    """What every helper answers when no span is made: the same surface, doing nothing."""

    __slots__ = ()

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def failed(self, error_type: str, exc: BaseException | None = None) -> None:
        return None

    def headers(self, headers: dict[str, str]) -> dict[str, str]:
        return headers

    def carry(self, attributes: Mapping[str, str] | None) -> Mapping[str, str] | None:
        return attributes

    def message(self, job_id: str) -> None:
        return None

    def jobs(self, jobs: Sequence[_Job], batch: bool) -> None:
        return None

    def set(self, key: str, value: Any) -> None:
        return None


OFF = _Off()
Span = Traced | _Off


def _attributes(op_type: str, op_name: str, destination: str) -> dict[str, Any]:
    return {
        MESSAGING_SYSTEM: SYSTEM,
        OPERATION_TYPE: op_type,
        OPERATION_NAME: op_name,
        DESTINATION: destination,
    }


def _destination(ns: str, queues: str | Sequence[str]) -> str:
    return f"{ns}/{queues if isinstance(queues, str) else ','.join(queues)}"


# -- the client's spans: one per request of a messaging verb ------------------------------------

_KINDS = {"send": "PRODUCER", "receive": "CLIENT", "settle": "CLIENT"}


def client_span(
    op_type: str,
    op_name: str,
    url: str,
    ns: str,
    queues: str | Sequence[str],
    *,
    count: int | None = None,
    job_id: str | None = None,
    jobs: Iterable[Any] = (),
) -> Span:
    """A span of the client around one request: ``send`` (a producer span: its context is
    the jobs' creation context), ``receive`` or ``settle``. ``count``: the jobs of a batch
    verb; ``job_id``: the one job it is about; ``jobs``: the jobs a settle is about (linked
    to their producers)."""
    tracer = _tracer()
    if tracer is None:
        return OFF
    destination = _destination(ns, queues)
    attributes = _attributes(op_type, op_name, destination)
    if count is not None:
        attributes[BATCH_COUNT] = count
    if job_id is not None:
        attributes[MESSAGE_ID] = job_id
    where = urlsplit(url)
    if where.hostname:
        attributes[SERVER_ADDRESS] = where.hostname
        port = where.port or (443 if where.scheme == "https" else 80)
        attributes[SERVER_PORT] = port
    links = _links(getattr(j, "attributes", None) for j in jobs)
    span = tracer.start_span(
        f"{op_type} {destination}",
        kind=getattr(SpanKind, _KINDS[op_type]),
        attributes=attributes,
        links=links or None,
    )
    return Traced(span)


# -- the worker: a process span around each handler call, settles as its children -------------

# (job id, its process span's context), set in the task that runs the job: the outcome sent
# after the handler, in that task, is the process span's child (``after_process``).
_processed: ContextVar[tuple[str, Any] | None] = ContextVar("cluster_dq_processed", default=None)


async def process(job: Any, call_next: Callable[[Any], Any]) -> Any:
    """The worker's outermost middleware while tracing: a ``process`` span (kind CONSUMER)
    around the handler call, the root of a trace of its own linked to the job's producer
    (the context in its attributes), never its child."""
    tracer = _tracer()
    if tracer is None:
        return await call_next(job)
    attributes = _attributes("process", "process", f"{job.namespace}/{job.queue}")
    attributes[MESSAGE_ID] = job.id
    span = tracer.start_span(
        f"process {job.namespace}/{job.queue}",
        context=Context(),  # a root: the producer is a link, not the parent
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=_links([job.attributes]) or None,
    )
    try:
        with Traced(span):
            return await call_next(job)
    finally:
        _processed.set((job.id, span.get_span_context()))


def middleware() -> list[Any]:
    """What a worker puts outermost in its chain: ``process`` while tracing, else nothing
    (no cost per job)."""
    return [process] if enabled() else []


@contextlib.contextmanager
def after_process(job_id: str) -> Iterator[None]:
    """Within it, spans are children of ``job_id``'s process span, when this task ran it."""
    done = _processed.get()
    if not OTEL or done is None or done[0] != job_id:
        yield
        return
    token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(done[1])))
    try:
        yield
    finally:
        otel_context.detach(token)


# -- the service --------------------------------------------------------------------------------


def server_span(
    headers: Mapping[str, str],
    op_type: str,
    op_name: str,
    ns: str,
    queues: str,
    job_id: str | None = None,
) -> Span:
    """A span (kind SERVER) of the service around one request of the data port, a child of
    the request's ``traceparent`` when it has one."""
    tracer = _tracer()
    if tracer is None:
        return OFF
    destination = _destination(ns, queues)
    attributes = _attributes(op_type, op_name, destination)
    if job_id is not None:
        attributes[MESSAGE_ID] = job_id
    span = tracer.start_span(
        f"{op_type} {destination}",
        context=propagator().extract(headers),
        kind=SpanKind.SERVER,
        attributes=attributes,
    )
    return Traced(span)


def missing(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why the service could not export spans (``EnableTracing``), or None: the SDK, or the
    exporter ``OTEL_TRACES_EXPORTER`` names (``otlp`` by default), not installed."""
    if not OTEL:
        return "opentelemetry is not installed: pip install 'cluster_dq[otel]'"
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return "opentelemetry-sdk is not installed: pip install 'cluster_dq[otel]'"
    for name in _exporter_names(environ):
        if _exporter(name) is None:
            return (
                f"OTEL_TRACES_EXPORTER={name}: no such exporter installed (otlp: pip install "
                "opentelemetry-exporter-otlp; console: printed on standard output)"
            )
    return None


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    return [n for n in names if n and n != "none"]


def _exporter(name: str) -> Any:
    from importlib.metadata import entry_points

    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    return next(iter(found)).load() if found else None


def configure_service(environ: Mapping[str, str] = os.environ) -> Callable[[], None]:
    """For ``EnableTracing``, in each worker process: a tracer provider of the SDK exporting
    to what ``OTEL_TRACES_EXPORTER`` names, in batches (the SDK's ``OTEL_*`` variables
    apply: sampler, resource, endpoint), unless the process has a provider already (one set
    by ``opentelemetry-instrument``). Returns what flushes and stops it, for the exit."""
    if enabled():
        return lambda: None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "cluster-dq"}))
    provider = TracerProvider(resource=resource)
    for name in _exporter_names(environ):
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)()))
    trace.set_tracer_provider(provider)
    return provider.shutdown
