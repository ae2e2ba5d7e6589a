"""A black-box history test over HTTP, Jepsen style: random clients, faults, then a checker.

    python loadtest/history.py standalone            # (a) a service instance, then the pump leader, SIGKILLed
    python loadtest/history.py sentinel              # (b) the Sentinel master SIGKILLed (+ the pump leader)
    python loadtest/history.py cluster               # (c) a Cluster master SIGKILLed (+ the pump leader)
    python loadtest/history.py all --seconds 300     # a, then b and c with durable publish on and off
    options: --seconds 20 (load) --rate 60 (publishes/s) --no-durable --seed N

Two `cluster-dq serve` instances (loadtest/drill.py's machinery) on a Redis topology of their
own. Producers publish with random delays, tries and (some) client job ids, into three queues
(loadtest/history_mix.py): q1 takes only grouped jobs (a heavy group's bursts, three light
groups, and a metered group that an operator pauses, resumes and limits at run time, lifting
it all before the drain); in q0 and q2 some jobs go under dedup keys from a small pool
(simple or debounce, meeting on the same keys; throttle windows on others). Consumers
long-poll and, for each job, at random ack it, drop it (its ttr runs out), touch it and ack
later, release it with a delay, or ack it after its ttr ran out (a late ack: with its lease it
must be refused with a 409; one consumer of q0 and q2, an lmstfy client, never sends a lease);
q1's two consumers take about half of what is published there three seconds in four, so a
backlog builds and ebbs across the groups' turns.
Every request is recorded as an invoke and an ok / fail / info completion (loadtest/
history_events.py). A third of the way in the first event happens, two thirds in the second,
each killed instance is restarted at once (as a supervisor would); then the load stops, the
consumers drain (ack everything), every job's final state is looked up, dead letters counted
and deleted, and the queues must be empty with nothing left in Redis. The checker
(loadtest/history_check.py) then counts anomalies by kind; the report prints them with the
operation counts, what was done with groups and dedup keys, and how many grouped jobs the
fair-turns check judged.

What is asserted where (tests/system/test_history.py) is what the engine guarantees: on standalone,
no anomaly at all (fair turns and one job per dedup key included); across a Redis failover no
unexpected or early delivery, exact remain_tries and nothing left behind, and with durable
publish (WaitReplicas=1) nothing lost and no acked job delivered again. A consume is not a
durable write, so a failover may roll a reservation back (and a group's turns with it):
held-twice, tries, dead-letter, starved and dedup-twice counts are reported there, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

if __package__ in (None, ""):  # run as a script (python loadtest/history.py): find loadtest, tests
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster_dq.localredis import SentinelGroup, free_port  # noqa: E402
from loadtest.drill import (  # noqa: E402
    Deployment,
    Instance,
    kill_cluster_master,
    kill_sentinel_master,
    leading_instance,
    setup,
    start_instance,
)
from loadtest import history_mix as mix  # noqa: E402
from loadtest.history_check import KINDS, Final, Report, check  # noqa: E402
from loadtest.history_events import History  # noqa: E402

SCENARIOS = ("standalone", "sentinel", "cluster")
LMSTFY_CONSUMER = 103  # the process number of the consumer that ignores leases
HEAVY_PRODUCER = 0  # the process number of the producer of the heavy group's bursts
OPERATOR = 200  # the process number of the operator who changes the metered group's settings
NS = "hist"


@dataclass
class Run:
    scenario: str
    d: Deployment
    instances: list[Instance]
    durable: bool
    token: str
    queues: list[str]
    rng: random.Random
    h: History = field(default_factory=History)
    statuses: Counter[str] = field(default_factory=Counter)  # "f status" of every reply
    examples: dict[str, str] = field(default_factory=dict)  # one body per unexpected status
    events: list[str] = field(default_factory=list)
    draining: bool = False
    published: int = 0  # publishes answered 2xx so far
    t0: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def base(self, i: int) -> str:
        return self.instances[i % len(self.instances)].base


def kind(e: BaseException) -> str:
    return type(e).__name__


class Client:
    """One simulated client: its requests, each recorded in the history."""

    def __init__(self, run: Run, process: int, http: httpx.AsyncClient) -> None:
        self.run, self.process, self.http = run, process, http
        self.h = {"X-Token": run.token}
        self.sent = process  # round robin over the instances, from a different one per client
        # Consumers present the lease of their delivery (when the service gives one), but one,
        # an lmstfy client, never does: the two kinds must work side by side.
        self.leases = process != LMSTFY_CONSUMER

    async def request(
        self, f: str, method: str, path: str, params: dict[str, Any], data: bytes | None = None
    ) -> tuple[int, Any]:
        """Sends to one instance; a refused connection (nothing was sent) goes on to the next,
        as a load balancer does. Raises ``ConnectionRefusedError`` when all refused."""
        run = self.run
        self.sent += 1
        for k in range(len(run.instances)):
            base = run.base(self.sent + k)
            try:
                r = await self.http.request(
                    method, base + path, params=params, content=data, headers=self.h
                )
            except httpx.ConnectError:  # the connection was never opened: nothing was sent
                continue
            run.statuses[f"{f} {r.status_code}"] += 1
            if r.status_code >= 500 or r.status_code in (400, 401):
                run.examples.setdefault(f"{f} {r.status_code}", r.text[:300])
            return r.status_code, r.text
        run.statuses[f"{f} refused"] += 1
        raise ConnectionRefusedError

    async def op(
        self,
        f: str,
        method: str,
        path: str,
        params: dict[str, Any],
        args: dict[str, Any],
        ok: tuple[int, ...],
        data: bytes | None = None,
    ) -> tuple[str, int, Any]:
        """One operation: invoke, request, completion. A 2xx in ``ok`` is ok, a 4xx a certain
        fail (the service refused it whole), a 5xx or a broken request info (unknown)."""
        run = self.run
        op = run.h.invoke(self.process, f, run.now(), **args)
        try:
            status, text = await self.request(f, method, path, params, data)
        except ConnectionRefusedError:
            run.h.complete(op, "fail", run.now(), error="refused")
            return "fail", 0, None
        except httpx.HTTPError as e:
            run.statuses[f"{f} {kind(e)}"] += 1
            run.h.complete(op, "info", run.now(), error=kind(e))
            return "info", 0, None
        body: Any = None
        with contextlib.suppress(ValueError):
            body = json.loads(text) if text else None
        t = run.now()
        if status in ok:
            return "ok", status, (op, t, body)
        run.h.complete(op, "fail" if 400 <= status < 500 else "info", t, status=status, body=body)
        return ("fail" if 400 <= status < 500 else "info"), status, body

    async def publish(self, n: int, heavy: bool = False) -> None:
        """One job: of the heavy group, or as ``mix.pick`` chooses (plain, grouped, keyed)."""
        rng = self.run.rng
        key = f"k{self.process}-{n}"
        q, extra = mix.heavy(self.run.queues) if heavy else mix.pick(rng, self.run.queues)
        delay_ms = 0 if rng.random() < 0.3 else rng.randint(100, 1500)
        tries = rng.randint(1, 3)
        params: dict[str, Any] = {"delay_ms": delay_ms, "tries": tries, **extra}
        client_id = f"c-{key}" if rng.random() < 0.3 else None
        if client_id:
            params["job_id"] = client_id
        args = {"key": key, "queue": q, "delay_ms": delay_ms, "tries": tries, "job_id": client_id}
        args.update(mix.recorded(extra))
        type_, _, got = await self.op(
            "publish", "PUT", f"/api/{NS}/{q}", params, args, (201,), key.encode()
        )
        if type_ == "ok":
            op, t, body = got
            answer = {"dedup": body["dedup"]} if "dedup" in body else {}
            self.run.h.complete(op, "ok", t, job_id=body["job_id"], **answer)
            self.run.published += 1

    async def configure(self, settings: dict[str, Any]) -> str:
        """A change of the metered group's settings (PATCH), answered with the group."""
        q, g = mix.grouped_queue(self.run.queues), mix.METERED
        args = {"queue": q, "group": g, "settings": settings}
        path = f"/api/{NS}/{q}/groups/{g}"
        data = json.dumps(settings).encode()
        type_, _, got = await self.op("configure_group", "PATCH", path, {}, args, (200,), data)
        if type_ == "ok":
            op, t, body = got
            self.run.h.complete(op, "ok", t, **body)
        return type_

    async def consume(self, queues: list[str], ttr_ms: int, count: int) -> list[dict[str, Any]]:
        params = {"ttr_ms": ttr_ms, "timeout": 1, "count": count}
        args = {"queues": queues, "ttr_ms": ttr_ms, "count": count}
        type_, status, got = await self.op(
            "consume", "GET", f"/api/{NS}/{','.join(queues)}", params, args, (200,)
        )
        if (
            type_ == "fail" and status == 404
        ):  # no job (what a lost reply reserved: back after its ttr)
            return []
        if type_ != "ok":
            if type_ == "fail":
                await asyncio.sleep(0.05)
            return []
        op, t, body = got
        jobs = [
            {
                "key": base64.b64decode(j["data"]).decode(),
                "job_id": j["job_id"],
                "queue": j["queue"],
                "remain_tries": j["remain_tries"],
                "deliveries": j["deliveries"],
                "elapsed_ms": j["elapsed_ms"],
                "lease": j.get("lease"),
            }
            for j in (body if isinstance(body, list) else [body])
        ]
        self.run.h.complete(op, "ok", t, jobs=jobs)
        return jobs

    async def act(self, f: str, job: dict[str, Any], **extra: Any) -> str:
        """ack (DELETE), touch or release of one delivered job, with its lease when it has one."""
        params: dict[str, Any] = {k: v for k, v in extra.items()}
        lease = job["lease"] if self.leases else None
        if lease:
            params["lease"] = lease
        path = f"/api/{NS}/{job['queue']}/job/{job['job_id']}"
        method, ok = ("DELETE", (204,)) if f == "ack" else ("POST", (200,))
        if f != "ack":
            path += "/" + f
        args = {"key": job["key"], "job_id": job["job_id"], "lease": lease, **extra}
        type_, status, got = await self.op(f, method, path, params, args, ok)
        if type_ == "ok":
            op, t, body = got
            self.run.h.complete(op, "ok", t, status=status, **(body or {}))
        return type_

    async def handle(self, job: dict[str, Any], ttr_ms: int) -> None:
        """What a consumer does with one job: at random, unless draining (then: ack)."""
        rng = self.run.rng
        x = rng.random()
        if self.run.draining or x < 0.45:
            await self.act("ack", job)
        elif x < 0.60:
            pass  # dropped: its ttr runs out
        elif x < 0.75:
            ttr2 = rng.randint(300, 1500)
            if await self.act("touch", job, ttr_ms=ttr2) == "ok":
                await asyncio.sleep(rng.uniform(0, ttr2 / 2000))
                await self.act("ack", job)
        elif x < 0.93:
            await self.act("release", job, delay_ms=rng.choice((0, rng.randint(50, 1000))))
        else:  # a late ack: after the ttr ran out (with a lease: must not ack another's hold)
            await asyncio.sleep(ttr_ms / 1000 + rng.uniform(0.05, 0.5))
            await self.act("ack", job)


