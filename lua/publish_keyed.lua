#!lua
--[[
  Publishes one request's jobs under a dedup key or an Idempotency-Key (or both), in one step:
  looks the keys up, then publishes, replaces the key's waiting job (debounce) or answers what
  the keys hold, and records the keys with the outcome. Its jobs never rest in a wheel bucket,
  so a dedup key's job is always found in JOBS. Arguments are validated before the call.
  Where the keys live: a simple or debounce key in NOTES (`k:<key>` -> the member of the job
  holding it, whose record carries the key: flag 8), leaving with the job (drop in
  lib/jobs.lua); a dead job's is taken over by the next publish under the key that makes a job
  (a throttle one drops it: revived, the dead job does not hold it again); a throttle window
  and an Idempotency-Key's answer in KEYED, each kept until its time, trimmed a bounded number
  per call (KEYED_DUE) and expiring whole after the last.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17] keyed: HASH `t:<dedup key>` -> a throttle window (`>I6` until ms, the job's member);
    `i:<idempotency key>` -> a request's answer (`>I6` until ms, 16-byte fingerprint, msgpack);
    `r:<member>` -> the job a debounce whose job 1 was that member replaced (`>I6` until ms,
    the job's member), kept remember_acked ms: a repeat of that call after a lost reply answers
    it, whatever became of the job, and makes no second one
  KEYS[18] keyed_due: ZSET the fields of KEYED -> until when each is kept (ms)
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] notify: the queue's notify channel
  ARGV[3] remember_acked: how long acked ids are remembered (ms)
  ARGV[4..] requests...: one or more requests (concurrent ones share a call: group commit),
    each as 7 values and its jobs: dedup_key ('' for none), dedup_mode (1 simple, 2 throttle,
    3 debounce), dedup_until (a throttle window's end, ms), idem_key ('' for none),
    fingerprint (16 bytes naming the request: its query and body), idem_until (until when the
    answer is kept, ms), n (its number of jobs), then one value per job, packed as publish's
    (its bucket index 0; in place of `into`, 1 when the caller made its id up for this call
    alone, 0 for a client's id, which names no one call). Each is done in turn, as if alone: a later one sees what an
    earlier one wrote (two under one key: the second finds the first's job).
  Returns: per request, {status, replayed, dedup, lowered, code_1 .. code_n, member_1 ..
    member_n}
    status: OK; FULL (the queue's max_size: nothing written); FORBIDDEN (debounce: the key's
    job is reserved or dead, its state in `dedup` and its code and member after; nothing
    written; not when this is a repeat of the call that made that job or replaced it (below));
    MISMATCH (the Idempotency-Key's answer is another request's; nothing written)
    replayed: 1 when this is the Idempotency-Key's answer, kept from its first call; 2 when
    that first call asked for the same job ids as this one (the caller's repeat of its own
    call, when it made them up)
    dedup: 0 (no key, or a new job holds it now), EXISTING (the holder's member and state
    answered) or REPLACED (the holder's body and due time replaced). A repeat of a call (its
    reply lost) while the key is held answers what its first attempt did, writing nothing:
    REPLACED, the job it replaced (kept in KEYED `r:<job 1>`), or EXISTING, the job 1 it made
    (an id made up for the call: the holder, present or acked lately), whatever holds the key
    code: as publish's (DUPLICATE, DELAYED, READY); lowered: as publish's; for an answer that
    may be a repeat's (the call's own job or replacement, a kept answer replayed, a client's
    job 1 id present or acked lately, a replacement made ready while META.next is its due time),
    lib/jobs.lua again_at: its first attempt's shard signal may have been lost with its reply
]]
--@include lib/codes
--@include lib/keys
--@include lib/record
--@include lib/jobs
--@include lib/acked
--@include lib/place
--@include lib/notify
local KEYED, KEYED_DUE = KEYS[FIRST_EXTRA], KEYS[FIRST_EXTRA + 1]
local now, channel, keep = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local THROTTLE, DEBOUNCE, TRIM = 2, 3, 64

-- KEYED's entries past their time go, a bounded number per call; the keys expire after the
-- last. `keyed`: whether KEYED may hold an entry (looked at once: most queues have none);
-- `wrote`: whether this call wrote one
local keyed, wrote = redis.call('EXISTS', KEYED) == 1, false
if keyed then
  local old = redis.call('ZRANGE', KEYED_DUE, '-inf', now, 'BYSCORE', 'LIMIT', 0, TRIM)
  if #old > 0 then
    redis.call('HDEL', KEYED, unpack(old))
    zrem_many(KEYED_DUE, old)
  end
end

local function keep_keyed(field, till, value)
  redis.call('HSET', KEYED, field, struct.pack('>I6', till) .. value)
  redis.call('ZADD', KEYED_DUE, till, field)
  keyed, wrote = true, true
end

local function kept(field)
  if not keyed then return false end
  local v = redis.call('HGET', KEYED, field)
  if v and struct.unpack('>I6', v) > now then return v end
  return false
end

local was_empty = redis.call('EXISTS', READY) == 0
local max_size = tonumber(redis.call('HGET', CONF, 'max_size') or '') -- the queue's; false: none
EXPIRE_LATER = {} -- the jobs' EXPIRE entries in one ZADD at the end (lib/place.lua)

-- The dedup keys' holders (NOTES `k:<key>`; false: none), read for the whole call in one
-- HMGET. GIVEN: the `k:<key>`, member pairs of the holders this call gives keys, written in one
-- HSET at its end (a key given twice: the last pair wins, as HSET sets them in order). A
-- request sees what an earlier one gave.
local HOLDER, GIVEN = {}, {}
do
  local names, at = {}, 4
  while at <= #ARGV do
    local k = ARGV[at]
    if k ~= '' and HOLDER[k] == nil then
      HOLDER[k] = false
      names[#names + 1] = k
    end
    at = at + 7 + tonumber(ARGV[at + 6])
  end
  for i = 1, #names, CHUNK do
    local fields = {}
    for j = i, math.min(i + CHUNK - 1, #names) do fields[#fields + 1] = 'k:' .. names[j] end
    local got = redis.call('HMGET', NOTES, unpack(fields))
    for j = 1, #fields do HOLDER[names[i + j - 1]] = got[j] or false end
  end
end

local function give(dkey, id)
  HOLDER[dkey] = id
  GIVEN[#GIVEN + 1] = 'k:' .. dkey
  GIVEN[#GIVEN + 1] = id
end

-- Job j of the request whose values begin at ARGV[at]: its due ms, member and record
-- (publish's packing; no bucket), and whether the caller made its id up for this call
local function job_of(at, j)
  local a = ARGV[at + 6 + j]
  local _, made, due, len, from = struct.unpack('>HBI6B', a)
  return due, string.sub(a, from, from + len - 1), string.sub(a, from + len), made == 1
end

-- The ids a request's jobs ask for, as one string: kept with an Idempotency-Key's answer, so
-- that a repeat of the very call that made it (the same ids, which the caller made up for
-- that call alone) is told apart from another request's repeat.
local function own_ids(at, n)
  local ids = {}
  for j = 1, n do
    local _, id = job_of(at, j)
    ids[j] = id
  end
  return table.concat(ids, '\0')
end

-- Lowers META.next to `t` if it is later: 1 when it did, or when META.next is `t` already
-- (an earlier attempt of this very call may have lowered it, its signal lost with its reply;
-- a replacement repeated finds nothing to lower).
local function lower_or_met(t)
  if lower_next(t) == 1 or next_marked() == t then return 1 end
  return 0
end

-- A debounce's job replaces the waiting `holder` (its state `st`): its body, due time and
-- expiry, and it starts afresh: the old body's progress and last error (NOTES `p:<id>`,
-- `<id>`; a waiting job has no death there) go. Returns its code (READY or DELAYED) and
-- `lowered`. Made ready while META.next is its
-- due time, it reports again_at: this may be the repeat of a call, stamped afresh past the due
-- time its first attempt set there, whose signal was lost (a client's id names no one call).
local function replace(holder, st, due, rec)
  local old, lowered, code = redis.call('HGET', JOBS, holder), 0, CODE.READY
  if st == CODE.READY then unready(holder, old, now) else redis.call('ZREM', DELAYED, holder) end
  EXPIRE_LATER[holder] = nil
  redis.call('ZREM', EXPIRE, holder)
  redis.call('HSET', JOBS, holder, rec)
  redis.call('HDEL', NOTES, holder, 'p:' .. holder)
  count_group(group_of(old), -1)
  count_group(group_of(rec), 1)
  if due <= now then
    make_ready(holder, rec, due)
    if next_marked() == due then lowered = again_at() end
  else
    delay_until(holder, due)
    lowered, code = lower_or_met(due), CODE.DELAYED
  end
  local e = expire_at(rec)
  if e > 0 then
    EXPIRE_LATER[holder] = e
    lowered = math.max(lowered, lower_or_met(e))
  end
  return code, lowered
end

-- The job a debounce whose job 1 is `own` replaced, when this very call ran before (its
-- reply lost: the engine repeats it with the same ids) and that job was taken, or acked, since;
-- else false. Each replacement by a call whose job 1's id was made up for it (`made`: no other
-- call has it; a client's id names no one call) is kept in KEYED (`r:<own>`) for `keep` ms,
-- written at the call's end in one HSET and one ZADD (only a later call reads it).
local REPLACED, REPLACED_DUE = {}, {}

local function replaced_before(own, made)
  local r = made and kept('r:' .. own)
  return r and string.sub(r, 7)
end

local function keep_replaced(own, holder)
  if keep <= 0 then return end -- (acked ids not remembered either: a repeat may make one again)
  local field, till = 'r:' .. own, now + keep
  REPLACED[#REPLACED + 1] = field
  REPLACED[#REPLACED + 1] = struct.pack('>I6', till) .. holder
  REPLACED_DUE[#REPLACED_DUE + 1] = till
  REPLACED_DUE[#REPLACED_DUE + 1] = field
end

-- One request, its 7 values and its jobs from ARGV[at]: its reply, and where the next begins.
local function request(at)
  local dkey, ikey, n = ARGV[at], ARGV[at + 3], tonumber(ARGV[at + 6])
  local nxt = at + 7 + n
  if ikey ~= '' then
    local got = kept('i:' .. ikey)
    if got then
      if string.sub(got, 7, 22) ~= ARGV[at + 4] then return {CODE.MISMATCH, 0, 0, 0}, nxt end
      local out = cmsgpack.unpack(string.sub(got, 23))
      out[2] = out[2] == own_ids(at, n) and 2 or 1 -- (2: kept by a call with these very ids)
      out[4] = again_at() -- a repeat (the engine's or the client's)
      return out, nxt
    end
  end

  -- The job holding the dedup key: a simple or debounce key's while it exists and is not dead,
  -- else a throttle window's while it lasts (whatever became of its job)
  local mode, held, holder = tonumber(ARGV[at + 1]), false, false
  if dkey ~= '' then
    held = HOLDER[dkey]
    if held and redis.call('HEXISTS', JOBS, held) == 1 and not redis.call('ZSCORE', DEAD, held) then
      holder = held
    elseif keyed then
      local t = kept('t:' .. dkey)
      if t then holder = string.sub(t, 7) end
    end
  end
  -- Job 1: its due time, id, record, and whether its id was made up for this very call
  local due, own, rec, made = false, false, false, false
  if n > 0 then due, own, rec, made = job_of(at, 1) end

  -- This very call's repeat (its first attempt's reply lost) is answered as that attempt was,
  -- whatever became of its job or holds the key now, writing nothing (never a 409 for a change
  -- made, a body twice, nor a job replaced again):
  -- `prior`, a debounce whose first attempt replaced a job (kept in KEYED `r:<job 1>`): that
  -- job, REPLACED; `mine`, a call whose first attempt made job 1 (the key's holder, or present
  -- or acked lately while another job took the key): that job as it is now, EXISTING (the
  -- engine tells its own job `new`). A client's id names no one call: holding the key, the
  -- answer is what any request with that id gets, but the request is `again` (maybe a
  -- repeat); present or acked lately while another job holds the key, the request is a
  -- duplicate of that job, `mine` too (a debounce never puts its body on another job, nor is
  -- refused for it). Either way it reports lowered: the first attempt's signal may be lost.
  local prior, mine, again = false, false, false
  if mode == DEBOUNCE and own then prior = replaced_before(own, made) end
  if not prior and holder and own then
    if holder == own then
      if made then mine = own else again = true end
    elseif redis.call('HEXISTS', JOBS, own) == 1 or acked_lately(own, now, keep) then
      mine = own
    end
  end

  -- out: {status, replayed, dedup, lowered, code_1 .. code_n, member_1 .. member_n}
  local out
  if prior or mine then -- (lowered: the first attempt's signal to the shard was never sent)
    local job = prior or mine
    local st = redis.call('HEXISTS', JOBS, job) == 1 and state_of(job) or CODE.NOT_FOUND
    out = {CODE.OK, 0, prior and CODE.REPLACED or CODE.EXISTING, again_at(), st, job}
  elseif holder then
    -- A debounce replaces the key's job while it waits, and is refused once it is reserved or
    -- dead, unless that job is job 1 itself (a client's id, which any request may send:
    -- answered as the job it is, EXISTING)
    local st = redis.call('HEXISTS', JOBS, holder) == 1 and state_of(holder)
    local waiting = st == CODE.READY or st == CODE.DELAYED
    if st and mode == DEBOUNCE and not waiting and holder ~= own then
      return {CODE.FORBIDDEN, 0, st, again and again_at() or 0, st, holder}, nxt
    end
    if st and mode == DEBOUNCE and waiting then
      local code, lowered = replace(holder, st, due, rec)
      if again then lowered = again_at() end
      if made then keep_replaced(own, holder) end
      out = {CODE.OK, 0, CODE.REPLACED, lowered, code, holder}
      if HOLDER[dkey] ~= holder then give(dkey, holder) end -- a throttle window's job: its record carries the key now
    else
      out = {CODE.OK, 0, CODE.EXISTING, again and again_at() or 0, st or CODE.NOT_FOUND, holder}
    end
  else
    -- The queue's max_size: all the jobs or none, as a bulk publish (a duplicate does not count)
    if max_size then
      local room = max_size - redis.call('HLEN', JOBS) - tonumber(redis.call('HGET', META, 'w') or '0')
      local new = 0
      for j = 1, n do
        local _, id = job_of(at, j)
        if redis.call('HEXISTS', JOBS, id) == 0 and not acked_lately(id, now, keep) then
          new = new + 1
        end
      end
      if new > 0 and new > room then return {CODE.FULL, 0, 0, 0}, nxt end
    end
    out = {CODE.OK, 0, 0, 0}
    local there = false -- a job there already: maybe a repeat (lib/jobs.lua again_at)
    for j = 1, n do
      local due_j, id, rec_j = job_of(at, j)
      local code, low = place(id, due_j, rec_j, false, '', 0, now, 0, 0, 0, keep)
      out[4 + j], out[4 + n + j] = code, id
      if low > out[4] then out[4] = low end
      there = there or code == CODE.DUPLICATE
    end
    if there then out[4] = again_at() end
    if dkey ~= '' and out[5] ~= CODE.DUPLICATE then
      local id = out[5 + n]
      if mode == THROTTLE then
        keep_keyed('t:' .. dkey, tonumber(ARGV[at + 2]), id)
        if held then -- a dead job's key, taken over: revived, that job does not hold it again
          HOLDER[dkey] = false
          redis.call('HDEL', NOTES, 'k:' .. dkey)
        end
      else
        give(dkey, id) -- its record carries the key (drop)
      end
    end
  end

  if ikey ~= '' then
    local saved = {out[1], own_ids(at, n), out[3], 0}
    for j = 5, #out do saved[j] = out[j] end
    keep_keyed('i:' .. ikey, tonumber(ARGV[at + 5]), ARGV[at + 4] .. cmsgpack.pack(saved))
  end
  return out, nxt
end

local replies, at = {}, 4
while at <= #ARGV do
  replies[#replies + 1], at = request(at)
end
write_pairs('HSET', NOTES, GIVEN)
flush_expiring()
if #REPLACED > 0 then
  write_pairs('HSET', KEYED, REPLACED)
  write_pairs('ZADD', KEYED_DUE, REPLACED_DUE)
  wrote = true
end
if wrote then
  local last = redis.call('ZRANGE', KEYED_DUE, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYED, last[2])
  redis.call('PEXPIREAT', KEYED_DUE, last[2])
end
notify(channel, was_empty)
return replies
