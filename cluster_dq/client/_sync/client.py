# Generated from cluster_dq/client/_async/client.py by scripts/unasync.py:
# edit that file, then run the script.
"""``Client``: the blocking client of the data port. Each method sends one call of the pure
core (``_verbs``) through ``_send``, under the one retry rule (``_retry``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import httpx
from tenacity import Retrying

from cluster_dq import tracing
from cluster_dq.client import _control as c
from cluster_dq.client import _groups as g
from cluster_dq.client import _verbs as v
from cluster_dq.client import _workers as w
from cluster_dq.client._core import (
    NAMESPACE_ENV,
    TOKEN_ENV,
    URL_ENV,
    Call,
    finish,
    setting,
    shell_options,
)
from cluster_dq.client._groups import UNSET, Unset
from cluster_dq.client._retry import policy, repeatable
from cluster_dq.client._transport import Sender, sync_sender
from cluster_dq.client.models import (
    Backoff,
    DeadJob,
    DeadPage,
    GroupInfo,
    GroupPage,
    Job,
    Publication,
    QueueInfo,
    QueuePage,
    QueueSettings,
    Schedule,
    SchedulePage,
    Sizes,
    Sweep,
    WorkerPage,
)

T = TypeVar("T")


class _Shell:
    """The I/O of one port: a sender (``_transport``), the retry loop."""

    def __init__(self, sender: Sender, timeout: float | None, retries: int) -> None:
        self._sender, self._timeout, self._retries = sender, timeout, retries

    def _send(self, call: Call[T]) -> T:
        try:
            return self._once(call)  # most calls: one attempt, no retry loop to set up
        except Exception as e:
            if not self._retries or not repeatable(call.safety, e):
                raise
            first = [e]
        retrying = Retrying(**policy(call.safety, self._retries))
        done: T = retrying(self._again, call, first)
        return done

    def _again(self, call: Call[T], first: list[Exception]) -> T:
        """The retry loop's attempts: the first attempt's failure, then attempts anew."""
        if first:
            raise first.pop()
        return self._once(call)

    def _once(self, call: Call[T]) -> T:
        timeout = None if self._timeout is None else self._timeout + call.wait
        reply = self._sender.request(
            call.method, call.path, call.params, call.headers, call.content, timeout
        )
        return finish(call, reply)

    def close(self) -> None:
        self._sender.close()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_S = TypeVar("_S", bound=_Shell)


class Client(_Shell):
    """The data port of one namespace. ``url``, ``token``, ``namespace`` default to
    CLUSTER_DQ_URL, CLUSTER_DQ_TOKEN, CLUSTER_DQ_NAMESPACE. Times are float seconds."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        namespace: str | None = None,
        *,
        timeout: float | None = 30.0,
        max_connections: int = 100,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        shell_options(timeout, max_connections, retries)
        env = os.environ
        self.url = setting(url, env, URL_ENV, "service url")
        self.namespace = setting(namespace, env, NAMESPACE_ENV, "namespace")
        headers = {"X-Token": setting(token, env, TOKEN_ENV, "token")}
        sender = sync_sender(self.url, headers, max_connections, transport)
        super().__init__(sender, timeout, retries)

    def publish(
        self,
        queue: str,
        body: bytes | str,
        *,
        delay: float = 0.0,
        ttl: float | None = None,
        tries: int | None = None,
        job_id: str | None = None,
        attributes: Mapping[str, str] | None = None,
        backoff: Backoff | None = None,
        priority: int | None = None,
        dedup_key: str | None = None,
        dedup_mode: str | None = None,
        dedup_ttl: float | None = None,
        idempotency_key: str | None = None,
        group: str | None = None,
    ) -> str:
        """Publishes one job; its id (with a dedup key, the key's job's: ``publish_outcome``
        says which happened)."""
        done = self.publish_outcome(
            queue,
            body,
            delay=delay,
            ttl=ttl,
            tries=tries,
            job_id=job_id,
            attributes=attributes,
            backoff=backoff,
            priority=priority,
            dedup_key=dedup_key,
            dedup_mode=dedup_mode,
            dedup_ttl=dedup_ttl,
            idempotency_key=idempotency_key,
            group=group,
        )
        return done.job_id

    def publish_outcome(
        self,
        queue: str,
        body: bytes | str,
        *,
        delay: float = 0.0,
        ttl: float | None = None,
        tries: int | None = None,
        job_id: str | None = None,
        attributes: Mapping[str, str] | None = None,
        backoff: Backoff | None = None,
        priority: int | None = None,
        dedup_key: str | None = None,
        dedup_mode: str | None = None,
        dedup_ttl: float | None = None,
        idempotency_key: str | None = None,
        group: str | None = None,
    ) -> Publication:
        """``publish``, answering what happened: the job id, the dedup outcome (``"new"``,
        ``"existing"``, ``"replaced"``), whether ``job_id`` existed already, whether this is
        the first answer to ``idempotency_key`` repeated."""
        with tracing.client_span("send", "publish", self.url, self.namespace, queue) as span:
            call = v.publish_outcome(
                self.namespace,
                queue,
                body,
                delay=delay,
                ttl=ttl,
                tries=tries,
                job_id=job_id,
                attributes=span.carry(attributes),  # the job's creation context: this span
                backoff=backoff,
                priority=priority,
                dedup_key=dedup_key,
                dedup_mode=dedup_mode,
                dedup_ttl=dedup_ttl,
                idempotency_key=idempotency_key,
                group=group,
            )
            done = self._send(v.traced(call, span))
            span.message(done.job_id)
            return done

    def publish_many(
        self,
        queue: str,
        bodies: Iterable[bytes | str],
        *,
        delay: float = 0.0,
        ttl: float | None = None,
        tries: int | None = None,
        idempotency_key: str | None = None,
        group: str | None = None,
    ) -> list[str]:
        with tracing.client_span("send", "publish", self.url, self.namespace, queue) as span:
            call = v.publish_many(
                self.namespace,
                queue,
                bodies,
                delay=delay,
                ttl=ttl,
                tries=tries,
                attributes=span.carry(None),
                idempotency_key=idempotency_key,
                group=group,
            )
            done = self._send(v.traced(call, span))
            span.set(tracing.BATCH_COUNT, len(done))
            return done

    def republish(
        self,
        queue: str,
        job_id: str,
        body: bytes | str,
        *,
        lease: str | None = None,
        delay: float = 0.0,
        ttl: float | None = None,
        tries: int | None = None,
        new_job_id: str | None = None,
        group: str | None = None,
    ) -> str:
        call = v.republish(
            self.namespace,
            queue,
            job_id,
            body,
            lease=lease,
            delay=delay,
            ttl=ttl,
            tries=tries,
            new_job_id=new_job_id,
            group=group,
        )
        return self._send(call)

    def consume(
        self, queues: str | Sequence[str], *, ttr: float | None = None, timeout: float = 0.0
    ) -> Job | None:
        with tracing.client_span("receive", "consume", self.url, self.namespace, queues) as span:
            call = v.consume(self.namespace, queues, ttr=ttr, timeout=timeout)
            job = self._send(v.traced(call, span))
            span.jobs([job] if job else [], batch=False)
            return job

    def consume_many(
        self,
        queues: str | Sequence[str],
        count: int,
        *,
        ttr: float | None = None,
        timeout: float = 0.0,
    ) -> list[Job]:
        with tracing.client_span("receive", "consume", self.url, self.namespace, queues) as span:
            call = v.consume_many(self.namespace, queues, count, ttr=ttr, timeout=timeout)
            jobs = self._send(v.traced(call, span))
            span.jobs(jobs, batch=True)
            return jobs

    def ack(self, queue: str, job_id: str, *, lease: str | None = None, result: Any = None) -> None:
        ns = self.namespace
        with tracing.client_span("settle", "ack", self.url, ns, queue, job_id=job_id) as span:
            call = v.ack(ns, queue, job_id, lease=lease, result=result)
            return self._send(v.traced(call, span))

    def ack_many(self, queue: str, jobs: Iterable[Job | tuple[str, str | None]]) -> None:
        jobs = list(jobs)
        with tracing.client_span(
            "settle", "ack", self.url, self.namespace, queue, count=len(jobs), jobs=jobs
        ) as span:
            return self._send(v.traced(v.ack_many(self.namespace, queue, jobs), span))

    def touch(
        self, queue: str, job_id: str, *, lease: str | None = None, ttr: float | None = None
    ) -> None:
        return self._send(v.touch(self.namespace, queue, job_id, lease=lease, ttr=ttr))

    def release(
        self,
        queue: str,
        job_id: str,
        *,
        lease: str | None = None,
        delay: float | None = None,
        error: str | None = None,
        keep_try: bool = False,
    ) -> str:
        call = v.release(
            self.namespace, queue, job_id, lease=lease, delay=delay, error=error, keep_try=keep_try
        )
        name = "snooze" if keep_try else "release"
        ns = self.namespace
        with tracing.client_span("settle", name, self.url, ns, queue, job_id=job_id) as span:
            return self._send(v.traced(call, span))

    def progress(self, queue: str, job_id: str, value: Any, *, lease: str | None = None) -> None:
        return self._send(v.progress(self.namespace, queue, job_id, value, lease=lease))

    def bury(
        self, queue: str, job_id: str, *, reason: str | None = None, lease: str | None = None
    ) -> Job:
        call = v.bury(self.namespace, queue, job_id, reason=reason, lease=lease)
        ns = self.namespace
        with tracing.client_span("settle", "bury", self.url, ns, queue, job_id=job_id) as span:
            return self._send(v.traced(call, span))

    def kick(
        self,
        queue: str,
        job_id: str,
        *,
        delay: float | None = None,
        tries: int | None = None,
        ttl: float | None = None,
    ) -> Job:
        return self._send(v.kick(self.namespace, queue, job_id, delay=delay, tries=tries, ttl=ttl))

    def reschedule(
        self, queue: str, job_id: str, *, delay: float | None = None, at: float | None = None
    ) -> Job:
        return self._send(v.reschedule(self.namespace, queue, job_id, delay=delay, at=at))

    def cancel(self, queue: str, job_id: str) -> str | None:
        return self._send(v.cancel(self.namespace, queue, job_id))

    def peek(self, queue: str) -> Job | None:
        return self._send(v.peek(self.namespace, queue))

    def get_job(self, queue: str, job_id: str) -> Job | None:
        return self._send(v.get_job(self.namespace, queue, job_id))

    def size(self, queue: str) -> Sizes:
        return self._send(v.size(self.namespace, queue))

    def destroy(self, queue: str) -> None:
        return self._send(v.destroy(self.namespace, queue))

    # -- who is running what ------------------------------------------------------------------

    def workers(self) -> WorkerPage:
        """The namespace's workers: announced, not run out, and the jobs each holds."""
        return self._send(w.workers(self.namespace))

    def announce_worker(
        self, worker_id: str, info: Mapping[str, Any], *, ttl: float = 30.0
    ) -> float:
        """Announces a worker for ``ttl`` seconds (``Worker`` does it itself); when it runs out
        (epoch seconds)."""
        return self._send(w.announce(self.namespace, worker_id, info, ttl=ttl))

    def retire_worker(self, worker_id: str) -> None:
        return self._send(w.retire(self.namespace, worker_id))

    # -- dead letters ---------------------------------------------------------------------------

    def dead_jobs(self, queue: str, *, cursor: str | None = None, limit: int = 100) -> DeadPage:
        return self._send(c.dead_jobs(self.namespace, queue, cursor=cursor, limit=limit))

    def iter_dead(self, queue: str, *, limit: int = 100) -> Iterator[DeadJob]:
        """Every dead job of the queue, page by page (each job that stays dead once)."""
        cursor: str | None = None
        while True:
            page = self._send(c.dead_jobs(self.namespace, queue, cursor=cursor, limit=limit))
            for job in page.jobs:
                yield job
            if not page.more:
                return
            cursor = page.cursor

    def redrive(
        self,
        queue: str,
        *,
        reason: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Sweep:
        call = c.redrive(
            self.namespace,
            queue,
            reason=reason,
            since=since,
            until=until,
            limit=limit,
            cursor=cursor,
        )
        return self._send(call)

    def purge(
        self,
        queue: str,
        *,
        reason: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Sweep:
        call = c.purge(
            self.namespace,
            queue,
            reason=reason,
            since=since,
            until=until,
            limit=limit,
            cursor=cursor,
        )
        return self._send(call)

    def dead_size(self, queue: str) -> int:
        return self._send(c.dead_size(self.namespace, queue))

    def dead_peek(self, queue: str) -> tuple[int, str | None]:
        return self._send(c.dead_peek(self.namespace, queue))

    def respawn(self, queue: str, *, limit: int = 1, ttl: float | None = None) -> int:
        return self._send(c.respawn(self.namespace, queue, limit=limit, ttl=ttl))

    def dead_delete(self, queue: str, *, limit: int = 1) -> None:
        return self._send(c.dead_delete(self.namespace, queue, limit=limit))

    # -- queue control --------------------------------------------------------------------------

    def settings(self, queue: str) -> QueueSettings:
        return self._send(c.settings(self.namespace, queue))

    def update_settings(self, queue: str, **changes: Any) -> QueueSettings:
        return self._send(c.update_settings(self.namespace, queue, **changes))

    def pause(self, queue: str, *, create: bool = False) -> QueueSettings:
        """Stops deliveries from ``queue``. One that does not exist (no job, settings or
        schedule) is ``NotFound`` and nothing changes, unless ``create`` (pause it before its
        first publish)."""
        return self._send(c.pause(self.namespace, queue, create=create))

    def resume(self, queue: str) -> QueueSettings:
        return self._send(c.pause(self.namespace, queue, paused=False))

    def queues(self, *, cursor: str | None = None, limit: int = 100) -> QueuePage:
        return self._send(c.queues(self.namespace, cursor=cursor, limit=limit))

    def iter_queues(self, *, limit: int = 100) -> Iterator[QueueInfo]:
        """Every queue of the namespace, by name, page by page."""
        cursor: str | None = None
        while True:
            page = self._send(c.queues(self.namespace, cursor=cursor, limit=limit))
            for info in page.queues:
                yield info
            if page.cursor is None:
                return
            cursor = page.cursor

    # -- groups -------------------------------------------------------------------------------

    def groups(self, queue: str, *, cursor: str | None = None, limit: int = 100) -> GroupPage:
        return self._send(g.groups(self.namespace, queue, cursor=cursor, limit=limit))

    def iter_groups(self, queue: str, *, limit: int = 100) -> Iterator[GroupInfo]:
        """Every group of the queue that holds jobs, page by page, each once."""
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            page = self._send(g.groups(self.namespace, queue, cursor=cursor, limit=limit))
            for info in page.groups:
                if info.name not in seen:
                    seen.add(info.name)
                    yield info
            if page.cursor is None:
                return
            cursor = page.cursor

    def group(self, queue: str, name: str) -> GroupInfo:
        return self._send(g.group(self.namespace, queue, name))

    def update_group(
        self,
        queue: str,
        name: str,
        *,
        paused: bool | Unset = UNSET,
        concurrency: int | None | Unset = UNSET,
        rate: str | None | Unset = UNSET,
    ) -> GroupInfo:
        """Changes the settings given (None removes one; one not given is left as it is):
        ``concurrency``, at most this many of its jobs reserved at once; ``rate``, at most
        ``"<jobs>/<window>"`` deliveries (``"10/1s"``, ``"600/1m"``, ``"5/250ms"``)."""
        ns = self.namespace
        call = g.update_group(ns, queue, name, paused=paused, concurrency=concurrency, rate=rate)
        return self._send(call)

    def pause_group(self, queue: str, name: str) -> GroupInfo:
        """Holds the group's jobs back; the queue's other groups go on."""
        return self._send(g.pause_group(self.namespace, queue, name))

    def resume_group(self, queue: str, name: str) -> GroupInfo:
        return self._send(g.pause_group(self.namespace, queue, name, paused=False))

    # -- recurring jobs -------------------------------------------------------------------------

    def put_schedule(
        self,
        queue: str,
        name: str,
        *,
        cron: str | None = None,
        tz: str | None = None,
        every: float | None = None,
        start_at: float | None = None,
        catch_up: float | None = None,
        paused: bool = False,
        body: str = "",
        delay: float | None = None,
        ttl: float | None = None,
        tries: int | None = None,
        priority: int | None = None,
        group: str | None = None,
    ) -> Schedule:
        call = c.put_schedule(
            self.namespace,
            queue,
            name,
            cron=cron,
            tz=tz,
            every=every,
            start_at=start_at,
            catch_up=catch_up,
            paused=paused,
            body=body,
            delay=delay,
            ttl=ttl,
            tries=tries,
            priority=priority,
            group=group,
        )
        return self._send(call)

    def get_schedule(self, queue: str, name: str) -> Schedule | None:
        return self._send(c.get_schedule(self.namespace, queue, name))

    def list_schedules(
        self, queue: str, *, cursor: str | None = None, limit: int = 100
    ) -> SchedulePage:
        return self._send(c.list_schedules(self.namespace, queue, cursor=cursor, limit=limit))

    def delete_schedule(self, queue: str, name: str) -> None:
        return self._send(c.delete_schedule(self.namespace, queue, name))

    def pause_schedule(self, queue: str, name: str) -> Schedule:
        return self._send(c.pause_schedule(self.namespace, queue, name))

    def resume_schedule(self, queue: str, name: str) -> Schedule:
        return self._send(c.pause_schedule(self.namespace, queue, name, paused=False))
