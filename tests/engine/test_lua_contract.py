"""The seam between Python and Lua: every script's header against the Python side.

Each ``lua/*.lua`` starts with ``#!lua`` and a header in one format (lua/README.md):

    KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
    KEYS[11..] buckets...: a variadic tail (the name ends in ``...``)
    ARGV[1] now: one argument
    ARGV[8..] jobs...: one value per job (or "K values per job": K arguments each)
    Returns: ...

Checked here: the names and order of every script's KEYS and ARGV against the table that
the operations build its calls with (engine/signatures.py); the number of KEYS and ARGV of every
call the operations actually send (recorded on a real Redis); ``ReplyCode`` against
``lua/lib/codes.lua``; the queue's fixed key order in keys.py against lib/keys.lua; and that
every script and lib includes the libs it calls, and no other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from cluster_dq.clock import now_ms
from cluster_dq.engine import commands as ops
from cluster_dq.engine import schedules as schedule_ops
from cluster_dq.engine import control
from cluster_dq.engine.control import DeadFilter
from cluster_dq.engine.aio import AsyncEngine
from cluster_dq.engine.commands import FIRST_EXTRA_KEY, Call, Eval
from cluster_dq.engine.replies import ReplyCode
from cluster_dq.errors import Fenced
from cluster_dq.engine.scripts import load_all, lua_codes, lua_dir
from cluster_dq.engine.signatures import QUEUE, SIGNATURES
from cluster_dq.keys import BUCKET_WIDTH_MS, QueueKeys, shard_of
from cluster_dq.models import DEATH_REASONS, WHEEL_SHORT_FIELD, JobSpec
from cluster_dq.schedules import Schedule, Template

LUA = lua_dir()
SCRIPTS = sorted(p.stem for p in LUA.glob("*.lua"))
FIXED = QueueKeys("ns", "q").all_fixed()
_ITEM = re.compile(r"^\s*(KEYS|ARGV)\[(\d+)(?:\.\.(\d*))?\]\s+([a-z_]+(?:\.\.\.)?):\s+(.*)$")
_HEADER = re.compile(r"\A#!lua[^\n]*\n--\[\[\n(.*?)\n\]\]\n", re.DOTALL)


@dataclass
class Item:
    name: str
    first: int  # 1-based index
    last: int | None  # None: variadic (to the end)
    doc: str

    @property
    def variadic(self) -> bool:
        return self.last is None

    @property
    def stride(self) -> int:
        m = re.search(r"(\d+) values per job", self.doc)
        return int(m.group(1)) if m else 1


@dataclass
class Header:
    keys: list[Item]
    argv: list[Item]
    returns: str


def parse_header(text: str) -> Header:
    m = _HEADER.match(text)
    assert m, "no '#!lua' line followed by a --[[ ... ]] header"
    out: dict[str, list[Item]] = {"KEYS": [], "ARGV": []}
    returns = ""
    lines = m.group(1).splitlines()
    for i, line in enumerate(lines):
        item = _ITEM.match(line)
        if item:
            kind, first, rng, name, doc = item.groups()
            last = int(first) if rng is None else (int(rng) if rng else None)
            if rng is not None and rng and name != QUEUE:
                raise AssertionError(f"a closed range is only for the queue's fixed keys: {line!r}")
            if (last is None) != name.endswith("..."):
                raise AssertionError(
                    f"a variadic item is KEYS/ARGV[n..] and its name ends in '...': {line!r}"
                )
            for more in lines[i + 1 :]:  # continuation lines are indented further
                if not more.startswith("    "):
                    break
                doc += " " + more.strip()
            out[kind].append(Item(name, int(first), last, doc))
        elif line.strip().startswith(("KEYS", "ARGV")):
            raise AssertionError(f"not in the header format: {line!r}")
        elif line.strip().startswith("Returns:"):
            returns = " ".join(
                [line.strip()] + [x.strip() for x in lines[i + 1 :] if x.startswith("    ")]
            )
    assert returns, "no 'Returns:' line"
    for kind, items in out.items():
        expect = 1
        for n, it in enumerate(items):
            assert it.first == expect, f"{kind}[{it.first}] {it.name}: expected index {expect}"
            if it.variadic:
                assert n == len(items) - 1, f"{kind} {it.name}: only the last item may be variadic"
            else:
                expect = it.last + 1  # type: ignore[operator]
    return Header(out["KEYS"], out["ARGV"], returns)


HEADERS = {name: parse_header((LUA / f"{name}.lua").read_text()) for name in SCRIPTS}


def lua_queue_keys() -> tuple[list[str], int]:
    text = (LUA / "lib" / "keys.lua").read_text()
    m = re.search(r"^local ([A-Z_,\s]+?) =\s*\n?\s*((?:KEYS\[\d+\],?\s*)+)", text, re.MULTILINE)
    assert m, "lib/keys.lua: no 'local META, ... = KEYS[1], ...' line"
    names = [n.strip() for n in m.group(1).split(",")]
    indices = [int(i) for i in re.findall(r"KEYS\[(\d+)\]", m.group(2))]
    assert indices == list(range(1, len(names) + 1)), f"lib/keys.lua binds {names} to KEYS{indices}"
    first_extra = re.search(r"^local FIRST_EXTRA = (\d+)$", text, re.MULTILINE)
    assert first_extra
    return [n.lower() for n in names], int(first_extra.group(1))


# -- static checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_header_names_the_keys_and_arguments_python_passes(name: str) -> None:
    header, sig = HEADERS[name], SIGNATURES.get(name)
    assert sig is not None, f"{name}.lua has no entry in engine/signatures.py"
    assert [k.name for k in header.keys] == list(sig.keys), (
        f"{name}: KEYS of the header vs signatures.py"
    )
    assert [a.name for a in header.argv] == list(sig.argv), (
        f"{name}: ARGV of the header vs signatures.py"
    )
    for k in header.keys:
        if k.name == QUEUE:
            assert (k.first, k.last) == (1, len(FIXED)), (
                f"{name}: the queue's fixed keys are KEYS[1..{len(FIXED)}]"
            )


def test_every_signature_has_a_script() -> None:
    assert set(SIGNATURES) == set(SCRIPTS) == set(load_all())


def test_reply_codes_agree() -> None:
    """lib/codes.lua, as the loader reads it to fold CODE.X into numbers, is ReplyCode."""
    assert lua_codes(LUA) == {c.name: c.value for c in ReplyCode}
    assert not [name for name, s in load_all().items() if "CODE." in s.source], (
        "a CODE.X left unfolded"
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_codes_a_script_names_exist(name: str) -> None:
    """Every CODE.X a script uses, and every code named in its Returns line, is a ReplyCode."""
    text = (LUA / f"{name}.lua").read_text()
    used = set(re.findall(r"\bCODE\.([A-Z_]+)", text))
    if used:
        assert "--@include lib/codes" in text, f"{name} uses CODE without '--@include lib/codes'"
    libs = re.findall(r"^--@include (lib/\w+)$", text, re.MULTILINE)
    if len(libs) > 1:  # the libs fold CODE.X too: lib/codes comes first
        assert libs[0] == "lib/codes", f"{name}: --@include lib/codes before {libs[0]}"
    named = set(
        re.findall(
            r"\b(?:LEASE_[A-Z_]+|NOT_FOUND|DUPLICATE|FENCED|WHEEL|EXPIRED|OK)\b",
            HEADERS[name].returns,
        )
    )
    named.discard("LEASE_")
    known = {c.name for c in ReplyCode}
    assert used <= known and {n for n in named if not n.endswith("_")} <= known
    assert "error_reply" not in text, f"{name}: an expected outcome is a code, not an error reply"


def test_the_queue_key_order_agrees() -> None:
    names, first_extra = lua_queue_keys()
    suffixes = [k.rsplit(":", 1)[1] for k in FIXED]
    assert names == suffixes, (
        "lib/keys.lua and QueueKeys.all_fixed (keys.py) order the keys differently"
    )
    assert first_extra == FIRST_EXTRA_KEY == len(FIXED) + 1


def _lua_code(text: str) -> str:
    """Lua source without its comments and string literals (what names it really uses)."""
    text = re.sub(r"--\[\[.*?\]\]", "", text, flags=re.DOTALL)
    lines = (re.sub(r"\"[^\"\n]*\"|'[^'\n]*'", "''", line) for line in text.split("\n"))
    return "\n".join(line.split("--")[0] for line in lines)


LIB_DEF = re.compile(r"^local function (\w+)|^local ([A-Za-z_][\w,\s]*?)\s*=", re.MULTILINE)


def _defines(text: str) -> set[str]:
    return {n.strip() for f, c in LIB_DEF.findall(text) for n in (f or c).split(",")}


def test_every_script_and_lib_includes_what_it_calls_and_nothing_else() -> None:
    """BullMQ's way (one function per include): a script inlines the libs whose names it uses,
    each lib the libs it uses itself, so an edit to a lib changes only the scripts that call
    it. Checked on the source: each direct include is used, and each lib name used is
    included (directly or through a lib). The loader inlines every lib once, its own
    includes first, so every name is defined above its first use (checked on the result)."""
    libs = {p.stem: p.read_text() for p in (LUA / "lib").glob("*.lua") if p.stem != "codes"}
    owner = {n: lib for lib, text in libs.items() for n in _defines(_lua_code(text))}

    def includes(text: str) -> list[str]:
        return [m for m in re.findall(r"^--@include lib/(\w+)$", text, re.MULTILINE)]

    def closure(names: list[str]) -> set[str]:
        out: set[str] = set()
        todo = [n for n in names if n != "codes"]
        while todo:
            lib = todo.pop()
            if lib not in out:
                out.add(lib)
                todo += [n for n in includes(libs[lib]) if n != "codes"]
        return out

    units = {f"{n}.lua": (LUA / f"{n}.lua").read_text() for n in SCRIPTS}
    units.update({f"lib/{n}.lua": t for n, t in libs.items()})
    for unit, text in units.items():
        code = _lua_code(text)
        own = _defines(code)
        used = {owner[w] for w in set(re.findall(r"\b\w+\b", code)) if w in owner} - {
            owner[n] for n in own if n in owner and unit == f"lib/{owner[n]}.lua"
        }
        direct = [n for n in includes(text) if n != "codes"]
        assert set(direct) <= used, f"{unit} includes lib(s) it does not use: {set(direct) - used}"
        assert used <= closure(direct), (
            f"{unit} uses lib(s) it does not include: {used - closure(direct)}"
        )
    for name, script in load_all().items():
        code = _lua_code(script.source)
        for lib_name, lib in owner.items():
            uses = [m.start() for m in re.finditer(rf"\b{lib_name}\b", code)]
            if uses:
                first_def = re.search(rf"^local (?:function )?[\w,\s]*?\b{lib_name}\b", code, re.M)
                assert first_def and first_def.start() <= uses[0], f"{name}: {lib_name} ({lib})"


def test_the_wheel_entry_form_agrees() -> None:
    """lib/wheel.lua and models.wheel_job read the same bucket width and short field size (the
    form itself is compared on real Redis in tests/engine/test_wheel_entries.py)."""
    text = (LUA / "lib" / "wheel.lua").read_text()
    width = re.search(r"^local BUCKET_WIDTH = (\d+)", text, re.MULTILINE)
    short = re.search(r"^local SHORT = (\d+)", text, re.MULTILINE)
    assert width and short
    assert int(width.group(1)) == BUCKET_WIDTH_MS
    assert int(short.group(1)) == WHEEL_SHORT_FIELD


def test_the_readme_lists_every_script_and_code() -> None:
    readme = (LUA / "README.md").read_text()
    for name in SCRIPTS:
        assert re.search(rf"^\| `{name}`( \(read-only\))? \|", readme, re.MULTILINE), (
            f"lua/README.md: {name}"
        )
    for c in ReplyCode:
        assert re.search(rf"\|\s*`{c.name}`\s*\|\s*{c.value}\s*\|", readme), (
            f"lua/README.md: code {c.name}"
        )


# -- every call the operations send, on a real Redis ------------------------------------------


def check_call(call: Eval) -> None:
    header = HEADERS[call.script]
    if call.stamped:  # a repeat puts its clock in ARGV[1] (Eval.restamped)
        assert header.argv[0].name == "now", f"{call.script}: stamped, but ARGV[1] is not now"
    _check_counts(call.script, "KEYS", header.keys, list(call.keys), None)
    _check_counts(call.script, "ARGV", header.argv, list(call.args), header.argv)


def _check_counts(
    script: str, kind: str, items: list[Item], got: list[Any], argv: list[Item] | None
) -> None:
    fixed = sum(it.last - it.first + 1 for it in items if it.last is not None)
    tail = items[-1] if items and items[-1].variadic else None
    if tail is None:
        assert len(got) == fixed, f"{script}: {kind} has {len(got)} values, the header {fixed}"
        return
    assert len(got) >= fixed, f"{script}: {kind} has {len(got)} values, the header at least {fixed}"
    rest = len(got) - fixed
    assert rest % tail.stride == 0, f"{script}: {kind} {tail.name} is {tail.stride} values per job"
    if argv is not None:
        n = [i for i, it in enumerate(argv) if it.name == "n"]
        if n:
            assert rest == tail.stride * int(got[n[0]]), f"{script}: n does not match {tail.name}"


class CheckingEngine(AsyncEngine):
    seen: set[str]

    async def _call(self, call: Call) -> Any:
        if isinstance(call, Eval):
            check_call(call)
            self.seen.add(call.script)
        return await super()._call(call)

    async def _pipeline(self, calls: tuple[Call, ...]) -> list[Any]:
        for c in calls:
            if isinstance(c, Eval):
                check_call(c)
                self.seen.add(c.script)
        return await super()._pipeline(calls)


async def test_every_call_matches_its_header(engine: AsyncEngine) -> None:
    checking = CheckingEngine(engine.client, engine.config)
    checking.seen = set()
    cfg, run, t, q, min_ = checking.config, checking.run, now_ms(), "contract", 60_000
    published = await run(
        ops.publish(
            cfg,
            "ns",
            q,
            [
                JobSpec(b"ready"),
                JobSpec(b"near", delay_ms=1_000),
                JobSpec(b"wheel", delay_ms=10 * min_),
                JobSpec(b"mine", job_id="id-contract"),
            ],
            t,
        )
    )
    wheel_id = published[2].job_id
    await run(ops.publish_many(cfg, [("ns", q, [JobSpec(b"more")])], t))
    await run(ops.peek_job("ns", q, wheel_id))
    await run(ops.peek(cfg, "ns", q, "ready", t))
    await run(ops.peek(cfg, "ns", q, "dead", t))
    jobs = await run(ops.consume(cfg, "ns", [q], 1_000, 2, t))
    await run(ops.touch(cfg, "ns", q, jobs[1].job_id, 60_000, t, lease=jobs[1].lease))
    await run(ops.progress("ns", q, jobs[1].job_id, b'{"step":1}', t, jobs[1].lease))
    await run(ops.release(cfg, "ns", q, [jobs[1].job_id], 0, t, leases=[jobs[1].lease]))
    await run(
        ops.ack(
            "ns", q, [jobs[0].job_id, wheel_id], t, leases=[jobs[0].lease, None], check_only=True
        )
    )
    await run(ops.ack("ns", q, [jobs[0].job_id, wheel_id], t, results=[b'"done"', None]))
    await run(ops.lookup_job("ns", q, jobs[0].job_id, t))
    await run(ops.republish(cfg, "ns", q, "id-contract", JobSpec(b"v2", delay_ms=10 * min_), t))
    dedup, idem = ops.Dedup("dk", "throttle", min_), ops.Idempotency("ik", bytes(16))
    await run(ops.publish_keyed(cfg, "ns", q, [JobSpec(b"k")], t, dedup, idem))
    await run(ops.tick(cfg, "ns", q, t + 10 * min_ - cfg.open_lead_ms))
    await run(ops.consume(cfg, "ns", [q], 10, 10, t + 10 * min_))
    await run(ops.tick(cfg, "ns", q, t + 10 * min_ + 20))
    await run(ops.respawn(cfg, "ns", q, 1, 0, t))
    await run(ops.delete_dead("ns", q, 100))
    await run(ops.sizes_of(cfg, [f"ns/{q}"]))
    await run(ops.configure(cfg, "ns", q, [("paused", "1"), ("max_size", "100")]))
    await run(ops.configure(cfg, "ns", q, [("paused", ""), ("max_size", "")]))
    await run(
        ops.configure_group(cfg, "ns", q, "g", ops.GroupChanges(paused=True, concurrency=2), t)
    )
    await run(ops.configure_group(cfg, "ns", q, "g", ops.GroupChanges(clear_concurrency=True), t))
    await run(ops.publish(cfg, "ns", q, [JobSpec(b"late", delay_ms=min_ + BUCKET_WIDTH_MS)], t))
    a, b = await run(
        ops.publish(cfg, "ns", q, [JobSpec(b"a", delay_ms=10 * min_), JobSpec(b"b")], t)
    )
    await run(control.reschedule_job(cfg, "ns", q, a.job_id, t + 5_000, t))
    await run(control.bury("ns", q, a.job_id, "why", t))
    await run(control.bury("ns", q, b.job_id, "", t))
    await run(control.dead_page("ns", q, None, 10))
    await run(control.kick(cfg, "ns", q, a.job_id, 0, 1, 0, t))
    await run(control.redrive_dead(cfg, "ns", q, DeadFilter(), None, 10, 0, 1, 0, t))
    await run(control.purge_dead("ns", q, DeadFilter(), None, 10))
    await run(ops.publish(cfg, "ns", q, [JobSpec(b"w", delay_ms=10 * min_)], t))
    await run(control.widen_wheel(cfg, "ns", q))
    await run(ops.destroy(cfg, "ns", q))
    await run(ops.sizes(cfg, "ns", q))
    epoch = await run(ops.lead(5, "contract", 1_000))
    await run(ops.claim(5, t, 10, 1_000, epoch))
    await run(ops.reschedule(5, f"ns/{q}", None, epoch))
    with pytest.raises(Fenced):
        await run(ops.claim(5, t, 10, 1_000, epoch - 1))
    await run(ops.lead(5, "contract", 1_000, give_up=True))
    await run(ops.rate_limit("dq:{admin}:rl:contract", 1, 1_000))
    await run(ops.rate_limit("dq:{admin}:rl:contract", 1, 1_000, refund=True))
    every = Schedule("contract", Template("b"), every_ms=1_000)
    await run(schedule_ops.put(cfg, "ns", q, every, False, t))
    shard = shard_of(f"ns/{q}", cfg.shards)
    for later in (5_000, 60_000):  # fired; then found paused: out of the timers
        for member, lease in await run(schedule_ops.due(shard, t + later, 10)):
            await run(schedule_ops.fire(cfg, shard, member, lease, t + later))
        await run(schedule_ops.set_paused(cfg, "ns", q, "contract", True, t + later))
    await run(schedule_ops.set_paused(cfg, "ns", q, "contract", False, t))
    await run(schedule_ops.delete(cfg, "ns", q, "contract"))
    assert checking.seen == set(SCRIPTS), f"not exercised: {set(SCRIPTS) - checking.seen}"


def test_death_reasons_agree_with_lib_notes() -> None:
    """The reason codes of a job's death (NOTES) are written in lib/notes.lua (DIED_*) and named
    in cluster_dq/models.py (DEATH_REASONS): both must agree."""
    lib = (lua_dir() / "lib" / "notes.lua").read_text()
    found = {
        int(code): name
        for code, name in re.findall(r"^local DIED_\w+ = (\d+)\s+-- (\w+):", lib, re.MULTILINE)
    }
    assert found and found == DEATH_REASONS
