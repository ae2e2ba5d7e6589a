"""Every Redis key name, and the hash-tag rule, in one place.

All keys of a queue carry the tag ``{ns/q}`` so that every script runs on one Cluster slot.
Names are ``^[-_A-Za-z0-9]+$``, so nothing but the tag contains ``{``. Shard keys use the tag
``{shard-N}``, which can never equal a queue tag (those always contain ``/``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

PREFIX = "dq"
BUCKET_WIDTH_MS = 10_000  # one wheel bucket spans 10 s of due times (lua/README.md)


def bucket_name(due_ms: int, lane: int) -> str:
    return window_bucket_name(due_ms // BUCKET_WIDTH_MS, lane)


def window_bucket_name(window: int, lane: int) -> str:
    """The name of the bucket of 10-s window ``window`` (due ms // BUCKET_WIDTH_MS), lane
    ``lane``: its key's suffix after ``w:`` and its member of the queue's WHEEL."""
    return f"{window}:{lane}"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    namespace: str
    queue: str

    @property
    def tag(self) -> str:
        return f"{{{self.namespace}/{self.queue}}}"

    @property
    def qualified(self) -> str:
        """``ns/q``: the registry member, the hash-ring key and the shard input."""
        return f"{self.namespace}/{self.queue}"

    def _k(self, suffix: str) -> str:
        return f"{PREFIX}:{self.tag}:{suffix}"

    @property
    def meta(self) -> str:
        return self._k("meta")

    @property
    def wheel(self) -> str:
        return self._k("wheel")

    @property
    def delayed(self) -> str:
        return self._k("delayed")

    @property
    def ready(self) -> str:
        return self._k("ready")

    @property
    def reserved(self) -> str:
        return self._k("reserved")

    @property
    def dead(self) -> str:
        return self._k("dead")

    @property
    def jobs(self) -> str:
        return self._k("jobs")

    @property
    def expire(self) -> str:
        return self._k("expire")

    @property
    def acked(self) -> str:
        return self._k("acked")

    @property
    def leases(self) -> str:
        return self._k("leases")

    @property
    def conf(self) -> str:
        """HASH of the queue's own settings (paused flag, defaults); survives a destroy."""
        return self._k("conf")

    @property
    def notes(self) -> str:
        """HASH id -> what a job carries beside its record (errors, death, progress, backoff)."""
        return self._k("notes")

    @property
    def results(self) -> str:
        """HASH id -> result of a job acked with one (done ms, kept-until ms, the result's JSON),
        kept ``ResultSecond`` after the ack; not a fixed key: only the scripts that use it get it."""
        return self._k("results")

    @property
    def results_due(self) -> str:
        """ZSET id -> kept-until ms of each result in ``results`` (trimmed a bounded number
        per ack with a result)."""
        return self._k("results_due")

    @property
    def keyed(self) -> str:
        """HASH ``t:<dedup key>`` -> a throttle window, ``i:<idempotency key>`` -> a request's
        answer (lua/publish_keyed.lua), each kept until its time; not a fixed key: only
        publish_keyed and destroy get it."""
        return self._k("keyed")

    @property
    def keyed_due(self) -> str:
        """ZSET the fields of ``keyed`` -> until when each is kept (trimmed a bounded number per
        keyed publish); both keys expire after the last."""
        return self._k("keyed_due")

    @property
    def schedules(self) -> str:
        """HASH of the queue's recurring jobs: ``d:<name>`` definition, ``s:<name>`` state."""
        return self._k("schedules")

    @property
    def notify(self) -> str:
        """Pub/sub channel announcing that the ready set went from empty to non-empty."""
        return self._k("notify")

    @property
    def groups(self) -> str:
        """HASH of the queue's groups while they hold jobs: ``n:<g>`` jobs (every state, the
        wheel included), ``r:<g>`` reserved, ``t:<g>`` the group's last fair tag in READY
        (lua/lib/groups.lua); a group's fields leave with its last job."""
        return self._k("groups")

    @property
    def held(self) -> str:
        """ZSET (every score 0) ``<g>\\0<id>``: ready jobs held back because their group is paused
        or at its concurrency limit; in group, then id order."""
        return self._k("held")

    @property
    def group_conf(self) -> str:
        """HASH of the queue's per-group settings: ``p:<g>`` paused, ``c:<g>`` concurrency
        limit, ``q:<g>`` rate limit (``<n> <per ms>``) and ``a:<g>`` its theoretical arrival
        time; a destroy keeps them, as it keeps ``conf``."""
        return self._k("gconf")

    @property
    def group_wake(self) -> str:
        """ZSET group -> when its rate lets its next held job go (lua/lib/promote.lua wakes it),
        while it holds jobs back for its rate."""
        return self._k("gwake")

    def bucket(self, name: str) -> str:
        return self._k(f"w:{name}")

    def history(self, bucket: int) -> str:
        """HASH of what happened in the queue during one 5-min bucket (``cluster_dq/history.py``:
        counts and a lateness histogram, one field each), expiring 24 h after the bucket
        began; written by every instance, read by the dashboard. Not a fixed key: no script
        touches it, and it outlives a destroy (it is what happened)."""
        return self._k(f"h:{bucket}")

    def all_fixed(self) -> list[str]:
        return [
            self.meta,
            self.wheel,
            self.delayed,
            self.ready,
            self.reserved,
            self.dead,
            self.jobs,
            self.expire,
            self.acked,
            self.leases,
            self.conf,
            self.notes,
            self.groups,
            self.held,
            self.group_conf,
            self.group_wake,
        ]


def shard_of(qualified: str, shards: int) -> int:
    return zlib.crc32(qualified.encode()) % shards


@dataclass(frozen=True, slots=True)
class ShardKeys:
    index: int

    def _k(self, suffix: str) -> str:
        return f"{PREFIX}:{{shard-{self.index}}}:{suffix}"

    @property
    def queues(self) -> str:
        """SET of ``ns/q`` living in this shard (the queue registry)."""
        return self._k("queues")

    @property
    def configured(self) -> str:
        """SET of ``ns/q`` in this shard that have queue or group settings: listed with the
        queues that hold jobs, the ones that never held one included."""
        return self._k("configured")

    @property
    def schedule(self) -> str:
        """ZSET ``ns/q`` -> the next time (ms) the pump has work in that queue."""
        return self._k("schedule")

    @property
    def pending(self) -> str:
        """HASH ``ns/q`` -> earliest event signalled since the pump claimed the queue."""
        return self._k("pending")

    @property
    def timers(self) -> str:
        """ZSET ``ns/q/name`` -> when a firer looks at that schedule next (recurring jobs)."""
        return self._k("timers")

    @property
    def lock(self) -> str:
        """The pump leader lock (SET NX PX, value = owner token)."""
        return self._k("leader")

    @property
    def epoch(self) -> str:
        """Counter: +1 per new leadership; the fencing token of the shard's pump steps."""
        return self._k("epoch")


def parse_qualified(qualified: str) -> tuple[str, str]:
    ns, _, q = qualified.partition("/")
    return ns, q


META_PATTERN = f"{PREFIX}:{{*}}:meta"  # SCAN MATCH for every queue's META (no other key ends so)


def queue_of_key(key: str | bytes) -> QueueKeys:
    """``dq:{ns/q}:...`` -> the queue's keys."""
    text = key.decode() if isinstance(key, bytes) else key
    return QueueKeys(*parse_qualified(text[text.index("{") + 1 : text.index("}")]))


@dataclass(frozen=True, slots=True)
class WorkerKeys:
    """Who is running what in a namespace (``cluster_dq/workers.py``): the tag of the reserved
    queue name ``_workers`` (no queue may start with ``_``), so both keys share one slot."""

    namespace: str

    def _k(self, suffix: str) -> str:
        return f"{PREFIX}:{{{self.namespace}/_workers}}:{suffix}"

    @property
    def seen(self) -> str:
        """ZSET: worker id -> when its announcement runs out (ms)."""
        return self._k("seen")

    def entry(self, worker_id: str) -> str:
        """STRING: the worker's announcement (JSON), expiring with it."""
        return self._k(f"w:{worker_id}")


class AdminKeys:
    """Tokens and rate limits, kept in the ``default`` pool under the tag ``{admin}``."""

    TAG = "{admin}"

    @staticmethod
    def tokens(pool: str, ns: str) -> str:
        return f"{PREFIX}:{AdminKeys.TAG}:tokens:{pool}:{ns}"

    @staticmethod
    def limits() -> str:
        return f"{PREFIX}:{AdminKeys.TAG}:limits"

    @staticmethod
    def counter(pool: str, ns: str, token: str, kind: str) -> str:
        return f"{PREFIX}:{AdminKeys.TAG}:rl:{pool}/{ns}/{token}:{kind}"

    @staticmethod
    def audit() -> str:
        """The dashboard's audit log of its pool: a capped list, newest first."""
        return f"{PREFIX}:{AdminKeys.TAG}:audit"