async def producer(run: Run, process: int, rate: float, until: float, at_least: int) -> None:
    """Publishes at ``rate`` until ``until``, and on until ``at_least`` publishes of all
    producers got a 2xx (a slow machine or a long failover must not make a vacuous run; at
    most 120 s more). One producer is the heavy group's: its jobs go ``mix.BURST`` at once."""
    async with session() as http:
        c = Client(run, process, http)
        n = 0
        start = run.now()
        burst = mix.BURST if process == HEAVY_PRODUCER else 1
        while run.now() < until or (run.published < at_least and run.now() < until + 120):
            await asyncio.gather(*(c.publish(n + i, burst > 1) for i in range(burst)))
            n += burst
            await asyncio.sleep(max(0.0, start + n / rate - run.now()))


async def operator(run: Run, until: float) -> None:
    """Changes the metered group's settings every 0.2 to 1.5 s until ``until`` (each of
    ``mix.SETTINGS`` once per round: ``mix.settings_round``), then lifts
    them all (until a 200 says so), so that the drain empties its queue."""
    async with session() as http:
        c = Client(run, OPERATOR, http)
        order: list[dict[str, Any]] = []
        while run.now() < until:
            await asyncio.sleep(run.rng.uniform(0.2, 1.5))
            order = order or mix.settings_round(run.rng)
            await c.configure(order.pop(0))
        for _ in range(150):
            if await c.configure(mix.UNLIMITED) == "ok":
                break
            await asyncio.sleep(0.2)


