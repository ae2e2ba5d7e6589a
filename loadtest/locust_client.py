"""The load profile's users on ``cluster_dq.client.Client``, as locust documents a custom client
(each call fires ``events.request``), to compare locust's own cost per request with the
FastHttpUser of ``loadtest/locustfile.py``, which the profile keeps (that file says why).
``loadtest/bench_locust.py`` runs both; by hand, with the locustfile's options:

    locust -f loadtest/locust_client.py --host URL --dq-token TOKEN --dq-publish-rate 60
"""

from __future__ import annotations

import random
import time
from typing import Any

from locust import User, constant_throughput, events, task

import loadtest.locustfile as base  # its --dq-* options
from cluster_dq.client import Client, DQError, Job


@events.init.add_listener
def _configure(environment: Any, **_: Any) -> None:
    o = environment.parsed_options
    if o is None:
        return
    ClientProducer.fixed_count = o.dq_producers
    ClientConsumer.fixed_count = o.dq_consumers
    rate = o.dq_publish_rate / max(o.dq_producers, 1)
    ClientProducer.wait_time = constant_throughput(rate)  # type: ignore[assignment]


class _ClientUser(User):
    """One ``Client`` per user, without the client's retries (a failure must show)."""

    abstract = True

    def on_start(self) -> None:
        o = self.environment.parsed_options
        self.queues = [f"q{i}" for i in range(o.dq_queues)]
        self.max_delay_ms = o.dq_max_delay_ms
        self.dq = Client(self.host, o.dq_token, base.NS, timeout=15.0, max_connections=1, retries=0)

    def on_stop(self) -> None:
        self.dq.close()

    def call(self, method: str, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result, error = None, None
        try:
            result = fn(*args, **kwargs)
        except DQError as e:
            error = e
        events.request.fire(
            request_type=method,
            name=name,
            response_time=(time.perf_counter() - started) * 1000,
            response_length=0,
            exception=error,
            context={},
        )
        return result


class ClientProducer(_ClientUser):
    fixed_count = 25
    wait_time = constant_throughput(20)

    @task
    def publish(self) -> None:
        delay = random.randint(0, self.max_delay_ms)
        body = f'{{"due": {time.time() * 1000 + delay}}}'
        q = random.choice(self.queues)
        self.call(
            "PUT",
            "/api/{ns}/{q} (publish)",
            self.dq.publish,
            q,
            body,
            delay=delay / 1000,
            ttl=3600,
            tries=3,
        )


class ClientConsumer(_ClientUser):
    fixed_count = 20

    def wait_time(self) -> float:
        return 0.0  # a long poll paces itself

    @task
    def consume_and_ack(self) -> None:
        name = "/api/{ns}/{queues} (long poll)"
        job: Job | None = self.call("GET", name, self.dq.consume, self.queues, ttr=30, timeout=1)
        if job is None:
            return
        late_ms = time.time() * 1000 - job.json()["due"]
        for what in ("deliver", f"deliver {job.queue}"):
            events.request.fire(
                request_type="LATENESS",
                name=what,
                response_time=max(late_ms, 0.0),
                response_length=0,
                exception=None,
                context={},
            )
        self.call("DELETE", "/api/{ns}/{q}/job/{id} (ack)", self.dq.ack, job.queue, job.id)
