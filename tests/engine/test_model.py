"""A model-based test of the engine with injected faults (issue 13, SPEC §2.7).

A Hypothesis ``RuleBasedStateMachine`` drives the real service layer in-process
(``Service`` over a ``RedisPool`` on a real redis-server, no pump: pump steps are rules) and
compares every answer, size and job state with the reference model of tests/support/model_ref.py.
Time moves only when a rule says so (a fake clock). Faults are rules too: the next step of the
next request loses its reply after running, fails before sending, is refused (NOREPLICAS,
TRYAGAIN, READONLY, LOADING) or stalls; the model then checks what the retry policy promises.

Operations: publish, bulk, consume, ack (batch, leases), republish, touch, release (with an
error text), bury, kick, reschedule by id, peek, pump steps, destroy, respawn / delete of dead
letters, the dead-letter listing by cursor, filtered redrive and purge, pause / resume and
max_size, retry backoff without jitter (a job's own, a queue's) (issue 17), `wheel widen`;
publishes under a dedup key in each mode, the modes mixed under one key (`simple`: one live job
per key; `debounce`: a waiting holder replaced, a reserved or dead one refused; `throttle`: for
`dedup_ttl` ms the first job's id, whatever became of it, the window's end crossed by the fake
clock; a simple or debounce key's live job holding it before a throttle window), with client
ids now and then; publishes and bulks with an Idempotency-Key (sent again as they were: the
first answer, even after its jobs were acked; another request under the key: refused; past the
key's window, done afresh; a refusal keeps nothing), with a dedup key or not, a lost reply's
repeat answered as the first (but for the open defect idem-repeat-replayed)
(tests/support/model_keyed.py); groups: every publish (single,
bulk, dedup, republish) in a group or none, a group's settings changed (pause / resume, a
concurrency limit of 1, 2 or none, a rate or none), with their fair tags, holding back and
bringing back, rate turns and wake-ups (tests/support/model_ref.py). Not modelled yet: backoff
jitter, progress, results on ack.

After every step: each job's state, tries, deliveries, ttl end, score (peek_job), group, whether
its group holds it back (HELD, and peek_job's missing score), death reason and last error are
one of the outcomes the model allows; every ready job's READY score (a grouped job's fair tag,
which peek_job does not give) is exact; the sizes, and every group's (describe_groups: size,
reserved, held, settings), are exact; the groups' last tags, rates and wake-ups are as the
model has them; each queue's KEYED (every throttle window and Idempotency-Key answer: its end,
job ids, fingerprint, outcome), KEYED_DUE and their expiry are exact; and
cluster_dq/testing/invariants.py::check_queue holds. At the end everything is deleted and
nothing but the expiring acked-ids memory (and, for a queue whose jobs were acked, its expiring
KEYED) may remain.

Three machines share the examples, every rule in each: ``EngineModel`` (three fifths, here),
``GroupsModel`` (a fifth, tests/engine/test_model_groups.py), the groups' rules weighted up
(grouped jobs ready at once, consumes of several, acks, group settings), so that groups hold
jobs back and bring them back within 40 steps; and ``KeyedModel`` (a fifth,
tests/engine/test_model_keyed.py), the keyed publishes weighted up, faults aimed at their script
and the clock moved to their windows' ends. (Before the keyed publishes, ``EngineModel`` had
four fifths: the same 150 examples at the ``ci`` size, a fifth of them in the quick tier, five
times as many in the long run.)

Where it lives: the harness (sizes, topologies, fake clock, faults, transport, strategies) in
tests/support/model_harness.py; the machine without its rules (requests, outcomes, time and
faults, the observation after every step) in tests/support/model_machine.py; its rules in
mixins by concept (tests/support/model_publish.py, model_publish_keyed.py, model_delivery.py,
model_control.py), composed as ``EngineModel`` in tests/support/model_rules.py; the reference
model in tests/support/model_ref.py (its groups in model_groups.py, its keyed publishes in
model_keyed.py, its records in model_job.py).

The default run: bounded, standalone, ~60 s; the long run: 5x the examples, standalone and
a Cluster. Longer still (e.g. 30 min, both topologies; ``DQ_MODEL_EXAMPLES`` is shared by the
three machines as above)::

    DQ_MODEL_EXAMPLES=3000 DQ_MODEL_STEPS=80 DQ_MODEL_TOPOLOGY=standalone \
        .venv/bin/python -m pytest tests/engine/test_model*.py -k the_model -x -q -s
    DQ_MODEL_EXAMPLES=1500 DQ_MODEL_STEPS=80 DQ_MODEL_TOPOLOGY=cluster \
        .venv/bin/python -m pytest tests/engine/test_model*.py -k the_model -x -q -s

A failure prints the shrunk sequence of rules (Hypothesis's reproduction) and the model's notes.
``DQ_MODEL_SHRINK=0`` skips shrinking (a deliberately broken script, to see the test fail,
is reported in seconds instead of minutes).
``DQ_MODEL_TOLERATE`` (comma-separated) lists known engine defects the model tolerates until
their fix lands (TOLERATE in tests/support/model_harness.py); by default those still open
(OPEN_DEFECTS, each shown by a test of its own); ``DQ_MODEL_TOLERATE=`` tolerates none.
"""

from __future__ import annotations

from typing import Any

from hypothesis.stateful import run_state_machine_as_test

from tests.support.model_harness import EXAMPLES, STATS, machine_settings
from tests.support.model_ref import EVENTS
from tests.support.model_rules import EngineModel


def test_engine_matches_the_model(deployment_for_model: Any) -> None:
    EngineModel.deployment = deployment_for_model
    STATS.clear()
    EVENTS.clear()
    # the examples shared: every rule in all of them, the groups' weighted up in a fifth
    # (tests/engine/test_model_groups.py), the keyed publishes' in another
    # (tests/engine/test_model_keyed.py)
    n = EXAMPLES - 2 * max(2, EXAMPLES // 5)
    run_state_machine_as_test(EngineModel, settings=machine_settings(max(2, n)))
