"""The engine's steps and its configuration: what an operation yields (``Eval``, one Lua script;
``Cmd``, one plain command; a tuple of them, one pipeline) and the helpers every operation
builds its steps with. Operations are generators that yield steps and receive their replies;
the async and sync executors (aio.py, sync.py) drive them, which is how the service, the
Python client and the Spark pipeline share one engine (``commands.py`` lists them all).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import random

from cluster_dq.engine import replies
from cluster_dq.engine.replies import ReplyCode
from cluster_dq.engine.retry import BUDGET_S
from cluster_dq.engine.replies import Sizes as Sizes  # re-exported: the service and metrics use it
from cluster_dq.engine.signatures import SIGNATURES
from cluster_dq.errors import Conflict
from cluster_dq.keys import QueueKeys, ShardKeys, bucket_name, shard_of
from cluster_dq.models import MAX_BULK, id_due_ms, id_lane, id_to_member, is_wheel_member


if TYPE_CHECKING:
    from cluster_dq.settings import Settings

Arg = str | bytes | int


@dataclass(frozen=True, slots=True)
class Eval:
    script: str
    keys: Sequence[str]
    args: Sequence[Arg]
    # ARGV[1] is the caller's clock: a repeat of the step (the retry policy) is stamped afresh,
    # so that deadlines the script computes (a reservation's ttr) count from when it runs.
    stamped: bool = False
    # Best effort: the operation does not fail with this step (a shard signal, which the
    # reconcile sweep repairs when it is lost); the executor then sends back None.
    optional: bool = False

    def restamped(self, now: int) -> Eval:
        if not self.stamped:
            return self
        return Eval(self.script, self.keys, [now, *self.args[1:]], True, self.optional)


@dataclass(frozen=True, slots=True)
class Cmd:
    args: tuple[Arg, ...]


Call = Eval | Cmd
Step = Call | tuple[Call, ...]
T = TypeVar("T")
Op = Generator[Step, Any, T]


def lua(
    script: str, keys: dict[str, Any], *, stamped: bool = False, optional: bool = False, **argv: Any
) -> Eval:
    """One script call, its KEYS and ARGV named as in the script's header (signatures.py)."""
    sig = SIGNATURES[script]
    return Eval(script, sig.key_list(keys), sig.args(argv), stamped, optional)


class MoveSink(Protocol):
    """Told of the jobs that scripts moved on their own (due time, ttr and ttl passing), so
    the metrics can count what no request asked for."""

    def moved(
        self, ns: str, q: str, promoted: int, retried: int, dead: int, expired: int
    ) -> None: ...


