"""Async executor: drives the pure operations of commands.py on a redis.asyncio client."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from cluster_dq.clock import now_ms
from cluster_dq.engine.commands import Call, EngineConfig, Eval, Op, Step
from cluster_dq.engine.retry import POLICY, TRANSIENT
from cluster_dq.engine.scripts import load_all

log = logging.getLogger(__name__)
T = TypeVar("T")
AsyncClient = Redis | RedisCluster
Observer = Callable[[float, BaseException | None], None]  # (seconds, error) of each step
# The writes a client is told about: a job accepted, a job acked (a lost ack means a redelivery).
DURABLE_SCRIPTS = frozenset({"publish", "republish", "ack"})


class NotReplicated(RedisError):
    """A durable write reached the master but fewer replicas than required confirmed it in
    time. ``result`` is what the operation returned (e.g. the job ids): the write may still
    be lost if the master fails now."""

    def __init__(self, acked: int, wanted: int, timeout_ms: int, result: Any) -> None:
        super().__init__(f"{acked} of {wanted} replicas confirmed the write within {timeout_ms} ms")
        self.acked, self.wanted, self.result = acked, wanted, result


class StaleMaster(RedisConnectionError):
    """A write refused with NOREPLICAS: the server has fewer good replicas than its
    ``min-replicas-to-write``. The case that matters is a master paused past a failover (a
    stall, a frozen VM) that comes back still believing it is the master: until the sentinels
    demote it (~10 s measured) it would take writes on the connections clients kept to it,
    and lose them all when it becomes a replica; reservations made there would deliver jobs
    already acked on the new master. Nothing was written. The engine drops its idle
    connections, so the next one asks Sentinel for the master again; a ConnectionError, so the
    retry policy applies where repeating is safe and the client otherwise gets a 503."""


class MovedDuringWait(RedisConnectionError):
    """A durable write's ``WAIT`` reached a node that is a replica now: the queue's slot
    moved (a Cluster failover) between the client's slot map and the write. The script itself
    followed the MOVED redirect and may have run on the new master, unconfirmed. A
    ConnectionError, so the retry policy repeats the write (a repeat of the same job ids
    reports them as present) once the client's slot map has caught up."""


REFUSED = (StaleMaster,)
# A best-effort step (a shard signal) gets a short budget: the operation it follows succeeded,
# and its caller is waiting; a signal lost here is repaired by the reconcile sweep.
OPTIONAL_POLICY = {**POLICY, "stop": stop_after_attempt(3)}


