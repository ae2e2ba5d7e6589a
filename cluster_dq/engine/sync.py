"""Sync executor (batch tools, Spark partitions): the same operations on a redis client."""

from __future__ import annotations

from typing import Any, TypeVar

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError
from tenacity import Retrying

from cluster_dq.clock import now_ms
from cluster_dq.engine.aio import restamp
from cluster_dq.engine.commands import Call, EngineConfig, Eval, Op, Step
from cluster_dq.engine.retry import POLICY, TRANSIENT
from cluster_dq.engine.scripts import load_all

T = TypeVar("T")
SyncClient = Redis | RedisCluster


class SyncEngine:
    def __init__(self, client: SyncClient, config: EngineConfig | None = None) -> None:
        self.client = client
        self.config = config or EngineConfig()
        self.scripts = {n: client.register_script(s.source) for n, s in load_all().items()}

    def _call(self, call: Call) -> Any:
        if isinstance(call, Eval):
            return self.scripts[call.script](keys=list(call.keys), args=list(call.args))
        return self.client.execute_command(*call.args)  # type: ignore[no-untyped-call]

    def _pipeline(self, calls: tuple[Call, ...]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for c in calls:
            if isinstance(c, Eval):
                sha = self.scripts[c.script].sha
                pipe.execute_command("EVALSHA", sha, len(c.keys), *c.keys, *c.args)
            else:
                pipe.execute_command(*c.args)
        results: list[Any] = pipe.execute(raise_on_error=False)
        for i, r in enumerate(results):
            if isinstance(r, NoScriptError):  # after a failover or SCRIPT FLUSH
                results[i] = self._call(calls[i])
            elif isinstance(r, Exception):
                raise r
        return results

    def _step(self, step: Step) -> Any:
        if isinstance(step, tuple):
            return self._pipeline(step)
        return self._call(step)

    def _retrying(self, step: Step) -> Any:
        try:  # the fast path: no retry machinery unless something failed
            return self._step(step)
        except TRANSIENT:
            pass
        for attempt in Retrying(**POLICY):  # type: ignore[arg-type]
            with attempt:
                return self._step(restamp(step, now_ms()))
        raise AssertionError("unreachable")

    def run(self, op: Op[T], *, idempotent: bool = False) -> T:
        """Drives one operation. For idempotent ones each step is retried on transient errors
        (a step's arguments, job ids included, are fixed, so a repeat cannot duplicate)."""
        send = self._retrying if idempotent else self._step
        reply: Any = None
        while True:
            try:
                step = op.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(step, Eval) and step.optional:
                try:  # best effort (a shard signal; the reconcile sweep repairs a lost one)
                    reply = self._retrying(step)
                except (RedisError, OSError):
                    reply = None
            else:
                reply = send(step)

    def ping(self) -> bool:
        return bool(self.client.ping())