async def consumer(
    run: Run, process: int, stop: asyncio.Event, queues: list[str], paced: float = 0
) -> None:
    """Consumes from ``queues`` until ``stop``, 1 to 5 jobs at a time. ``paced``: three seconds
    in four, one job per consume and at most ``paced`` consumes a second (unpaced the fourth
    second and while draining), so that a backlog builds and ebbs."""
    async with session() as http:
        c = Client(run, process, http)
        handling: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            ttr_ms = 5000 if run.draining else run.rng.randint(300, 1500)
            slow = paced > 0 and not run.draining and run.now() % 4 < 3
            started = run.now()
            jobs = await c.consume(queues, ttr_ms, 1 if slow else run.rng.randint(1, 5))
            for job in jobs:
                t = asyncio.create_task(c.handle(job, ttr_ms))
                handling.add(t)
                t.add_done_callback(handling.discard)
            if slow:
                await asyncio.sleep(max(0.0, started + 1 / paced - run.now()))
        await asyncio.gather(*handling)


def session() -> httpx.AsyncClient:
    """A client that never repeats a request by itself (aiohttp repeats an idempotent one, a
    PUT included, whose kept-alive connection broke: a publish the dead instance may have
    written would then be sent again, and create a second job)."""
    return httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=16))


# Where instances listen: above every other range the tests take (Redis's cluster-bus ports end
# at 28000) and below the kernel's ephemeral ports; data ports in the lower half, admin ports in
# the upper.
PORTS = (28000, 32768)