REMEMBER_ACKED_MS = 60_000
KEEP_RESULT_MS = 3_600_000  # ResultSecond's default
IDEMPOTENCY_MS = 86_400_000  # IdempotencyKeySecond's default
FIRST_EXTRA_KEY = len(QueueKeys("n", "q").all_fixed()) + 1  # KEYS index of a script's own keys


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Tunables of the storage layout and the pump (lua/README.md explains each). Frozen: one
    config per deployment, built from its settings by ``from_settings`` wherever jobs are
    written (service, pump, CLI, Spark), so every writer agrees on the shard of a queue."""

    lane_capacity: int = 512  # <= hash-max-listpack-entries (pools.check_redis; benchmarks.md)
    open_lead_ms: int = 5_000  # open a wheel bucket this long before it starts
    open_backlog: int = 20_000  # stop opening buckets while this many jobs wait in ready
    open_buckets_per_call: int = 4
    open_calls_per_tick: int = 8
    promote_limit: int = 1_000  # jobs moved per script call (keeps every script ~1 ms)
    shards: int = 16
    remember_acked_ms: int = (
        REMEMBER_ACKED_MS  # a publish of an id acked this recently is a duplicate
    )
    keep_result_ms: int = KEEP_RESULT_MS  # how long a job's result outlives its ack
    idempotency_ms: int = IDEMPOTENCY_MS  # how long a publish's answer is kept under its key
    retry_budget_s: float = BUDGET_S  # how long a failed step safe to repeat is repeated
    moves: MoveSink | None = None  # where consume and tick report the jobs they moved
    lane_hints: dict[tuple[str, int], int] = field(default_factory=dict)
    # the jitter draw of retry backoffs, one per script call (tests fix it)
    draw: Callable[[], float] = field(default_factory=lambda: random.random)

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineConfig:
        """The deployment's settings that change where and how jobs are stored: a queue's shard
        (``Shards``), the memory of acked ids (``AckedIdMemorySecond``) and of results
        (``ResultSecond``), of Idempotency-Keys (``IdempotencyKeySecond``), and how long a failed step is repeated (``RetryBudgetSecond``)."""
        return cls(
            shards=settings.Shards,
            remember_acked_ms=settings.AckedIdMemorySecond * 1000,
            keep_result_ms=settings.ResultSecond * 1000,
            idempotency_ms=settings.IdempotencyKeySecond * 1000,
            retry_budget_s=settings.RetryBudgetSecond,
        )

    def hint(self, tag: str, start: int) -> int:
        return self.lane_hints.get((tag, start), 0)

    def learn(self, tag: str, start: int, lane: int, fill: int) -> None:
        if fill + MAX_BULK > self.lane_capacity and self.hint(tag, start) <= lane:
            if len(self.lane_hints) > 100_000:
                self.lane_hints.clear()
            self.lane_hints[(tag, start)] = lane + 1


def fixed_keys(qk: QueueKeys) -> list[str]:
    return qk.all_fixed()


def signal(qk: QueueKeys, cfg: EngineConfig, at_ms: int | None) -> Eval:
    """Tells the queue's shard that the pump must look at it by ``at_ms`` (and registers it).
    Sent only after a queue script reported that it lowered the queue's next event."""
    sk = ShardKeys(shard_of(qk.qualified, cfg.shards))
    keys = {"schedule": sk.schedule, "pending": sk.pending, "queues": sk.queues}
    return lua("signal", keys, optional=True, queue=qk.qualified, at=-1 if at_ms is None else at_ms)


def keep_listed(qk: QueueKeys, cfg: EngineConfig) -> Op[None]:
    """After a change of the queue's or its groups' settings: the queue in its shard's
    ``configured`` set while it has any, out of it once it has none. Best effort, as a
    signal: the change is made and answered even when the shard's node cannot be reached.
    Not atomic with the change (another slot): two changes at once, one setting and one
    clearing the last setting, may leave a queue listed without settings (it lists as
    empty), or settings unlisted, until the queue's next change."""
    has = yield Cmd(("EXISTS", qk.conf, qk.group_conf))
    keys = {"configured": ShardKeys(shard_of(qk.qualified, cfg.shards)).configured}
    yield lua("listed", keys, optional=True, queue=qk.qualified, has=int(bool(int(has))))


def bucket_of(member: bytes) -> str | None:
    if is_wheel_member(member):
        return bucket_name(id_due_ms(member), id_lane(member))
    return None


def job_id_args(qk: QueueKeys, ids: Sequence[str], first_key: int) -> tuple[list[str], list[Arg]]:
    buckets: dict[str, int] = {}
    args: list[Arg] = []
    for text in ids:
        member = id_to_member(text)
        bname = bucket_of(member)
        kidx = buckets.setdefault(bname, first_key + len(buckets)) if bname else 0
        args += [member, kidx, bname or ""]
    return [qk.bucket(b) for b in buckets], args


def lease_arg(lease: str | None) -> bytes:
    """A lease as the scripts compare it ('' = none). Not hex, or the wrong length: it cannot
    hold any job, which the script reports as a conflict."""
    if lease is None:
        return b""
    try:
        return bytes.fromhex(lease) if len(lease) == 16 else b"\xff"
    except ValueError:
        return b"\xff"


def raise_conflicts(ids: Sequence[str], verdicts: Sequence[ReplyCode]) -> None:
    conflicts = replies.conflicts(ids, verdicts)
    if conflicts:
        raise Conflict(conflicts)
