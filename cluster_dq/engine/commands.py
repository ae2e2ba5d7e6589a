"""The engine's operations in one namespace (``from cluster_dq.engine import commands as ops``),
written one module per concept:

- ``steps.py``: steps and config;
- ``publish.py``: publishing; ``keyed.py``: publishing under a dedup key or an
  Idempotency-Key;
- ``delivery.py``: delivery;
- ``lookups.py``: lookups;
- ``queues.py``: queue-wide operations;
- ``shard.py``: the pump and the shards;
- ``admin.py``: the admin keys (tokens, limits, the audit log) and the token throttle;
- ``control.py``: per-job control and dead letters; ``schedules.py``: recurring jobs;
  ``insight.py``: the dashboard's reads; ``workers.py``: who is running what (these five
  are imported by their own names, not listed below).

Each operation is a generator that yields *steps* and receives their replies (steps.py); the
async and sync executors (aio.py, sync.py) drive the same generators, which is how the
service, the Python client and the Spark pipeline share one engine.
"""

from cluster_dq.engine.replies import Sizes
from cluster_dq.engine.steps import (
    Eval,
    Cmd,
    Call,
    Step,
    Op,
    MoveSink,
    REMEMBER_ACKED_MS,
    KEEP_RESULT_MS,
    FIRST_EXTRA_KEY,
    EngineConfig,
)
from cluster_dq.engine.publish import (
    Published,
    LOOK,
    INTO,
    INTO_NEW,
    SHORT,
    packed_job,
    publish,
    publish_many,
    BulkJob,
    publish_bulk,
)
from cluster_dq.engine.keyed import KeyedPublished, KeyedRequest, publish_keyed, publish_keyed_many
from cluster_dq.models import Dedup, Idempotency
from cluster_dq.engine.delivery import (
    MAX_CONSUME,
    CONSUME_CALLS_PER_QUEUE,
    consume,
    ack,
    known_ids,
    republish,
    progress,
    release,
    touch,
)
from cluster_dq.engine.lookups import (
    ById,
    by_id,
    READY_SCORE_MASK,
    peek_job,
    lookup_job,
    peek,
    dump_page,
    dump_wheel,
    heads,
    sizes,
)
from cluster_dq.engine.queues import (
    destroy,
    respawn,
    delete_dead,
    queue_settings,
    queue_known,
    configure,
    QueueOverview,
    queues_of_namespace,
    overview,
)
from cluster_dq.engine.shard import (
    tick,
    claim,
    reschedule,
    next_schedule,
    RECONCILE_GRACE_MS,
    reconcile,
    queues_of_shard,
    sizes_of,
    lead,
)
from cluster_dq.engine.admin import rate_limit
from cluster_dq.engine.groups import (
    Group,
    GroupChanges,
    Rate,
    check_group,
    configure_group,
    describe as describe_groups,
    list_groups,
)

__all__ = [
    "Sizes",
    "Eval",
    "Cmd",
    "Call",
    "Step",
    "Op",
    "MoveSink",
    "REMEMBER_ACKED_MS",
    "KEEP_RESULT_MS",
    "FIRST_EXTRA_KEY",
    "EngineConfig",
    "Published",
    "LOOK",
    "INTO",
    "INTO_NEW",
    "SHORT",
    "packed_job",
    "publish",
    "publish_many",
    "BulkJob",
    "publish_bulk",
    "Dedup",
    "Idempotency",
    "KeyedPublished",
    "publish_keyed",
    "KeyedRequest",
    "publish_keyed_many",
    "MAX_CONSUME",
    "CONSUME_CALLS_PER_QUEUE",
    "consume",
    "ack",
    "known_ids",
    "republish",
    "progress",
    "release",
    "touch",
    "ById",
    "by_id",
    "READY_SCORE_MASK",
    "peek_job",
    "lookup_job",
    "peek",
    "dump_page",
    "dump_wheel",
    "heads",
    "sizes",
    "destroy",
    "respawn",
    "delete_dead",
    "queue_settings",
    "queue_known",
    "configure",
    "QueueOverview",
    "queues_of_namespace",
    "overview",
    "tick",
    "claim",
    "reschedule",
    "next_schedule",
    "RECONCILE_GRACE_MS",
    "reconcile",
    "queues_of_shard",
    "sizes_of",
    "lead",
    "rate_limit",
    "Group",
    "GroupChanges",
    "Rate",
    "check_group",
    "configure_group",
    "describe_groups",
    "list_groups",
]