def instance_ports() -> tuple[int, int]:
    """Free (data, admin) ports for an instance, at random in ``PORTS`` (this process's share of
    it, when test workers run side by side): a killed instance's port, freed, must not be taken
    over by a stranger (another service started meanwhile on this machine scans from 18000, and a
    client's retry to the old address would reach it) nor by our restart."""
    low, high = PORTS
    middle = (low + high) // 2
    return free_port(low, middle), free_port(middle, high)


# -- the events ---------------------------------------------------------------------------------


async def restart(run: Run, victim: Instance, why: str) -> None:
    """SIGKILL of one service instance, started again at once (new ports) as a supervisor would."""
    run.instances.remove(victim)
    await asyncio.to_thread(victim.kill)
    run.events.append(f"{run.now():.1f}s SIGKILL of {why} instance {victim.base}")
    fresh = await asyncio.to_thread(start_instance, run.d, run.durable, instance_ports())
    run.instances.append(fresh)
    run.events.append(f"{run.now():.1f}s restarted as {fresh.base}")


async def kill_any_instance(run: Run) -> None:
    await restart(run, run.rng.choice(run.instances), "a service")


async def kill_pump_leader(run: Run) -> None:
    for _ in range(100):  # the leases live in Redis: after a master kill, wait for its successor
        try:
            victim = await asyncio.to_thread(leading_instance, run.d, run.instances)
            break
        except redis.RedisError:
            await asyncio.sleep(0.2)
    else:
        raise RuntimeError("no Redis master to read the pump leases from for 20 s")
    await restart(run, victim, "the pump-leading")


async def kill_master(run: Run) -> None:
    if isinstance(run.d, SentinelGroup):
        what = await asyncio.to_thread(kill_sentinel_master, run.d, run.instances)
    else:
        what = await asyncio.to_thread(kill_cluster_master, run.d, run.instances, run.queues, NS)
    run.events.append(f"{run.now():.1f}s {what}")


