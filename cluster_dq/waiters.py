"""Long-poll consumers without a Redis connection each: one watcher task per waited-on queue.

A consumer that found nothing registers a ``Waiter``. The queue's watcher (one per queue per
process) consumes on behalf of the waiters, first come first served, and sleeps until the
earliest of: the queue's next due time (kept by the service's own timer, not by a Redis
blocking timeout, which fires only on Redis's ``hz`` tick), a pub/sub notice that the ready
set became non-empty (published by the scripts), the nearest waiter deadline, or a 1 s
safety poll. All watchers share the engine's connection pool and its notices (notices.py).
A watcher whose last waiter left stays subscribed, without looking, for ``LINGER_S``: a
consumer polls again at once, and its next long-poll then costs no subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any


from cluster_dq import giveback
from cluster_dq.coalesce import GROUP_MAX, GroupCommit
from cluster_dq.engine import commands as ops
from cluster_dq.engine import core, retry
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.core import cancelling, end_if_cancelled
from cluster_dq.errors import Transient
from cluster_dq.keys import QueueKeys
from cluster_dq.models import Job
from cluster_dq.notices import Notices

log = logging.getLogger(__name__)

SAFETY_POLL_S = 1.0
NEVER_COVERED = 2**63  # a reason no look covers
GIVE_BACK_GRACE_S = 2.0
SUBSCRIBE_WAIT_S = 0.2  # how long a new watcher's first look waits for its subscription
# How long a watcher with no waiter left stays (subscribed, not looking) for the next one, and
# how many may at once per worker (long-polls of ever new queue names would each leave one).
LINGER_S, LINGER_MAX = 10.0, 1_000
DEADLINE_SLACK_S = 0.005  # a waiter this close to its deadline is answered, not looked for


@dataclass(eq=False)
class Waiter:
    namespace: str
    queues: Sequence[str]
    ttr_ms: int
    count: int
    deadline: float  # monotonic
    future: asyncio.Future[list[Job]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    busy: bool = False
    # The last look for it could not reach Redis (nothing reserved): at its deadline it is
    # answered with that error, not "no job" (the queue was not looked at).
    unreachable: Transient | None = None
    # When (engine ms, no later than the look's own clock) the latest look for it that found
    # nothing began: it covered every queue it waits on, so a watcher whose reason to look is
    # older need not look again (``_Watcher.covered``).
    looked_empty: int = -1


@dataclass
class Look:
    """What a consume's first look saw, for the long-poll that follows it in the same request:
    when (engine ms) that look began, if it reached Redis and found nothing (else None)."""

    empty_at: int | None = None


class _Watcher:
    def __init__(self, hub: WaiterHub, namespace: str, queue: str) -> None:
        self.hub = hub
        self.namespace = namespace
        self.queue = queue
        self.channel = QueueKeys(namespace, queue).notify
        self.waiters: list[Waiter] = []
        self.wake = asyncio.Event()
        self.arrived = asyncio.Event()  # a waiter came while it lingered
        self.task: asyncio.Task[None] | None = None
        self.due_ms: int | None = None  # the earliest due time noticed since the last look
        self.heard_due = -1  # when (engine ms) it last heard of a job put off (``due:``)
        self.heard_before = -1  # ``heard_due`` when ``due_ms`` was last cleared (a look began)
        self.looked_again = False  # the last look found an event due and nothing ready
        self._timer: asyncio.Timeout | None = None  # the sleep in progress
        self._timer_due: int | None = None  # the due time (engine ms) the timer is set for
        # Its latest reason to look, in engine ms: a due time (a look whose clock reached it
        # covers it) or a moment (a notice came, it subscribed, it must look again: only a
        # look begun in a later ms covers it, ``strict``). Until it has subscribed, none does.
        self.reason_ms, self.strict = NEVER_COVERED, True
        # What the latest look at this queue that did not take every job it asked for saw:
        # (when it began, engine ms; jobs left ready; the next event, ms or None). A watcher
        # whose look found nothing reads its queue from here, not with a sizes.lua of its own.
        self.seen: tuple[int, int, int | None] | None = None

    def reason(self, ms: int, strict: bool) -> None:
        """A reason to look at ``ms``; the latest one counts (a moment after a due time)."""
        if (ms, strict) > (self.reason_ms, self.strict):
            self.reason_ms, self.strict = ms, strict

    def reason_now(self) -> None:
        self.reason(self.hub.engine.clock(), True)

    def covered(self, waiter: Waiter) -> bool:
        """Whether a look for ``waiter`` that found nothing began after this watcher's latest
        reason to look: another of its queues' watchers, or its own consume, looked for it."""
        return self._after_reason(waiter.looked_empty)

    def _after_reason(self, began: int) -> bool:
        return began > self.reason_ms or (began == self.reason_ms and not self.strict)

    def noticed_due(self, due_ms: int) -> None:
        """A job was put into DELAYED, due at ``due_ms``: the watcher's timer was set before
        it existed, and is brought forward (no Redis round trip) when it is later."""
        self.heard_due = self.hub.engine.clock()
        if self.due_ms is None or due_ms < self.due_ms:
            self.due_ms = due_ms
        timer = self._timer
        if timer is not None:
            when = asyncio.get_running_loop().time() + self._until(due_ms)
            current = timer.when()
            if current is None or when < current:
                timer.reschedule(when)
                self._timer_due = due_ms

    def _until(self, t_ms: int) -> float:
        return max((t_ms - self.hub.engine.clock()) / 1000, 0.0)

    async def _listen(self) -> None:
        """Subscribes to the queue's notices, beside the looks: a node slow to answer (a
        Cluster's, failing) delays its notices, never a look. A failed subscription is tried
        again (1, 2, 4... up to 10 s apart) while the watcher serves."""
        backoff = 1.0
        while self.hub.watchers.get((self.namespace, self.queue)) is self:
            try:
                await self.hub._subscribe(self)
                break
            except Exception as e:  # the 1-s safety poll covers the missing notices
                log.warning(
                    "watcher %s/%s: no notices yet: %s: %s",
                    self.namespace,
                    self.queue,
                    type(e).__name__,
                    e,
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
        else:
            return
        key = (self.namespace, self.queue)
        if self.hub.watchers.get(key) is not self:  # retired meanwhile
            if key not in self.hub.watchers:  # and no newer watcher wants the channel
                self.hub._background(self.hub._unsubscribe(self.channel.encode()))
            return
        # Only a look begun from here on has seen what its notices would have told (one sent
        # while it subscribed reached nobody): it looks again now.
        self.reason_ms, self.strict = self.hub.engine.clock(), True
        self.wake.set()

    async def run(self) -> None:
        listening = asyncio.create_task(self._listen(), context=retry.detached())
        self.hub._listening.add(listening)  # cancelled by close() if still under way
        listening.add_done_callback(self.hub._listening.discard)
        # Most subscriptions take a round trip: the first look waits for it (else it would
        # look now and again once subscribed), but not for long.
        await asyncio.wait({listening}, timeout=SUBSCRIBE_WAIT_S)
        try:
            while True:
                while self.waiters:
                    end_if_cancelled()
                    try:
                        await self._serve()
                    except Transient as e:  # a failover: keep the waiters, look again shortly
                        if cancelling():
                            raise asyncio.CancelledError() from e
                        log.warning("watcher %s/%s: %s", self.namespace, self.queue, e)
                        await asyncio.sleep(0.1)
                if not await self._linger():
                    break
        except asyncio.CancelledError:
            raise
        except Exception:  # never strand a waiter: answer it with "nothing"
            log.exception("watcher %s/%s failed", self.namespace, self.queue)
            for w in self.waiters:
                if not w.future.done():
                    w.future.set_result([])
        finally:
            self.hub._retire(self)

    async def _linger(self) -> bool:
        """No waiter left: stays subscribed, without looking, for ``LINGER_S`` in case another
        comes. Notices heard meanwhile still set its reason to look (``_heard``), so the next
        waiter's consume covers it only if that consume's look began after them. True: a
        waiter came."""
        hub = self.hub
        if hub._stopping or hub.lingering >= LINGER_MAX:
            return False
        self.arrived.clear()
        hub.lingering += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LINGER_S):
                    await self.arrived.wait()
        finally:
            hub.lingering -= 1
        if hub._stopping:  # (consume registers no waiter once stopping; should one be here)
            for w in list(self.waiters):
                hub._finish(w, [])
        return bool(self.waiters)

    async def _serve(self) -> None:
        engine = self.hub.engine
        # (a timer may fire a little before its time: a look in a waiter's last ms is no use)
        now = time.monotonic() + DEADLINE_SLACK_S
        for w in [w for w in self.waiters if w.deadline <= now or w.future.done()]:
            self.hub._expire(w)
        waiter = next((w for w in self.waiters if not w.busy), None)
        if waiter is None:
            if self.waiters:  # all busy with another queue's watcher: look when one is free
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(SAFETY_POLL_S):
                        await self.hub.freed.wait()
            return
        self.wake.clear()
        self.due_ms, self.heard_before = None, self.heard_due
        looked = -1  # when this watcher's own look began (engine ms), if it looked
        if not self.covered(waiter):
            # (else a look for this waiter, by another queue's watcher or by its own consume,
            # began since this watcher's reason to look and found nothing in any of its queues:
            # looking again would find the same. Its 8 queues' watchers used to look in turn.)
            started = looked = engine.clock()
            waiter.busy = True
            try:
                jobs = await self.hub.reserve(
                    waiter.namespace, waiter.queues, waiter.ttr_ms, waiter.count, waiter.deadline
                )
            except Transient as e:
                if not core.reserved_nothing(e):  # not repeated for it: "no job" (core's rule)
                    self.hub._finish(waiter, [])
                else:
                    waiter.unreachable = e
                self.reason_now()  # look again, shortly
                raise  # the others wait on: run() looks again shortly
            finally:
                self.hub.free(waiter)
            waiter.unreachable = None
            if jobs:
                self.looked_again = False
                await self.hub._deliver(waiter, jobs)
                return
            waiter.looked_empty = max(waiter.looked_empty, started)
        until = min((w.deadline for w in self.waiters), default=time.monotonic())
        seen = self.seen
        if (
            seen is not None
            and (seen[0] >= looked >= 0 or self._after_reason(seen[0]))
            # a job put off after that look began, heard before due_ms was cleared, is known
            # to neither (one heard since is in due_ms): then sizes.lua
            and seen[0] > self.heard_before
        ):
            # the look (this one, or the one that covered it) said what is left in the queue
            ready, nxt = seen[1], seen[2]
        else:
            sizes = await engine.run(
                ops.sizes(engine.config, self.namespace, self.queue), deadline=until
            )
            ready, nxt = sizes.ready, sizes.next_event_ms
        if ready and nxt is not None and nxt <= engine.clock():
            # Jobs ready and none handed out: the queue is paused (consume.lua), and what is
            # due there is the pump's. Wait for resume's wake-up ('1') or the safety poll.
            nxt = None
        if nxt is not None and nxt <= engine.clock() and ready == 0:
            if not self.looked_again:
                # Most often a job that became due while the look was under way: look again
                # at once (a consume promotes due jobs itself), no pump step in between.
                self.looked_again = True
                self.reason_now()
                return
            # Still nothing: a wheel bucket to open, or expiries: the pump step here.
            sizes = await engine.run(
                ops.tick(engine.config, self.namespace, self.queue, engine.clock()),
                idempotent=True,
                deadline=until,
            )
            nxt = sizes.next_event_ms
            if sizes.ready:  # the step made jobs ready: look at once
                self.reason_now()
                return
        self.looked_again = False
        sleep, due = SAFETY_POLL_S, None
        for t in (nxt, self.due_ms):  # due_ms: noticed while this look was under way
            if t is not None and self._until(t) <= sleep:
                sleep, due = self._until(t), t
        if self.waiters:
            left = max(min(w.deadline for w in self.waiters) - time.monotonic(), 0)
            if left < sleep:
                sleep, due = left, None
        if sleep <= 0:
            self.reason_now()
            return
        self._timer_due = due
        try:
            async with asyncio.timeout(sleep) as self._timer:  # not wait_for: see consume
                try:
                    await self.wake.wait()  # a notice: ``_read`` gave the reason as it came
                finally:
                    self._timer = None
        except TimeoutError:
            # A job's due time: the reason is that time, not when this task ran again (the
            # watchers of a waiter's queues due at the same moment wake in turn, and a look
            # whose clock reached it covers every one of them). Else (the safety poll, a
            # deadline) it is now.
            if self._timer_due is not None:
                self.reason(self._timer_due, False)
            else:
                self.reason_now()


