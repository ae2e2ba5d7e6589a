"""Sync executor (batch tools, Spark partitions): the same operations on a blocking redis
client. A thin I/O shell over ``core``, as ``aio.py`` is: the same classification, retries,
durable WAIT and stale-master handling."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError
from tenacity import Retrying

from cluster_dq.clock import now_ms
from cluster_dq.engine import core, retry
from cluster_dq.engine.steps import Call, EngineConfig, Op, Step
from cluster_dq.engine.scripts import load_all
from cluster_dq.errors import RedisFailure

log = logging.getLogger(__name__)
T = TypeVar("T")
SyncClient = Redis | RedisCluster
Observer = Callable[[float, BaseException | None], None]  # (seconds, error) of each step


class SyncEngine:
    def __init__(
        self,
        client: SyncClient,
        config: EngineConfig | None = None,
        observer: Observer | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 500,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.client = client
        self.clock = clock
        self.config = config or EngineConfig()
        self.observer = observer
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.scripts = load_all()  # sent by sha, or by text where a node lacks one

    # -- the I/O of one attempt ---------------------------------------------------------------

    def _call(self, call: Call) -> Any:
        try:
            return self.client.execute_command(*core.command(call, self.scripts))  # type: ignore[no-untyped-call]
        except NoScriptError:  # not cached on that node: sent with the script's text
            return self.client.execute_command(*core.command(call, self.scripts, True))  # type: ignore[no-untyped-call]

    def _pipeline(self, calls: tuple[Call, ...]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for c in calls:
            core.queue_call(pipe, c, self.scripts)
        results: list[Any] = pipe.execute(raise_on_error=False)
        for i in core.pipeline_reloads(results):
            results[i] = self._call(calls[i])
        return results

    def _transport(self, step: Step) -> Any:
        return self._pipeline(step) if isinstance(step, tuple) else self._call(step)

    def _step(self, step: Step) -> Any:
        """One attempt of one step, observed (the hook where tests inject faults)."""
        if self.observer is None:
            return self._transport(step)
        started = time.perf_counter()
        try:
            reply = self._transport(step)
        except Exception as e:
            self.observer(time.perf_counter() - started, e)
            raise
        self.observer(time.perf_counter() - started, None)
        return reply

    def _durable_step(self, step: Step) -> tuple[Any, int]:
        """The step's calls and a ``WAIT`` on the same connection (see ``AsyncEngine``)."""
        calls = step if isinstance(step, tuple) else (step,)
        replies: list[Any] = [None] * len(calls)
        todo, acked = list(range(len(calls))), self.wait_replicas
        for attempt in range(2):  # the second with the text of the scripts a node lacked
            pipe = self.client.pipeline(transaction=False)
            for i in todo:
                core.queue_call(pipe, calls[i], self.scripts, source=attempt > 0)
            if isinstance(self.client, RedisCluster):
                written = core.durable_calls(tuple(calls[i] for i in todo))
                found = [self.client.get_node_from_key(c.keys[0]) for c in written]  # type: ignore[no-untyped-call]
                nodes = {n.name: n for n in found if n is not None}
                for node in nodes.values():
                    pipe.execute_command(
                        "WAIT", self.wait_replicas, self.wait_timeout_ms, target_nodes=node
                    )
            else:
                pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            got, missing, replicas = core.durable_replies(
                pipe.execute(raise_on_error=False), len(todo)
            )
            for i, reply in zip(todo, got):
                replies[i] = reply
            acked = min(acked, replicas)
            if not missing:
                return (replies if isinstance(step, tuple) else replies[0]), acked
            todo = [todo[m] for m in missing]
        raise NoScriptError(f"scripts {[calls[i] for i in todo]} could not be loaded")

    def _forget_connections(self) -> None:
        if isinstance(self.client, Redis):
            self.client.connection_pool.disconnect(inuse_connections=False)

    def _translated(self, call: Callable[[], T]) -> T:
        """The boundary: every error of an attempt leaves as the error tree's (``core``)."""
        try:
            return call()
        except core.CAUGHT as e:
            err = core.translate(e)
            if err is None:
                raise
            if core.forget_connections(err):
                self._forget_connections()
            raise err from e

    # -- driving an operation -----------------------------------------------------------------

    def _attempt(self, step: Step, how: core.How, run: core.Run[Any]) -> Any:
        try:
            if how is core.How.DURABLE:
                reply = self._translated(lambda: self._durable_step(step))
            else:
                reply = self._translated(lambda: self._step(step))
        except RedisFailure as e:
            run.attempted(step, e)
            raise
        run.attempted(step, None)
        return reply

    def _send(self, step: Step, plan: core.Plan, run: core.Run[Any]) -> Any:
        try:  # the fast path: no retry machinery unless something failed
            return self._attempt(run.stamped(step, self.clock), plan.how, run)
        except plan.retry_on:
            pass
        for attempt in Retrying(**plan.policy):
            with attempt:
                return self._attempt(run.stamped(step, self.clock, repeat=True), plan.how, run)
        raise AssertionError("unreachable")

    def _reconfirmed(self, step: Step, plan: core.Plan, replicas: int, run: core.Run[Any]) -> int:
        """As ``AsyncEngine._reconfirmed``."""
        try:
            for attempt in Retrying(**core.reconfirm_policy(plan)):
                with attempt:
                    _, replicas = self._attempt(core.restamp(step, self.clock()), plan.how, run)
                    core.check_confirmed(replicas, self.wait_replicas)
        except (core.Unconfirmed, RedisFailure):
            pass
        return replicas

    def run(
        self,
        op: Op[T],
        *,
        idempotent: bool = False,
        durable: bool = False,
        deadline: float | None = None,
    ) -> T:
        """Drives one operation, as ``AsyncEngine.run`` does (the same arguments; a failure
        says whether the operation may have written anything)."""
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
            return self._drive(run)
        except RedisFailure as e:
            raise run.failed(e)

    def _drive(self, run: core.Run[T]) -> T:
        reply: Any = None
        while (nxt := run.next(reply)) is not None:
            step, plan = nxt
            if plan.how is core.How.OPTIONAL:
                try:
                    reply = self._send(step, plan, run)
                except RedisFailure as e:
                    log.warning("%s step failed, going on without it: %s", core.describe(step), e)
                    reply = None
            elif plan.how is core.How.DURABLE:
                reply, replicas = self._send(step, plan, run)
                if plan.reconfirm and replicas < self.wait_replicas:
                    replicas = self._reconfirmed(step, plan, replicas, run)
                run.confirmed(replicas)
            else:
                reply = self._send(step, plan, run)
        return run.result

    # -- health ---------------------------------------------------------------------------------

    def ping(self) -> bool:
        return bool(self._translated(self.client.ping))

    def ensure_scripts(self) -> bool:
        """As ``AsyncEngine.ensure_scripts``: True once every script is cached on the server
        (on every master of a Cluster), the missing ones loaded first."""
        return self._translated(self._ensure_scripts)

    def _ensure_scripts(self) -> bool:
        scripts = list(self.scripts.values())
        present = self.client.script_exists(*(s.sha for s in scripts))
        for script, there in zip(scripts, present, strict=True):
            if not there:
                self.client.script_load(script.source)
        return True
