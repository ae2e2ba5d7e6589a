"""Publishes a few orders for examples/worker.py: some due now, some later, one flaky, one
malformed, and one with a fixed job id (publishing it again creates nothing new).

    export CLUSTER_DQ_URL=http://127.0.0.1:7777 CLUSTER_DQ_TOKEN=<token> CLUSTER_DQ_NAMESPACE=demo
    python examples/producer.py [QUEUE]          # QUEUE: orders by default
"""

from __future__ import annotations

import json
import sys

from cluster_dq.client import Client


def main() -> None:
    queue = sys.argv[1] if len(sys.argv) > 1 else "orders"
    with Client() as dq:  # CLUSTER_DQ_URL, CLUSTER_DQ_TOKEN, CLUSTER_DQ_NAMESPACE
        for order in (1, 2, 3):
            jid = dq.publish(queue, json.dumps({"order": order}), tries=3)
            print(f"order {order}: {jid} (due now)")
        jid = dq.publish(queue, json.dumps({"order": 4}), delay=2.0, tries=3)
        print(f"order 4: {jid} (due in 2 s)")
        jid = dq.publish(queue, json.dumps({"order": 5, "flaky": True}), tries=3)
        print(f"order 5: {jid} (fails its first try)")
        jid = dq.publish(queue, b"\x00 not json", tries=3)
        print(f"malformed: {jid} (will be buried)")
        # A client-chosen id makes the publish idempotent: a retry after a lost reply, or a
        # second run of this script, does not make a second job.
        for _ in range(2):
            jid = dq.publish(
                queue,
                json.dumps({"order": 42, "close": True}),
                delay=1.0,
                job_id="close-order-42",
                tries=3,
            )
        print(f"order 42: {jid} (due in 1 s; published twice, one job)")


if __name__ == "__main__":
    main()