class WaiterHub:
    """Per-process registry of waiting consumers, one per engine (pool)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.watchers: dict[tuple[str, str], _Watcher] = {}
        self.notices = Notices(engine.client, self._heard)
        self._by_channel: dict[bytes, _Watcher] = {}
        self._background_tasks: set[asyncio.Task[None]] = set()
        self._listening: set[asyncio.Task[None]] = set()  # watchers' subscriptions under way
        self._closed = False
        self._stopping = False  # shutting down: nothing is reserved any more
        self.lingering = 0  # watchers with no waiter, kept for the next (``LINGER_MAX``)
        # One-job consumes (lmstfy's way) of the same queues and ttr share a consume call.
        # (each member brings its deadline: the call's repeats end at the earliest one)
        self._reserves: GroupCommit[tuple[str, tuple[str, ...], int], float | None, list[Job]] = (
            GroupCommit(self._reserve_group, GROUP_MAX, orphan=self._give_back_orphan)
        )
        self.freed = asyncio.Event()  # set (and replaced) each time a busy waiter is free again

    def free(self, waiter: Waiter) -> None:
        """A watcher is done consuming for ``waiter``: the watchers that found every waiter
        busy look again now."""
        waiter.busy = False
        freed, self.freed = self.freed, asyncio.Event()
        freed.set()

    def stop(self) -> None:
        """Shutdown: every waiting long-poll is answered now with nothing, and no consume
        reserves anything from here on (one in flight for a waiter gives its jobs back)."""
        self._stopping = True
        for watcher in list(self.watchers.values()):
            for waiter in list(watcher.waiters):
                self._finish(waiter, [])
            watcher.wake.set()
            watcher.arrived.set()  # a lingering one ends

    async def consume(
        self,
        namespace: str,
        queues: Sequence[str],
        ttr_ms: int,
        count: int,
        timeout_ms: int,
        look: Look | None = None,
    ) -> list[Job]:
        """Up to ``count`` jobs, waiting up to ``timeout_ms`` for the first. A Redis outage
        (a failover) is not an error here: while nothing can have been reserved the consume
        keeps trying until its deadline, as if no job were ready, and one whose reply was lost
        answers "no job" at once (``core.reserved_nothing``). If Redis is still unreachable
        when its time runs out, that error is raised (nothing was reserved; the service says
        so in a 503): the queue was not looked at, "no job" would not be true.

        ``look``: a consume that did not wait records there when its look, which reached Redis,
        found nothing; a long-poll given it then waits without a look of its own."""
        if self._stopping:
            return []
        # A long poll's repeats end with it; a consume that does not wait gets the budget.
        deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms > 0 else None
        unreachable: Transient | None = None
        started = self.engine.clock()
        if look is not None and look.empty_at is not None and deadline is not None:
            # the caller's own look, just before, found nothing: its waiter need not look again
            jobs, started = [], look.empty_at
        else:
            try:
                jobs = await self.reserve(namespace, queues, ttr_ms, count, deadline)
            except Transient as e:
                if not core.reserved_nothing(e):
                    log.warning("consume on %s/%s: reply lost: %s", namespace, ",".join(queues), e)
                    return []
                if deadline is None or time.monotonic() >= deadline:
                    raise
                jobs, unreachable = [], e  # unreachable or refused so far: the watchers look again
            if look is not None and not jobs and unreachable is None:
                look.empty_at = started
        if jobs or deadline is None or time.monotonic() >= deadline or self._stopping:
            return jobs  # (stopping: stop() answered the waiters; none may join after it)
        waiter = Waiter(namespace, queues, ttr_ms, count, deadline, unreachable=unreachable)
        if unreachable is None:  # this look found nothing: the watchers need not repeat it
            waiter.looked_empty = started
        for q in queues:
            w = self._watcher(namespace, q)
            w.waiters.append(waiter)
            w.arrived.set()
        answered = False
        try:
            # The watcher answers at the deadline; this bound only guards against a stuck one.
            # (asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that
            # arrives as the answer does, and the cancelled caller would carry on.)
            async with asyncio.timeout(deadline - time.monotonic() + 1):
                jobs = await asyncio.shield(waiter.future)
            answered = True
            return jobs
        except TimeoutError:
            log.warning("waiter on %s/%s outlived its deadline", namespace, ",".join(queues))
            return []
        finally:
            if not waiter.future.done():
                waiter.future.cancel()
            elif (
                not answered
                and not waiter.future.cancelled()
                and waiter.future.exception() is None
                and waiter.future.result()
            ):
                # cancelled (the client left) just as jobs were reserved for it: give them back
                self._background(self.give_back(namespace, waiter.future.result()))
            self._finish(waiter, None)

    async def reserve(
        self,
        namespace: str,
        queues: Sequence[str],
        ttr_ms: int,
        count: int,
        deadline: float | None,
    ) -> list[Job]:
        """One consume that a cancellation cannot cut in half: if the caller is cancelled (its
        client left, a multi-pool consume took another pool's jobs) while Redis has reserved
        jobs whose reply is still on its way, they are given back, not left reserved by nobody
        until their ttr (with one try left, that would be a dead letter nobody ever saw).
        ``deadline`` (monotonic s): a step that did not run is repeated until then (None:
        within the retry budget)."""
        if count == 1:
            return await self._reserves.submit((namespace, tuple(queues), ttr_ms), deadline)
        engine = self.engine
        now = engine.clock()
        op = ops.consume(
            engine.config, namespace, queues, ttr_ms, count, now, self._seen(namespace, now)
        )
        task = asyncio.ensure_future(engine.run(op, deadline=deadline))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._background(giveback.give_back_when_done(self.engine, namespace, task))
            raise

    async def _reserve_group(
        self, key: tuple[str, tuple[str, ...], int], members: list[float | None]
    ) -> list[list[Job]]:
        """One job for each of ``members`` (their deadlines) if there are enough, the first
        members first."""
        namespace, queues, ttr_ms = key
        engine = self.engine
        now = engine.clock()
        seen = self._seen(namespace, now)
        op = ops.consume(engine.config, namespace, queues, ttr_ms, len(members), now, seen)
        jobs = await engine.run(op, deadline=min(filter(None, members), default=None))
        return [[j] for j in jobs] + [[] for _ in range(len(members) - len(jobs))]

    def _seen(self, namespace: str, began: int) -> Callable[[str, int, int | None], None]:
        """What a look begun at ``began`` saw of a queue, kept by the queue's watcher."""

        def seen(queue: str, ready: int, next_event_ms: int | None) -> None:
            w = self.watchers.get((namespace, queue))
            if w is not None and (
                w.seen is None or began >= w.seen[0] or w.seen[0] > self.engine.clock()
            ):  # (the latest look's; one stamped ahead of the clock, after it stepped back, not)
                w.seen = (began, ready, next_event_ms)

        return seen

    def _give_back_orphan(self, key: tuple[str, tuple[str, ...], int], jobs: list[Job]) -> None:
        if jobs:  # its consumer was cancelled (it left) before it took them
            self._background(self.give_back(key[0], jobs))

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, context=retry.detached())
        self._background_tasks.add(task)  # awaited (or cancelled) by close() with the rest
        task.add_done_callback(self._background_tasks.discard)

    def _watcher(self, namespace: str, queue: str) -> _Watcher:
        key = (namespace, queue)
        w = self.watchers.get(key)
        if w is None:
            w = self.watchers[key] = _Watcher(self, namespace, queue)
            w.task = asyncio.create_task(w.run(), context=retry.detached())  # serves others
        return w

    def _expire(self, waiter: Waiter) -> None:
        """``waiter``'s deadline passed: "no job", or, when its last look could not reach
        Redis, that error."""
        if waiter.unreachable is not None and not waiter.future.done():
            waiter.future.set_exception(waiter.unreachable)
        self._finish(waiter, [])

    def _finish(self, waiter: Waiter, result: list[Job] | None) -> None:
        if result is not None and not waiter.future.done():
            waiter.future.set_result(result)
        for q in waiter.queues:
            w = self.watchers.get((waiter.namespace, q))
            if w is not None and waiter in w.waiters:
                w.waiters.remove(waiter)

    async def _deliver(self, waiter: Waiter, jobs: list[Job]) -> None:
        if not waiter.future.done():
            self._finish(waiter, jobs)
            return
        # The consumer left (timeout, disconnect) while we reserved for it.
        await self.give_back(waiter.namespace, jobs)
        self._finish(waiter, None)

    async def give_back(self, namespace: str, jobs: Sequence[Job]) -> None:
        """``giveback.give_back`` on this hub's engine."""
        await giveback.give_back(self.engine, namespace, jobs)

    async def _subscribe(self, watcher: _Watcher) -> None:
        channel = watcher.channel.encode()
        if self.watchers.get((watcher.namespace, watcher.queue)) is watcher:
            self._by_channel[channel] = watcher
        await self.notices.listen(channel)

    def _retire(self, watcher: _Watcher) -> None:
        key = (watcher.namespace, watcher.queue)
        if self.watchers.get(key) is watcher:
            del self.watchers[key]
            channel = watcher.channel.encode()
            if self._by_channel.get(channel) is watcher:
                del self._by_channel[channel]
            if self._closed:  # the pub/sub connections are going away with everything else
                return
            self._background(self._unsubscribe(channel))

    async def _unsubscribe(self, channel: bytes) -> None:
        with contextlib.suppress(Exception):  # at worst a stray notice wakes nobody
            if channel not in self._by_channel:
                await self.notices.leave(channel)

    def _heard(self, channel: bytes, data: bytes) -> None:
        w = self._by_channel.get(channel)
        if w is None:
            return
        if data.startswith(b"due:"):  # a delayed job: maybe an earlier timer
            w.noticed_due(int(data[4:]))
        else:  # the ready set became non-empty: look now
            w.reason_now()
            w.wake.set()

    async def close(self, grace_s: float = 5.0) -> bool:
        """Answers every waiter, lets the watchers finish what is in flight (within
        ``grace_s``) and the jobs of gone consumers go back, then stops the rest. True when
        nothing had to be cut short."""
        self.stop()
        self._closed = True
        clean = True
        listening = list(self._listening)  # subscriptions under way: not waited for
        for t in listening:
            t.cancel()
        await asyncio.gather(*listening, return_exceptions=True)
        watchers = [w.task for w in self.watchers.values() if w.task]
        if watchers:
            _, pending = await asyncio.wait(watchers, timeout=grace_s)
            clean = not pending
        tasks = [w.task for w in self.watchers.values() if w.task]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Give-backs in flight (and those the cancellations above started) get a moment to
        # finish: a job left reserved by nobody waits out its whole ttr.
        if self._background_tasks:
            done, pending = await asyncio.wait(
                list(self._background_tasks), timeout=GIVE_BACK_GRACE_S
            )
            failed = [t for t in done if not t.cancelled() and t.exception() is not None]
            for t in failed:
                log.error("give-back failed: %s", t.exception())
            clean = clean and not pending and not failed
        background = list(self._background_tasks)
        for t in background:
            t.cancel()
        await asyncio.gather(*background, return_exceptions=True)  # nothing may outlive the hub
        await self.notices.close()
        return clean
