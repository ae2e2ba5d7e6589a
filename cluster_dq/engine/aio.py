"""Async executor: drives the pure operations (commands.py) on a redis.asyncio client. A
thin I/O shell over ``core`` (classification, retries, durable WAIT, stale masters)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import AsyncRetrying

from cluster_dq.clock import now_ms
from cluster_dq.engine import core, retry
from cluster_dq.engine.steps import Call, EngineConfig, Op, Step
from cluster_dq.engine.scripts import load_all
from cluster_dq.errors import RedisFailure

log = logging.getLogger(__name__)
T = TypeVar("T")
AsyncClient = Redis | RedisCluster
Observer = Callable[[float, BaseException | None], None]  # (seconds, error) of each step


class AsyncEngine:
    def __init__(
        self,
        client: AsyncClient,
        config: EngineConfig | None = None,
        observer: Observer | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 500,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.client = client
        self.clock = clock  # the one clock of this engine's callers (tests control it)
        self.config = config or EngineConfig()
        self.observer = observer
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.scripts = load_all()  # sent by sha, or by text where a node lacks one

    # -- the I/O of one attempt ---------------------------------------------------------------

    async def _call(self, call: Call) -> Any:
        try:
            return await self.client.execute_command(*core.command(call, self.scripts))
        except NoScriptError:  # not cached on that node: sent with the script's text
            return await self.client.execute_command(*core.command(call, self.scripts, True))

    async def _pipeline(self, calls: tuple[Call, ...]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for c in calls:
            core.queue_call(pipe, c, self.scripts)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        for i in core.pipeline_reloads(results):
            results[i] = await self._call(calls[i])
        return results

    async def _transport(self, step: Step) -> Any:
        return await (self._pipeline(step) if isinstance(step, tuple) else self._call(step))

    async def _step(self, step: Step) -> Any:
        """One attempt of one step, observed (the hook where tests inject faults)."""
        if self.observer is None:
            return await self._transport(step)
        started = time.perf_counter()
        try:
            reply = await self._transport(step)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.observer(time.perf_counter() - started, e)
            raise
        self.observer(time.perf_counter() - started, None)
        return reply

    async def _durable_step(self, step: Step) -> tuple[Any, int]:
        """The step's calls and a ``WAIT`` on the same connection (one pipeline; on a Cluster,
        a WAIT to each node written to): WAIT counts the replicas that have these writes."""
        calls = step if isinstance(step, tuple) else (step,)
        replies: list[Any] = [None] * len(calls)
        todo, acked = list(range(len(calls))), self.wait_replicas
        for attempt in range(2):  # the second with the text of the scripts a node lacked
            pipe = self.client.pipeline(transaction=False)
            for i in todo:
                core.queue_call(pipe, calls[i], self.scripts, source=attempt > 0)
            if isinstance(self.client, RedisCluster):
                written = core.durable_calls(tuple(calls[i] for i in todo))
                found = [self.client.get_node_from_key(c.keys[0]) for c in written]
                nodes = {n.name: n for n in found if n is not None}
                for node in nodes.values():
                    pipe.execute_command(
                        "WAIT", self.wait_replicas, self.wait_timeout_ms, target_nodes=node
                    )
            else:
                pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            got, missing, replicas = core.durable_replies(
                await pipe.execute(raise_on_error=False), len(todo)
            )
            for i, reply in zip(todo, got):
                replies[i] = reply
            acked = min(acked, replicas)
            if not missing:
                return (replies if isinstance(step, tuple) else replies[0]), acked
            todo = [todo[m] for m in missing]
        raise NoScriptError(f"scripts {[calls[i] for i in todo]} could not be loaded")

    async def _forget_connections(self) -> None:
        if isinstance(self.client, Redis):
            await self.client.connection_pool.disconnect(inuse_connections=False)

    async def _translated(self, call: Awaitable[T]) -> T:
        """The boundary: every error of an attempt leaves as the error tree's (``core``),
        ``Unsent`` when none of the attempt reached a connection."""
        attempt = core.Attempt()
        token = core.ATTEMPT.set(attempt)
        try:
            return await call
        except core.CAUGHT as e:
            if isinstance(e, _CANCEL_SHAPES) and core.cancelling():
                # redis-py turned the cancellation into a connection error: neither a failure
                # nor to be repeated
                raise asyncio.CancelledError() from e
            err = core.translate(e, sent=attempt.sent)
            if err is None:
                raise
            if core.forget_connections(err):
                await self._forget_connections()
            raise err from e
        finally:
            core.ATTEMPT.reset(token)

    # -- driving an operation -----------------------------------------------------------------

    async def _attempt(self, step: Step, how: core.How, run: core.Run[Any]) -> Any:
        try:
            if how is core.How.DURABLE:
                reply = await self._translated(self._durable_step(step))
            else:
                reply = await self._translated(self._step(step))
        except RedisFailure as e:
            run.attempted(step, e)
            raise
        run.attempted(step, None)
        return reply

    async def _send(self, step: Step, plan: core.Plan, run: core.Run[Any]) -> Any:
        try:  # the fast path: no retry machinery unless something failed
            return await self._attempt(run.stamped(step, self.clock), plan.how, run)
        except plan.retry_on:
            pass
        async for attempt in AsyncRetrying(**plan.policy):
            with attempt:
                return await self._attempt(
                    run.stamped(step, self.clock, repeat=True), plan.how, run
                )
        raise AssertionError("unreachable")

    async def _reconfirmed(
        self, step: Step, plan: core.Plan, replicas: int, run: core.Run[Any]
    ) -> int:
        """Sends the durable step again until enough replicas confirm it, within the budget
        (``Plan.reconfirm``); the first reply stands. The fewest replicas seen last."""
        try:
            async for attempt in AsyncRetrying(**core.reconfirm_policy(plan)):
                with attempt:
                    restamped = core.restamp(step, self.clock())
                    _, replicas = await self._attempt(restamped, plan.how, run)
                    core.check_confirmed(replicas, self.wait_replicas)
        except (core.Unconfirmed, RedisFailure):
            pass  # not confirmed in time: NotReplicated, with the first reply
        return replicas

    async def run(
        self,
        op: Op[T],
        *,
        idempotent: bool = False,
        durable: bool = False,
        deadline: float | None = None,
    ) -> T:
        """Drives one operation (``core.plan`` says how each step is sent and repeated).
        ``durable`` (with ``wait_replicas`` set): the job-acknowledging scripts are confirmed
        by that many replicas, else ``NotReplicated`` is raised once the operation is done.
        ``deadline`` (``time.monotonic()`` s): the request's own, the budget of its repeats
        (the request's deadline at the latest: ``retry.bounded``). A failure says whether the
        operation may have written anything (``RedisFailure.nothing_written``)."""
        run = core.Run(
            op,
            idempotent=idempotent,
            durable=durable,
            wait_replicas=self.wait_replicas,
            wait_timeout_ms=self.wait_timeout_ms,
            budget_s=self.config.retry_budget_s,
            deadline=retry.bounded(deadline),
        )
        try:
            return await self._drive(run)
        except RedisFailure as e:
            raise run.failed(e)

    async def _drive(self, run: core.Run[T]) -> T:
        reply: Any = None
        while (nxt := run.next(reply)) is not None:
            step, plan = nxt
            if plan.how is core.How.OPTIONAL:
                try:
                    reply = await self._send(step, plan, run)
                except RedisFailure as e:
                    log.warning("%s step failed, going on without it: %s", core.describe(step), e)
                    reply = None
            elif plan.how is core.How.DURABLE:
                reply, replicas = await self._send(step, plan, run)
                if plan.reconfirm and replicas < self.wait_replicas:
                    replicas = await self._reconfirmed(step, plan, replicas, run)
                run.confirmed(replicas)
            else:
                reply = await self._send(step, plan, run)
        return run.result

    # -- health ---------------------------------------------------------------------------------

    async def ping(self) -> bool:
        return bool(await self._translated(self.client.ping()))

    async def ensure_scripts(self) -> bool:
        """True when every script is cached on the server (on every master of a Cluster);
        loads the missing ones (after a failover or a SCRIPT FLUSH) before answering."""
        return await self._translated(self._ensure_scripts())

    async def _ensure_scripts(self) -> bool:
        scripts = list(self.scripts.values())
        present = await self.client.script_exists(*(s.sha for s in scripts))
        for script, there in zip(scripts, present, strict=True):
            if not there:
                await self.client.script_load(script.source)
        return True


# what a cancellation inside redis-py comes out as (a connection cut mid-command)
_CANCEL_SHAPES = (RedisConnectionError, RedisTimeoutError, OSError)