EVENTS = {
    "standalone": (kill_any_instance, kill_pump_leader),
    "sentinel": (kill_master, kill_pump_leader),
    "cluster": (kill_master, kill_pump_leader),
}


# -- the end state --------------------------------------------------------------------------------


async def drained(run: Run, http: httpx.AsyncClient) -> bool:
    for q in run.queues:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            s = (await http.get(f"{run.base(0)}/api/{NS}/{q}/size")).json()
            if s["size"] or s["delayed"] or s["reserved"]:
                return False
            continue
        return False
    return True


async def final_state(run: Run) -> Final:
    """Each job's state (looked up by id), the dead-letter sizes; then the dead letters are
    deleted and every size must be 0 and every Redis structure of the queues gone."""
    from cluster_dq.testing.invariants import check_queue, queue_keys

    ids: dict[str, tuple[str, str]] = {}  # key -> (queue, job id)
    for e in run.h.events:
        if e.f == "publish" and e.type == "invoke" and e.value["job_id"]:
            ids[e.value["key"]] = (e.value["queue"], e.value["job_id"])
        elif e.f == "publish" and e.type == "ok":
            inv = next(i for i in run.h.events if i.op == e.op)
            ids[inv.value["key"]] = (inv.value["queue"], e.value["job_id"])
        elif e.f == "consume" and e.type == "ok":
            for j in e.value["jobs"]:
                ids[j["key"]] = (j["queue"], j["job_id"])
    states: dict[str, str | None] = {}
    leftovers: dict[str, Any] = {}
    async with httpx.AsyncClient(
        headers={"X-Token": run.token}, timeout=30, limits=httpx.Limits(max_connections=32)
    ) as http:
        sem = asyncio.Semaphore(32)

        async def look(key: str, q: str, jid: str) -> None:
            async with sem:
                r = await http.get(f"{run.base(0)}/api/{NS}/{q}/job/{jid}")
            states[key] = r.json()["state"] if r.status_code == 200 else None
            if r.status_code not in (200, 404):
                leftovers[f"lookup {jid}"] = r.status_code

        await asyncio.gather(*(look(k, q, j) for k, (q, j) in ids.items()))
        dead: dict[str, int] = {}
        for q in run.queues:
            dead[q] = (await http.get(f"{run.base(0)}/api/{NS}/{q}/deadletter")).json()[
                "deadletter_size"
            ]
            if dead[q]:
                await http.delete(
                    f"{run.base(0)}/api/{NS}/{q}/deadletter", params={"limit": dead[q]}
                )
            s = (await http.get(f"{run.base(0)}/api/{NS}/{q}/size")).json()
            if any(s[k] for k in ("size", "delayed", "reserved", "dead")):
                leftovers[f"sizes {q}"] = s
    with run.d.sync_client() as r:
        for q in run.queues:
            try:
                check_queue(r, NS, q)
                if keys := queue_keys(r, NS, q):
                    leftovers[f"keys {q}"] = [k.decode() for k in keys[:5]]
            except AssertionError as e:
                leftovers[f"invariants {q}"] = str(e)
    return Final(states, dead, leftovers)


# -- the run --------------------------------------------------------------------------------------


async def load(run: Run, seconds: float, rate: float, at_least: int = 0) -> None:
    stop = asyncio.Event()
    grouped = mix.grouped_queue(run.queues)
    others = [q for q in run.queues if q != grouped]
    consumers = [asyncio.create_task(consumer(run, 100 + k, stop, others)) for k in range(4)]
    # The grouped queue's own consumers take about half of what is published there (rate / 2)
    # three seconds in four: a backlog, heavy's mostly, across whose turns the others pass.
    consumers += [
        asyncio.create_task(consumer(run, 104 + k, stop, [grouped], rate / 8)) for k in range(2)
    ]
    producers = [
        asyncio.create_task(producer(run, k, rate / 4, seconds, at_least)) for k in range(4)
    ]
    operating = asyncio.create_task(operator(run, seconds))
    first, second = EVENTS[run.scenario]
    await asyncio.sleep(seconds / 3)
    await first(run)
    await asyncio.sleep(max(0.0, seconds * 2 / 3 - run.now()))
    await second(run)
    await asyncio.gather(*producers, operating)
    run.draining = True
    run.events.append(f"{run.now():.1f}s load stopped; draining")
    deadline = run.now() + 60
    async with httpx.AsyncClient(headers={"X-Token": run.token}, timeout=10) as http:
        calm = 0
        while run.now() < deadline and calm < 3:  # empty three times in a row, 0.5 s apart
            await asyncio.sleep(0.5)
            calm = calm + 1 if await drained(run, http) else 0
    stop.set()
    await asyncio.gather(*consumers)
    run.events.append(f"{run.now():.1f}s drained")


