"""Checks that a queue's Redis structures agree exactly: every job in one place, nothing
dangling, counters exact. Used after every guarantee test and by the history command.

``r`` is a blocking redis-py client with ``decode_responses`` off (replies are bytes): typed
``Any`` because redis-py's reply types are unions these checks narrow by asserting."""

from __future__ import annotations

from typing import Any

from cluster_dq.clock import now_ms
from cluster_dq.engine.steps import REMEMBER_ACKED_MS
from cluster_dq.history import BUCKET_MS, KEEP_MS
from cluster_dq.keys import BUCKET_WIDTH_MS, QueueKeys
from cluster_dq.models import WHEEL_SHORT_FIELD, Record, id_due_ms, id_lane, wheel_job


def check_queue(r: Any, ns: str, q: str) -> dict[str, int]:
    k = QueueKeys(ns, q)
    # One round trip for the queue's structures (all in its slot), one for its wheel buckets.
    p = r.pipeline(transaction=False)
    states = ("ready", "reserved", "delayed", "dead")
    for name in states:
        p.zrange(getattr(k, name), 0, -1)
    p.hgetall(k.jobs)
    p.hkeys(k.leases)
    p.zrange(k.expire, 0, -1)
    p.hgetall(k.notes)
    p.zrange(k.wheel, 0, -1)
    p.hgetall(k.meta)
    for name in ("delayed", "reserved", "expire"):
        p.zrange(getattr(k, name), 0, 0, withscores=True)
    p.zrange(k.held, 0, -1)
    p.hgetall(k.groups)
    p.zrange(k.group_wake, 0, -1, withscores=True)
    p.hgetall(k.group_conf)
    got = p.execute()
    members, (records, held, expiring, notes, wheel, meta) = got[:4], got[4:10]
    heads, (held_back, groups, wakes, gconf) = got[10:13], got[13:]
    heads.append(wakes[:1])  # a group's rate wake-up is an event of the queue
    zsets = {name: set(m) for name, m in zip(states, members, strict=True)}
    # a job its group holds back (HELD, `<g>\0<id>`) is ready: in READY's place
    held_ids = {m.split(b"\0", 1)[1]: m.split(b"\0", 1)[0] for m in held_back}
    assert len(held_ids) == len(held_back), "a job is held back twice"
    assert not held_ids.keys() & zsets["ready"], "a job is in READY and held back"
    for member, g in held_ids.items():
        rec = records.get(member)
        assert rec is not None and Record.unpack(rec).group == g.decode(), (
            f"held back in group {g!r}: {member!r} is not that group's job"
        )
    _check_held_can_go(held_ids, zsets["ready"], records, groups, gconf, wakes)
    zsets["ready"] |= held_ids.keys()
    jobs = set(records)
    union: set[bytes] = set()
    for name, in_state in zsets.items():
        assert not (union & in_state), f"a job is in {name} and another state"
        union |= in_state
    assert union == jobs, f"jobs hash {len(jobs)} != states {len(union)}"
    assert set(held) == zsets["reserved"], "every reservation has a lease, and nothing else has one"
    expire = set(expiring)
    assert expire <= jobs - zsets["dead"], "expire index holds a dead or missing job"
    for member, rec in records.items():
        exp = int.from_bytes(rec[6:12], "big")
        if member not in zsets["dead"] and exp:
            assert member in expire, "a finite-ttl job is missing from the expire index"
    _check_dedup_keys(notes, records)
    for field, note in notes.items():
        # no NOTES field outlives its job: `<id>` (death, last error), `p:<id>` (progress);
        # `k:<key>` is checked above
        if field.startswith(b"k:"):
            continue
        owner = field[2:] if field.startswith(b"p:") else field
        assert owner in jobs, f"a NOTES field outlives its job: {field!r}"
        if not field.startswith(b"p:"):
            assert len(note) >= 7, f"a malformed note: {field!r}"
            died = note[0] != 0 or int.from_bytes(note[1:7], "big") != 0
            assert died == (field in zsets["dead"]), f"a death noted of a live job: {field!r}"
            assert died or len(note) > 7, f"an empty note kept: {field!r}"
    for member in zsets["dead"]:
        note = notes.get(member)
        assert note is not None and note[0] != 0, f"a dead job without its death: {member!r}"
    buckets = {b.decode() for b in wheel}
    p = r.pipeline(transaction=False)
    for b in sorted(buckets):
        p.hgetall(k.bucket(b))
    in_wheel = 0
    wheel_ids: set[bytes] = set()
    wheel_records: list[bytes] = []
    for b, entries in zip(sorted(buckets), p.execute() if buckets else [], strict=True):
        fields = list(entries)
        wheel_records += [wheel_job(b, f, v)[1] for f, v in entries.items()]
        assert fields, f"wheel index names empty bucket {b}"
        window, lane = (int(x) for x in b.split(":"))
        if b"s" in meta:  # META.s: every entry of the wheel is short
            assert all(len(f) == WHEEL_SHORT_FIELD for f in fields), f"META.s, a whole entry in {b}"
        ids = {wheel_job(b, f, entries[f])[0] for f in fields}
        assert len(ids) == len(fields), f"a job rests twice in bucket {b} (short and whole)"
        for m in ids:
            assert len(m) == 16 and id_due_ms(m) // BUCKET_WIDTH_MS == window, (
                f"a job {m!r} in the wrong window's bucket {b}"
            )
            assert id_lane(m) == lane, f"a job {m!r} in the wrong lane's bucket {b}"
        assert not ids & jobs, f"a job of bucket {b} is in the jobs hash too"
        in_wheel += len(ids)
        wheel_ids.update(ids)
    for note in notes:  # `<id>`, `p:<id>` (a client id has no ':'), `k:<key>`
        if note.startswith(b"k:"):
            continue
        owner = note[2:] if note.startswith(b"p:") else note
        assert owner in jobs or owner in wheel_ids, f"notes field {note!r} outlived its job"
    stray = {x.decode() for x in r.keys(k.bucket("*"))} - {k.bucket(b) for b in buckets}
    assert not stray, f"buckets missing from the wheel index: {stray}"
    w = int(meta.get(b"w") or 0)
    assert w == in_wheel, f"meta.w {w} != jobs in buckets {in_wheel}"
    assert set(meta) <= {b"w", b"next", b"s"}
    _check_groups(groups, records, zsets["reserved"], wheel_records)
    marked = meta.get(b"next")
    if marked is not None:  # the pump's and the multi-queue consume's promise: no event earlier
        for head in heads:
            if head:
                assert int(marked) <= int(head[0][1]), f"meta.next {int(marked)} > an event {head}"
    if w == 0 and not jobs:
        assert not meta, "an empty queue keeps its meta hash"
    return {"wheel": in_wheel, **{n: len(m) for n, m in zsets.items()}}