def restamp(step: Step, now: int) -> Step:
    """A step about to be sent again, its clock arguments set to ``now``."""
    if isinstance(step, tuple):
        return tuple(c.restamped(now) if isinstance(c, Eval) else c for c in step)
    return step.restamped(now) if isinstance(step, Eval) else step


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
        self.scripts = {n: client.register_script(s.source) for n, s in load_all().items()}

    async def _call(self, call: Call) -> Any:
        if isinstance(call, Eval):
            return await self.scripts[call.script](keys=list(call.keys), args=list(call.args))
        return await self.client.execute_command(*call.args)

    async def _pipeline(self, calls: tuple[Call, ...]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for c in calls:
            if isinstance(c, Eval):
                sha = self.scripts[c.script].sha
                pipe.execute_command("EVALSHA", sha, len(c.keys), *c.keys, *c.args)
            else:
                pipe.execute_command(*c.args)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        for i, r in enumerate(results):
            if isinstance(r, NoScriptError):  # after a failover or SCRIPT FLUSH
                results[i] = await self._call(calls[i])
            elif isinstance(r, Exception):
                raise r
        return results

    async def _transport(self, step: Step) -> Any:
        return await (self._pipeline(step) if isinstance(step, tuple) else self._call(step))

    async def _guarded(self, call: Awaitable[T]) -> T:
        """Every step goes through here: transport races and the two Redis replies that mean
        "the topology changed under this client" become ConnectionErrors, which the retry policy
        knows; any other error reply stays what it is."""
        try:
            return await transport_safe(call)
        except ResponseError as e:
            text = str(e)
            if text.startswith("NOREPLICAS"):
                await self._forget_connections()
                raise StaleMaster(f"write refused, nothing written ({e}): the server lost its replicas, "
                                  "or is a master that a failover replaced") from e
            if text.startswith("WAIT cannot be used with replica"):
                raise MovedDuringWait(f"the queue's slot moved during the write ({e}); the write may "
                                      "have been applied on the new master, unconfirmed") from e
            raise

    async def _forget_connections(self) -> None:
        """Drops the idle connections (the one that failed was just given back), so the next
        connection asks Sentinel where the master is. A Cluster client finds the new owner of
        the slot through its own MOVED handling once the node has demoted itself."""
        if isinstance(self.client, Redis):
            await self.client.connection_pool.disconnect(inuse_connections=False)

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

    async def _attempt(self, step: Step) -> Any:
        return await self._guarded(self._step(step))

    async def _retrying(self, step: Step) -> Any:
        return await self._retry(self._attempt, step)

    async def _once(self, step: Step) -> Any:
        """A step not safe to repeat, unless the server refused it before running it: one
        script refused for lack of replicas (a stale master) goes to the new master."""
        return await self._retry(self._attempt, step, REFUSED if isinstance(step, Eval) else ())

    async def _optional(self, step: Eval) -> Any:
        """A best-effort step: retried briefly; if it still fails, the operation goes on."""
        try:
            return await self._retry(self._attempt, step, TRANSIENT, OPTIONAL_POLICY)
        except (RedisError, OSError) as e:
            log.warning("%s step failed, going on without it: %s: %s", step.script, type(e).__name__, e)
            return None

    async def _retry(self, send: Callable[[Any], Awaitable[Any]], step: Any,
                     errors: tuple[type[BaseException], ...] = TRANSIENT,
                     policy: dict[str, Any] | None = None) -> Any:  # fmt: skip
        try:  # the fast path: no retry machinery unless something failed
            return await send(step)
        except errors:
            pass
        policy = dict(policy or POLICY)
        if errors is not TRANSIENT:
            policy["retry"] = retry_if_exception_type(errors)
        async for attempt in AsyncRetrying(**policy):
            with attempt:
                # stamped afresh: a deadline must count from when the step runs
                return await send(restamp(step, self.clock()))
        raise AssertionError("unreachable")

    async def _durable(self, call: Eval) -> tuple[Any, int]:
        return await self._guarded(self._durable_unguarded(call))

    async def _durable_unguarded(self, call: Eval) -> tuple[Any, int]:
        """The script and a ``WAIT`` on the same connection (one pipeline; on a Cluster, sent
        to the node of the script's slot): WAIT counts the replicas that have this write."""
        script = self.scripts[call.script]
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("EVALSHA", script.sha, len(call.keys), *call.keys, *call.args)
            if isinstance(self.client, RedisCluster):
                node = self.client.get_node_from_key(call.keys[0])
                pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms, target_nodes=node)
            else:
                pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            reply, acked = await pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError):  # after a failover: load it, then once more
                await self.client.script_load(script.script)
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acked, Exception):
                raise acked
            return reply, int(acked)
        raise NoScriptError(f"script {call.script} could not be loaded")

    async def run(self, op: Op[T], *, idempotent: bool = False, durable: bool = False) -> T:
        """Drives one operation. For idempotent ones each step is retried on transient errors
        (a step's arguments, job ids included, are fixed, so a repeat cannot duplicate).
        ``durable`` (with ``wait_replicas`` set): the job-acknowledging scripts are confirmed
        by that many replicas, else ``NotReplicated`` is raised once the operation is done."""
        send = self._retrying if idempotent else self._once
        durable = durable and self.wait_replicas > 0
        acked = self.wait_replicas
        reply: Any = None
        while True:
            try:
                step = op.send(reply)
            except StopIteration as stop:
                if acked < self.wait_replicas:
                    raise NotReplicated(acked, self.wait_replicas, self.wait_timeout_ms, stop.value) from None
                return stop.value  # type: ignore[no-any-return]
            if isinstance(step, Eval) and step.optional:
                reply = await self._optional(step)
            elif durable and isinstance(step, Eval) and step.script in DURABLE_SCRIPTS:
                # A repeat after a lost reply finds the job there and reports it as duplicate.
                reply, got = await self._retry(self._durable, step, TRANSIENT if idempotent else REFUSED)
                acked = min(acked, got)
            else:
                reply = await send(step)

    async def ping(self) -> bool:
        return bool(await transport_safe(self.client.ping()))

    async def ensure_scripts(self) -> bool:
        return await transport_safe(self._ensure_scripts())

    async def _ensure_scripts(self) -> bool:
        """True when every script is cached on the server (on every master of a Cluster);
        loads the missing ones (after a failover or a SCRIPT FLUSH) before answering."""
        scripts = list(self.scripts.values())
        present = await self.client.script_exists(*(s.sha for s in scripts))
        for script, there in zip(scripts, present, strict=True):
            if not there:
                await self.client.script_load(script.script)
        return True


async def transport_safe(call: Awaitable[T]) -> T:
    """redis-py's asyncio connections can leak a connection closed under a write as
    AttributeError/TypeError (asyncio) or RuntimeError (uvloop: "handler is closed") instead of
    ConnectionError (redis/redis-py#3546, #4287; seen here when 16 pump shards start at once on
    a fresh Cluster client, and when a Cluster master is killed). Such an error is transient."""
    try:
        return await call
    except (AttributeError, TypeError, RuntimeError) as e:
        if leaked_transport_race(e):
            raise RedisConnectionError(f"connection closed during a write ({type(e).__name__}: {e})") from e
        raise


def leaked_transport_race(e: BaseException) -> bool:
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(("redis/asyncio/connection.py", "redis/asyncio/cluster.py")):
            return True
        tb = tb.tb_next
    return False
