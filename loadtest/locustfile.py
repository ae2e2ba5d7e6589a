"""The locust users of the load profile (run by ``loadtest/load_profile.py``, or by hand):

    locust -f loadtest/locustfile.py --host http://127.0.0.1:PORT --dq-token TOKEN \
        --dq-publish-rate 500 --dq-consumers 20

- ``Producer``: publishes jobs due 0-``--dq-max-delay-ms`` later over ``--dq-queues`` queues,
  the producers together at ``--dq-publish-rate`` jobs/s (one job per request). The body
  carries the job's due time.
- ``Consumer``: long-polls all the queues (``timeout`` 1 s) and acks every job it gets. The
  delivery's lateness (now - due, from the body) is reported to locust as the pseudo-request
  ``LATENESS deliver`` (and ``LATENESS deliver qN`` per queue), so locust's own percentiles
  and CSV files carry it.

With as many consumers as needed to keep up, the request mix is about one publish, one
consume and one ack per job: 500 jobs/s make ~1,500 requests/s.
"""

from __future__ import annotations

import base64
import json
import random
import time
from typing import Any

from locust import FastHttpUser, constant_throughput, events, task

NS = "load"


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--dq-token", default="", help="namespace token of the load namespace")
    parser.add_argument("--dq-queues", type=int, default=8)
    parser.add_argument(
        "--dq-publish-rate", type=float, default=500.0, help="jobs/s over all producers"
    )
    parser.add_argument("--dq-producers", type=int, default=25)
    parser.add_argument("--dq-consumers", type=int, default=20)
    parser.add_argument("--dq-max-delay-ms", type=int, default=2_000)


@events.init.add_listener
def _configure(environment: Any, **_: Any) -> None:
    o = environment.parsed_options
    if o is None:  # imported by a tool, not run by locust
        return
    Producer.fixed_count = o.dq_producers
    Consumer.fixed_count = o.dq_consumers
    rate = o.dq_publish_rate / max(o.dq_producers, 1)
    Producer.wait_time = constant_throughput(rate)  # type: ignore[assignment]


# Not on cluster_dq.client: at the same low rate (`python loadtest/bench_locust.py`: 4 producers
# at 60 jobs/s, 4 consumers, 15 s each, one service) locust spent ~680-710 us of CPU per request
# here, ~1,290 us with HttpUser, and ~1,400-1,650 us with the same users on the sync Client
# (loadtest/locust_client.py; publish p50 3-4 ms vs 5-10 ms). locust runs on one core: at the
# profile's 1,500 req/s the Client would make locust the bottleneck and its latency the figure.
class _DQUser(FastHttpUser):
    abstract = True
    connection_timeout = 5.0
    network_timeout = 15.0  # > the long-poll timeout

    def on_start(self) -> None:
        o = self.environment.parsed_options
        self.token = o.dq_token
        self.queues = [f"q{i}" for i in range(o.dq_queues)]
        self.max_delay_ms = o.dq_max_delay_ms


class Producer(_DQUser):
    fixed_count = 25
    wait_time = constant_throughput(20)

    @task
    def publish(self) -> None:
        delay = random.randint(0, self.max_delay_ms)
        due = time.time() * 1000 + delay
        q = random.choice(self.queues)
        self.client.put(
            f"/api/{NS}/{q}?delay_ms={delay}&ttl=3600&tries=3",
            data=json.dumps({"due": due}),
            headers={"X-Token": self.token},
            name="/api/{ns}/{q} (publish)",
        )


class Consumer(_DQUser):
    fixed_count = 20

    def wait_time(self) -> float:
        return 0.0  # a long poll paces itself

    @task
    def consume_and_ack(self) -> None:
        path = f"/api/{NS}/{','.join(self.queues)}?timeout=1&ttr=30"
        with self.client.get(
            path,
            headers={"X-Token": self.token},
            name="/api/{ns}/{queues} (long poll)",
            catch_response=True,
        ) as r:
            if r.status_code == 404:  # nothing due within the long poll: not an error
                r.success()
                return
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}")
                return
            job = r.json()
        late_ms = time.time() * 1000 - json.loads(base64.b64decode(job["data"]))["due"]
        # Overall, and per queue: a consume tries the queues in order (q0 first, lmstfy's
        # priority), so when consumers fall behind the last queues wait longest.
        for name in ("deliver", f"deliver {job['queue']}"):
            events.request.fire(
                request_type="LATENESS",
                name=name,
                response_time=max(late_ms, 0.0),
                response_length=0,
                exception=None,
                context={},
            )
        self.client.delete(
            f"/api/{NS}/{job['queue']}/job/{job['job_id']}",
            headers={"X-Token": self.token},
            name="/api/{ns}/{q}/job/{id} (ack)",
        )