def history_run(
    scenario: str,
    seconds: float = 20,
    rate: float = 60,
    durable: bool = True,
    seed: int | None = None,
    n_queues: int = 3,
    deployment: Deployment | None = None,
    at_least: int = 0,
) -> tuple[Report, Run]:
    """One run of ``scenario``: its report and the run (history, events, reply statuses). On
    its own Redis topology, unless ``deployment`` is given (standalone only: nothing kills it)."""
    seed = random.randrange(1 << 30) if seed is None else seed
    durable = durable and scenario != "standalone"  # no replica to confirm a write
    assert n_queues > mix.GROUPED  # a queue of grouped jobs, and others
    assert deployment is None or scenario == "standalone"
    d = deployment or setup(scenario)
    instances: list[Instance] = []
    try:
        instances = [start_instance(d, durable, instance_ports()) for _ in range(2)]
        token = httpx.post(
            f"{instances[0].admin}/token/{NS}", params={"description": "history"}
        ).json()["token"]
        run = Run(
            scenario,
            d,
            instances,
            durable,
            token,
            [f"q{i}" for i in range(n_queues)],
            random.Random(seed),
        )
        run.events.append(f"seed {seed}")
        time.sleep(1.5)  # leases settle: both instances lead some shards
        run.t0 = time.monotonic()
        asyncio.run(load(run, seconds, rate, at_least))
        final = asyncio.run(final_state(run))
        return check(run.h, final), run
    finally:
        for inst in instances:
            inst.kill()
        if deployment is None:
            d.stop()


def print_report(scenario: str, durable: bool, seconds: float, report: Report, run: Run) -> None:
    print(
        f"history {scenario}, durable publish {'on' if run.durable else 'off'}, {seconds:.0f} s of load"
    )
    for e in run.events:
        print(f"  {e}")
    ops = run.h.counts()
    print("  operations: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())))
    print("  extensions: " + mix.describe(mix.tally(run.h)))
    print("  figures:    " + ", ".join(f"{k} {v}" for k, v in report.stats.items()))
    print("  replies:    " + ", ".join(f"{k} {v}" for k, v in sorted(run.statuses.items())))
    for k, text in run.examples.items():
        print(f"    e.g. {k}: {text}")
    print("  anomalies:  " + ", ".join(f"{k} {report.counts[k]}" for k in KINDS))
    for k in KINDS:
        for ex in report.examples[k][:3]:
            print(f"    {k}: {ex}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("scenario", choices=[*SCENARIOS, "all"])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rate", type=float, default=60, help="publishes/s")
    ap.add_argument("--no-durable", action="store_true")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--dump", help="write each run's history here (JSON lines, one event a line)")
    a = ap.parse_args()
    if a.scenario == "all":
        runs = [
            ("standalone", True),
            ("sentinel", True),
            ("sentinel", False),
            ("cluster", True),
            ("cluster", False),
        ]
    else:
        runs = [(a.scenario, not a.no_durable and a.scenario != "standalone")]
    for scenario, durable in runs:
        report, run = history_run(scenario, a.seconds, a.rate, durable, a.seed)
        print_report(scenario, durable, a.seconds, report, run)
        if a.dump:
            with open(a.dump, "a") as out:
                for e in run.h.events:
                    out.write(
                        json.dumps({"run": f"{scenario} durable={durable}", **e.__dict__}) + "\n"
                    )


if __name__ == "__main__":
    main()
