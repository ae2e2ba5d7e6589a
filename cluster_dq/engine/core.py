"""The pure core of the two executors (``aio.py``, ``sync.py``): what a Redis error means (the
one classification, and its translation into the error tree), which errors repeat a step,
how a repeat is stamped, when a write waits for its replicas and how the WAIT reply is read,
and what a stale master calls for. No I/O here: the executors only send what this decides."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import sys
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from redis.exceptions import (
    BusyLoadingError,
    ClusterError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import retry_if_exception_type

from cluster_dq.engine.steps import Call, Eval, Step
from cluster_dq.engine.retry import OPTIONAL_POLICY, until, within
from cluster_dq.engine.scripts import LuaScript, load_all
from cluster_dq.errors import (
    MovedDuringWait,
    NotReplicated,
    RedisFailure,
    Refused,
    ServerError,
    StaleMaster,
    Transient,
    Unsent,
)

T = TypeVar("T")
# The writes a client is told about: a job accepted, a job acked (a lost ack means a redelivery).
DURABLE_SCRIPTS = frozenset({"publish", "publish_keyed", "republish", "ack"})
# Scripts that write nothing (``flags=no-writes``): a step of only these repeats on any
# transient error, whatever its operation (a multi-queue consume's first look, for one).
READ_ONLY_SCRIPTS = frozenset(
    name for name, s in load_all().items() if s.source.startswith("#!lua flags=no-writes")
)
# Commands that write nothing: a step of only these repeats on any transient error, and its
# failure never says "may have been applied" (``Run.attempted``).
READ_COMMANDS = frozenset(
    {
        "EXISTS",
        "GET",
        "HEXISTS",
        "HGET",
        "HGETALL",
        "HKEYS",
        "HMGET",
        "HSCAN",
        "LRANGE",
        "PTTL",
        "SCARD",
        "SMEMBERS",
        "ZCARD",
        "ZCOUNT",
        "ZMSCORE",
        "ZRANGE",
        "ZSCAN",
        "ZSCORE",
    }
)
# What an attempt may raise that ``translate`` looks at (the last three only when redis-py's
# asyncio transport leaked a closed connection as them: ``leaked_transport_race``).
CAUGHT: tuple[type[BaseException], ...] = (
    RedisError,
    OSError,
    RedisClusterException,
    AttributeError,
    TypeError,
    RuntimeError,
)


class Kind(enum.Enum):
    REFUSED = "refused before running"  # nothing ran: repeat it always
    TRANSIENT = "transient"  # may have run: repeat it where repeating is safe
    PERMANENT = "permanent"  # an answer, not an outage: never repeated


# Replies by which the server refused a script before running it: a stale master
# (NOREPLICAS), a replica (READONLY: a script that may write is refused on one), a slot being
# migrated (TRYAGAIN), a dataset being loaded (LOADING).
_REFUSED_TYPES = (ReadOnlyError, TryAgainError, BusyLoadingError)
_REFUSED_REPLIES = ("NOREPLICAS",)
# The connection or the topology: reset, timeout, cluster down or re-slotting, socket errors.
_TRANSIENT_TYPES = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterError,
    RedisClusterException,
    OSError,
)
_TRANSIENT_REPLIES = ("WAIT cannot be used with replica",)


def classify(e: BaseException) -> Kind | None:
    """The one table: a Redis or OS error -> its kind; None for anything else (a bug)."""
    if isinstance(e, RedisFailure):  # translated already
        return (
            Kind.REFUSED
            if isinstance(e, Refused)
            else Kind.TRANSIENT
            if isinstance(e, Transient)
            else Kind.PERMANENT
        )
    text = str(e)
    if isinstance(e, _REFUSED_TYPES) or (
        isinstance(e, ResponseError) and text.startswith(_REFUSED_REPLIES)
    ):
        return Kind.REFUSED
    if isinstance(e, _TRANSIENT_TYPES) or leaked_transport_race(e):
        return Kind.TRANSIENT
    if isinstance(e, ResponseError) and text.startswith(_TRANSIENT_REPLIES):
        return Kind.TRANSIENT
    if isinstance(e, RedisError):
        return Kind.PERMANENT
    return None


def translate(e: BaseException, sent: bool = True) -> RedisFailure | None:
    """redis-py's (and the OS's) error -> the error tree; None when ``e`` is not one (a bug,
    which the executor re-raises as it is). The executors call this once, at their boundary.
    ``sent``: whether any of the attempt reached a connection (``Attempt``); a transient
    failure before that is ``Unsent``: nothing ran."""
    if isinstance(e, RedisFailure):
        return e
    kind = classify(e)
    if kind is None:
        return None
    text = f"{type(e).__name__}: {e}"
    if kind is Kind.TRANSIENT and not sent:
        return Unsent(f"nothing sent: {text}")
    if isinstance(e, ResponseError) and str(e).startswith("NOREPLICAS"):
        return StaleMaster(
            f"write refused, nothing written ({e}): the server lost its replicas, "
            "or is a master that a failover replaced"
        )
    if isinstance(e, ResponseError) and str(e).startswith("WAIT cannot be used with replica"):
        return MovedDuringWait(
            f"the queue's slot moved during the write ({e}); the write may "
            "have been applied on the new master, unconfirmed"
        )
    if kind is Kind.REFUSED:
        return Refused(text)
    if kind is Kind.TRANSIENT:
        if not isinstance(e, (RedisError, OSError, RedisClusterException)):  # a leaked race
            text = f"connection closed during a write ({text})"
        return Transient(text)
    return ServerError(text, str(e))


def forget_connections(e: RedisFailure) -> bool:
    """A stale master: the executor drops its idle connections, so the next one asks Sentinel
    where the master is (a Cluster client finds the slot's new owner through MOVED)."""
    return isinstance(e, StaleMaster)


def leaked_transport_race(e: BaseException) -> bool:
    """redis-py's asyncio connections can leak a connection closed under a write as
    AttributeError/TypeError (asyncio) or RuntimeError (uvloop: "handler is closed") instead of
    ConnectionError (redis/redis-py#3546, #4287; seen here when 16 pump shards start at once on
    a fresh Cluster client, and when a Cluster master is killed). Such an error is transient."""
    if not isinstance(e, (AttributeError, TypeError, RuntimeError)):
        return False
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(
            ("redis/asyncio/connection.py", "redis/asyncio/cluster.py")
        ):
            return True
        tb = tb.tb_next
    return False


class Attempt:
    """One attempt of a step: ``sent`` turns true when a connection is about to write any of
    it (the transport calls ``mark_sent``; connecting, and asking Sentinel where the master
    is, come before). Until then, a failure means nothing ran: the step is safe to repeat
    whatever it is. One context variable per attempt, so concurrent attempts (tasks) never
    see each other's, and a Cluster client's per-node tasks share their caller's."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


ATTEMPT: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "cluster_dq_attempt", default=None
)


def mark_sent() -> None:
    attempt = ATTEMPT.get()
    if attempt is not None:
        attempt.sent = True


def reserved_nothing(e: RedisFailure) -> bool:
    """The one rule for a consume that failed with ``e``: whether it can have reserved
    anything. Refused (the server refused it, or nothing was sent): no, so a long poll keeps
    waiting, as if no job were ready, until its deadline. Otherwise the reply was lost and
    jobs may have been reserved for it: it is not repeated, and answers "no job"; what it
    reserved comes back once the ttr ends (a try spent), as after a consumer crash."""
    return isinstance(e, Refused)


# -- how a step is sent --------------------------------------------------------------------


class How(enum.Enum):
    PLAIN = "plain"
    OPTIONAL = "optional"  # best effort: the operation goes on without it (reply None)
    DURABLE = "durable"  # the script, then WAIT on the same connection


@dataclass(frozen=True, slots=True)
class Plan:
    how: How
    retry_on: tuple[type[BaseException], ...]  # the errors that repeat it (empty: none)
    policy: dict[str, Any]  # tenacity's arguments for the repeats
    # A durable step that too few replicas confirmed is sent again, within the budget, until
    # they do; its first reply stands. Only an idempotent operation's (a repeat changes
    # nothing): what a Cluster shard needs after a failover, until its new master has a
    # replica again (the old master rejoining, resyncing).
    reconfirm: bool = False


class Unconfirmed(Exception):
    """A repeat of a durable step (``Plan.reconfirm``) that too few replicas confirmed yet."""


def reconfirm_policy(plan: Plan) -> dict[str, Any]:
    return _policy((Unconfirmed, *plan.retry_on), plan.policy)


def check_confirmed(replicas: int, wanted: int) -> None:
    if replicas < wanted:
        raise Unconfirmed(f"{replicas} of {wanted} replicas")


def _policy(retry_on: tuple[type[BaseException], ...], base: dict[str, Any]) -> dict[str, Any]:
    return {**base, "retry": retry_if_exception_type(retry_on)}


_IDEMPOTENT = (Transient,)
_NOT_IDEMPOTENT = (Refused,)
_UNSENT = (Unsent,)


def plan(
    step: Step,
    *,
    idempotent: bool,
    durable: bool,
    budget_s: float,
    deadline: float | None = None,
) -> Plan:
    """How to send ``step`` and which errors repeat it. An idempotent operation's steps repeat
    on any transient error (their arguments, job ids included, are fixed). Other steps repeat
    only when nothing ran: the server refused them, or nothing was sent (``Unsent``; any
    step, a script or not). A best-effort step gets a short budget: its operation succeeded
    and its caller is waiting; a signal lost there is repaired by the reconcile sweep.
    ``durable``: the executor has a replica count to wait for and the operation asked for it.
    ``deadline`` (monotonic s): the request's own (a long poll's end), which replaces the
    retry budget (``retry.until``); without one, a step repeats for ``budget_s`` at most
    (``RetryBudgetSecond``)."""
    if isinstance(step, Eval) and step.optional:
        return Plan(How.OPTIONAL, _IDEMPOTENT, _policy(_IDEMPOTENT, OPTIONAL_POLICY))
    if _reads_only(step):  # repeating a read is always safe
        idempotent = True
    errors: tuple[type[BaseException], ...]
    errors = _IDEMPOTENT if idempotent else _NOT_IDEMPOTENT if isinstance(step, Eval) else _UNSENT
    base = within(budget_s) if deadline is None else until(deadline)
    policy = _policy(errors, base)
    if durable and any(c.script in DURABLE_SCRIPTS for c in durable_calls(step)):
        # A repeat after a lost reply finds the jobs there and reports them as duplicates.
        return Plan(How.DURABLE, errors, policy, reconfirm=idempotent)
    return Plan(How.PLAIN, errors, policy)


def _reads_only(step: Step) -> bool:
    calls = step if isinstance(step, tuple) else (step,)
    return all(
        c.script in READ_ONLY_SCRIPTS if isinstance(c, Eval) else c.args[0] in READ_COMMANDS
        for c in calls
    )


def durable_calls(step: Step) -> list[Eval]:
    """The scripts of a step (one, or a pipeline's) that a durable write waits for."""
    calls = step if isinstance(step, tuple) else (step,)
    return [c for c in calls if isinstance(c, Eval) and c.script in DURABLE_SCRIPTS]


def describe(step: Step) -> str:
    if isinstance(step, Eval):
        return step.script
    if isinstance(step, tuple):
        return "pipeline(" + ",".join(describe(s) for s in step) + ")"
    return str(step.args[0])


def restamp(step: Step, now: int) -> Step:
    """A step about to be sent again, its clock arguments set to ``now`` (a deadline must count
    from when the step runs)."""
    if isinstance(step, tuple):
        return tuple(c.restamped(now) if isinstance(c, Eval) else c for c in step)
    return step.restamped(now) if isinstance(step, Eval) else step


def command(call: Call, scripts: Mapping[str, LuaScript], source: bool = False) -> tuple[Any, ...]:
    """The command that runs ``call``: a script by its sha, or (``source``) by its text, which
    caches it on the node that runs it: how a script a server lacks (a promoted replica, SCRIPT
    FLUSH) is sent again. (redis-py's own fallback loads it on every master of a Cluster, and
    fails while one of them is down.)"""
    if not isinstance(call, Eval):
        return call.args
    script = scripts[call.script]
    head = ("EVAL", script.source) if source else ("EVALSHA", script.sha)
    return (*head, len(call.keys), *call.keys, *call.args)


def queue_call(
    pipe: Any, call: Call, scripts: Mapping[str, LuaScript], source: bool = False
) -> None:
    """Adds one call to a pipeline (``command``)."""
    pipe.execute_command(*command(call, scripts, source))


# -- replies -------------------------------------------------------------------------------


def pipeline_reloads(results: list[Any]) -> list[int]:
    """The positions of a pipeline's replies whose script was not cached (after a failover or
    SCRIPT FLUSH): the executor sends those once more, loading the script. Any other error
    reply is raised."""
    for r in results:
        if isinstance(r, Exception) and not isinstance(r, NoScriptError):
            raise r
    return [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]


def durable_replies(results: list[Any], sent: int) -> tuple[list[Any], list[int], int]:
    """A durable pipeline's replies: ``sent`` calls, then one WAIT per node written to (the
    same connection: WAIT counts the replicas that have that connection's writes). Returns
    the calls' replies, the positions whose script was not cached (the executor loads it and
    sends those again, with a WAIT of their own), and the fewest replicas a WAIT counted."""
    replies, waits = results[:sent], results[sent:]
    for r in (*replies, *waits):
        if isinstance(r, Exception) and not isinstance(r, NoScriptError):
            raise r
    missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
    # (a round with no durable call sends no WAIT: it lowers nothing)
    return replies, missing, min((int(w) for w in waits), default=sys.maxsize)


class Run(Generic[T]):
    """One operation being driven: hands out its steps with their plans, takes their replies,
    and keeps the fewest replicas any durable write reached."""

    def __init__(
        self,
        op: Generator[Step, Any, T],
        *,
        idempotent: bool,
        durable: bool,
        wait_replicas: int,
        wait_timeout_ms: int,
        budget_s: float,
        deadline: float | None = None,
    ) -> None:
        self.op = op
        self.deadline = deadline
        self.budget_s = budget_s
        self.idempotent = idempotent
        self.durable = durable and wait_replicas > 0
        self.wanted, self.timeout_ms = wait_replicas, wait_timeout_ms
        self.acked = wait_replicas
        self.repeated = False  # a step was repeated: the operation's time is the send time
        # A step that may write was sent (it succeeded, or failed after being sent): a
        # failure of the operation may have been applied (``RedisFailure.nothing_written``).
        self.maybe_written = False
        self.result: T

    def attempted(self, step: Step, error: BaseException | None) -> None:
        """One attempt of ``step`` ended (``error``: how it failed, None: it succeeded)."""
        if not self.maybe_written and not _reads_only(step):
            self.maybe_written = not isinstance(error, Refused)

    def failed(self, e: RedisFailure) -> RedisFailure:
        """The operation ends with ``e``: what it may have written is said on it."""
        e.nothing_written = not self.maybe_written
        return e

    def stamped(self, step: Step, clock: Callable[[], int], *, repeat: bool = False) -> Step:
        """``step`` as it is sent now. A repeat (``repeat``) is stamped at send time, and so is
        every stamped step of the operation after it: the operation's later steps must not run
        at a time before the repeat's (a consume repeated after a refusal found a wheel bucket
        due to open; opening it at the first attempt's time would leave it shut)."""
        self.repeated = self.repeated or repeat
        return restamp(step, clock()) if self.repeated else step

    def next(self, reply: Any) -> tuple[Step, Plan] | None:
        """The next step and its plan, or None when the operation is done (``result``).
        Raises ``NotReplicated`` at the end when a durable write was not confirmed."""
        try:
            step = self.op.send(reply)
        except StopIteration as stop:
            if self.acked < self.wanted:
                raise NotReplicated(self.acked, self.wanted, self.timeout_ms, stop.value) from None
            self.result = stop.value
            return None
        return step, plan(
            step,
            idempotent=self.idempotent,
            durable=self.durable,
            deadline=self.deadline,
            budget_s=self.budget_s,
        )

    def confirmed(self, replicas: int) -> None:
        self.acked = min(self.acked, replicas)


# -- cancellations redis-py swallows ---------------------------------------------------------


def cancelling() -> bool:
    """Whether this task was asked to stop (a cancellation caught and not yet honoured): a
    loop that catches Redis failures asks it, because redis-py can turn a cancellation into a
    connection error."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def end_if_cancelled() -> None:
    """At the top of a loop that runs until cancelled (pump, firer, watchers, notice reader):
    a cancellation swallowed below it (redis-py can absorb one in a command and return
    normally) still ends the loop. Without it the task, marked as cancelling, went on pumping
    and sleeping for good (1 in 10 kills of a pump under load)."""
    if cancelling():
        raise asyncio.CancelledError()