def queue_keys(r: Any, ns: str, q: str) -> list[bytes]:
    """The queue's keys but those that must be expiring: the memory of recently acked ids,
    the queue's history buckets (docs/dashboard.md: they outlive its jobs and a destroy, at
    most a day), and its keyed hash when nothing in it is still kept but a debounce's
    replacements (kept for a repeat of its call as long as acked ids are remembered; the
    entries past their time go with the hash) and it goes within that time. So a queue whose
    jobs are all gone leaves nothing behind for long."""
    qk = QueueKeys(ns, q)
    acked, history = qk.acked.encode(), qk.history(0).encode().rsplit(b":", 1)[0] + b":"
    pattern = f"*{{{ns}/{q}}}*"
    if hasattr(r, "get_node_from_key"):  # a Cluster client: KEYS on the node of the queue's
        # slot (redis-py sends it to one node of its choice otherwise, which found nothing)
        found = sorted(r.keys(pattern, target_nodes=r.get_node_from_key(qk.meta)))
    else:
        found = sorted(r.keys(pattern))
    if acked in found:
        assert 0 < r.pttl(acked) <= REMEMBER_ACKED_MS, "the acked-ids memory must expire"
    buckets = {k for k in found if k.startswith(history) and k[len(history) :].isdigit()}
    for key in buckets:
        assert 0 < r.pttl(key) <= KEEP_MS + BUCKET_MS, f"history {key!r} must expire in a day"
    keyed = {qk.keyed.encode(), qk.keyed_due.encode()} & set(found)
    now = now_ms()
    replacements = all(
        f.startswith(b"r:") or int.from_bytes(v[:6], "big") <= now
        for f, v in r.hgetall(qk.keyed).items()
    )
    soon = {k for k in keyed if replacements and 0 < r.pttl(k) <= REMEMBER_ACKED_MS}
    return [k for k in found if k != acked and k not in buckets and k not in soon]


