"""Recurring jobs: a daily report at 08:00 Paris time (cron with a time zone) and a heartbeat
every 2 s. Takes two heartbeats as they come, then deletes the heartbeat schedule (the daily
report stays). Each occurrence's job id names its schedule and time: never published twice.

    export CLUSTER_DQ_URL=http://127.0.0.1:7777 CLUSTER_DQ_TOKEN=<token> CLUSTER_DQ_NAMESPACE=demo
    python examples/recurring.py [QUEUE]         # QUEUE: reports by default
"""

from __future__ import annotations

import datetime as dt
import sys

from cluster_dq.client import Client


def when(t: float | None) -> str:
    return "-" if t is None else dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds")


def main() -> None:
    queue = sys.argv[1] if len(sys.argv) > 1 else "reports"
    with Client() as dq:  # CLUSTER_DQ_URL, CLUSTER_DQ_TOKEN, CLUSTER_DQ_NAMESPACE
        daily = dq.put_schedule(
            queue, "daily-report", cron="0 8 * * *", tz="Europe/Paris", body='{"report": "daily"}'
        )
        print(f"daily-report: cron {daily.cron} ({daily.tz}), next at {when(daily.next_at)}")
        beat = dq.put_schedule(queue, "heartbeat", every=2.0, body="ping", ttl=60)
        print(f"heartbeat: every {beat.every} s, next at {when(beat.next_at)}")
        taken = 0
        while taken < 2:
            job = dq.consume(queue, ttr=30, timeout=10)
            if job is None:
                sys.exit("no heartbeat within 10 s: is the service's pump running?")
            print(f"got {job.id}: {job.text}", flush=True)
            dq.ack(queue, job.id, lease=job.lease)
            taken += 1
        dq.delete_schedule(queue, "heartbeat")
        print(
            "heartbeat deleted; daily-report stays:",
            dq.get_schedule(queue, "daily-report") is not None,
        )


if __name__ == "__main__":
    main()