def _check_groups(
    groups: dict[bytes, bytes],
    records: dict[bytes, bytes],
    reserved: set[bytes],
    wheel_records: list[bytes],
) -> None:
    """GROUPS counts exactly (lua/lib/groups.lua): `n:<g>` the group's jobs in every state and
    the wheel, `r:<g>` its reserved ones, each absent at 0; `t:<g>` (`<tag>` or `<tag>
    <period>`) only while it has jobs, its period no later than the queue's; `e` (the busy
    period) only while a group has jobs."""
    size: dict[str, int] = {}
    busy: dict[str, int] = {}
    for member, rec in records.items():
        g = Record.unpack(rec).group
        if g is not None:
            size[g] = size.get(g, 0) + 1
            if member in reserved:
                busy[g] = busy.get(g, 0) + 1
    for rec in wheel_records:
        g = Record.unpack(rec).group
        if g is not None:
            size[g] = size.get(g, 0) + 1
    found: dict[bytes, dict[str, int]] = {b"n": {}, b"r": {}, b"t": {}}
    period = int(groups.get(b"e", 0))
    for f, v in groups.items():
        if f == b"e":
            continue
        kind, _, name = f.partition(b":")
        assert kind in found and name, f"a stray field in the groups hash: {f!r}"
        if kind == b"t":
            tag, _, p = v.partition(b" ")
            assert int(p or 0) <= period, f"group {name!r}'s tag of a later period than {period}"
            v = tag
        found[kind][name.decode()] = int(v)
    assert found[b"n"] == size, f"group sizes {found[b'n']} != jobs by group {size}"
    assert found[b"r"] == busy, f"group reserved counts {found[b'r']} != reserved {busy}"
    assert set(found[b"t"]) <= set(size), "a group's fair tag outlives its jobs"
    assert b"e" not in groups or size, "the busy period outlives the groups' jobs"


def _check_held_can_go(
    held: dict[bytes, bytes],
    ready: set[bytes],
    records: dict[bytes, bytes],
    groups: dict[bytes, bytes],
    gconf: dict[bytes, bytes],
    wakes: list[tuple[bytes, float]],
) -> None:
    """Liveness: a group holding jobs back is paused, or will let one go by itself: its rate's
    wake-up is registered, or its concurrency limit is taken by jobs reserved or in READY
    (each of those, reserved or leaving READY, hands its turn to a held one). Else its held
    jobs would wait for ever with room to run."""
    waking = {g for g, _ in wakes}
    in_ready: dict[bytes, int] = {}
    for member in ready:
        name = Record.unpack(records[member]).group
        if name is not None:
            in_ready[name.encode()] = in_ready.get(name.encode(), 0) + 1
    for g in set(held.values()):
        if gconf.get(b"p:" + g) == b"1" or g in waking:
            continue
        limit = gconf.get(b"c:" + g)
        busy = int(groups.get(b"r:" + g, 0)) + in_ready.get(g, 0)
        assert limit is not None and busy >= int(limit), (
            f"group {g!r} holds jobs back with room to run them (limit {limit!r}, "
            f"{busy} reserved or ready) and no wake-up: they would wait for ever"
        )
    for w in waking:
        assert int(groups.get(b"n:" + w, 0)) > 0, f"a wake-up of group {w!r}, which has no job"


def _check_dedup_keys(notes: dict[bytes, bytes], records: dict[bytes, bytes]) -> None:
    """A simple or debounce dedup key (`k:<key>` -> the job holding it) names a job that exists
    and whose record carries that key (lua/publish_keyed.lua; drop in lua/lib/jobs.lua takes
    the key away with the job it names)."""
    for field, member in notes.items():
        if not field.startswith(b"k:"):
            continue
        rec = records.get(member)
        assert rec is not None, f"dedup key {field[2:]!r} names a job that is gone"
        carried = Record.unpack(rec).dedup_key
        assert carried == field[2:].decode(), (
            f"dedup key {field[2:]!r} names job {member!r}, whose record carries {carried!r}"
        )
