--[[
  Shared helpers, inlined by cluster_dq/engine/scripts.py right after the header of every
  script that says `--@include lib/queue` (after `--@include lib/codes`, whose CODE table they
  use). Never loaded on its own.
  Every queue script receives the same twelve fixed KEYS, in this order (the order of
  QueueKeys.all_fixed in cluster_dq/keys.py; tests/engine/test_lua_contract.py checks both agree),
  then its own extras (from KEYS[FIRST_EXTRA]).
]]
local META, WHEEL, DELAYED, READY, RESERVED, DEAD, JOBS, EXPIRE, ACKED, LEASES, CONF, NOTES =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10],
  KEYS[11], KEYS[12]
local FIRST_EXTRA = 13
local FORGET_PER_CALL = 64       -- acked ids past their memory dropped per ack (keeps it bounded)

local PRIO_SHIFT = 4398046511104 -- 2^42: ready score = (255 - priority) * 2^42 + due_ms
local CHUNK = 500                -- variadic calls are batched (Lua's unpack has a limit)

local function expire_at(rec)
  local _, e = struct.unpack('>I6I6', rec)
  return e
end

local function header(rec) -- published, expire_at, tries_left, deliveries, priority, flags
  return struct.unpack('>I6I6HHBB', rec)
end

local function with_counts(rec, tries, deliveries)
  return string.sub(rec, 1, 12) .. struct.pack('>HH', tries, deliveries) .. string.sub(rec, 17)
end

local function with_tries_expire(rec, tries, exp)
  return string.sub(rec, 1, 6) .. struct.pack('>I6H', exp, tries) .. string.sub(rec, 15)
end

local function ready_score(rec, t)
  local _, _, _, _, prio = struct.unpack('>I6I6HHB', rec)
  return (255 - prio) * PRIO_SHIFT + t
end

local function expired(rec, now)
  local e = expire_at(rec)
  return e > 0 and e <= now
end

local function zrem_many(key, ids)
  for i = 1, #ids, CHUNK do
    redis.call('ZREM', key, unpack(ids, i, math.min(i + CHUNK - 1, #ids)))
  end
end

-- Puts a job whose record is already in JOBS into READY (t = its due time).
local function make_ready(id, rec, t)
  redis.call('ZADD', READY, ready_score(rec, t), id)
end

-- Drops a job's record from JOBS and what it carries beside it in NOTES (field `<id>`: its
-- errors and death; `p:<id>`: its progress). Returns 1, or 0 when JOBS did not hold it.
local function drop(id)
  if redis.call('HDEL', JOBS, id) == 0 then return 0 end
  redis.call('HDEL', NOTES, id, 'p:' .. id)
  return 1
end

-- NOTES field `<id>`: why and when the job died and its last error, packed '>BI6' (reason
-- code, died at ms; both 0 while the job is alive) then the error text. A job with neither has
-- no field. Reason codes (cluster_dq/models.py DEATH_REASONS mirrors them):
local DIED_TTR = 1      -- ttr_expired: its last try's reservation ran out
local DIED_NACKED = 2   -- tries_exhausted: its last try was released (nacked) by the consumer
local DIED_BURIED = 3   -- buried: a consumer or an operator buried it

local function note_of(id)
  local n = redis.call('HGET', NOTES, id)
  if not n then return 0, 0, '' end
  local why, at = struct.unpack('>BI6', n)
  return why, at, string.sub(n, 8)
end

local function set_note(id, why, at, err)
  if why == 0 and err == '' then
    redis.call('HDEL', NOTES, id)
  else
    redis.call('HSET', NOTES, id, struct.pack('>BI6', why, at) .. err)
  end
end

-- Keeps `err` as the job's last error ('' = leave it as it is).
local function note_error(id, err)
  if err == '' then return end
  local why, at = note_of(id)
  set_note(id, why, at, err)
end

-- A job whose record is in JOBS, already out of its state, goes to DEAD: why, when, and its
-- last error (`err`, or the one it had when '').
local function kill(id, why, now, err)
  redis.call('ZADD', DEAD, now, id)
  redis.call('ZREM', EXPIRE, id) -- DEAD never expires (as in lmstfy)
  local _, _, had = note_of(id)
  if err == '' then err = had end
  set_note(id, why, now, err)
end

-- A job leaves DEAD alive: its death is forgotten, its last error kept.
local function forget_death(id)
  local why, _, err = note_of(id)
  if why ~= 0 then set_note(id, 0, 0, err) end
end

-- Forgets a job held in JOBS (any state but the wheel); returns the state code it was in.
local function forget(id)
  if drop(id) == 0 then return CODE.NOT_FOUND end
  redis.call('ZREM', EXPIRE, id)
  if redis.call('ZREM', READY, id) == 1 then return CODE.READY end
  if redis.call('ZREM', RESERVED, id) == 1 then
    redis.call('HDEL', LEASES, id)
    return CODE.RESERVED
  end
  if redis.call('ZREM', DELAYED, id) == 1 then return CODE.DELAYED end
  if redis.call('ZREM', DEAD, id) == 1 then return CODE.DEAD end
  return CODE.NOT_FOUND
end

-- The earliest due time of a job this call put into DELAYED (false: none), and DELAYED's
-- earliest due time when it first did (false: DELAYED was empty). `notify` tells the queue's
-- long-polls of SOONEST only when it comes before HEAD: a long-poll's timer is never later
-- than DELAYED's first due time (it heard of it, or a look that found it said so), and that
-- first due time only rises until a job comes before it; a job due after it is found by the
-- look made then, which reports the queue's next event. (Every delayed publish used to be
-- announced to every instance with a long-poll on the queue: most of those notices woke a
-- process for nothing.)
local SOONEST, HEAD = false, nil

local function delay_until(id, t)
  if HEAD == nil then
    local first = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
    HEAD = first[2] and tonumber(first[2]) or false
  end
  redis.call('ZADD', DELAYED, t, id)
  if not SOONEST or t < SOONEST then SOONEST = t end
end

-- Keeps META.w (jobs in wheel buckets) exact, and absent at zero: nothing left behind.
local function count_wheel(delta)
  if redis.call('HINCRBY', META, 'w', delta) <= 0 then redis.call('HDEL', META, 'w') end
end

-- META.next: no pump event of this queue is earlier (set exactly by next_event.lua). A script
-- that adds an earlier event lowers it and reports so (the `lowered` flag of its reply); the
-- caller then signals the shard. Returns 1 when it lowered META.next, else 0.
local function lower_next(t)
  local cur = redis.call('HGET', META, 'next')
  if not cur or t < tonumber(cur) then
    redis.call('HSET', META, 'next', t)
    return 1
  end
  return 0
end

-- An empty queue keeps no META (no jobs means no events): nothing left behind.
local function tidy()
  if redis.call('EXISTS', JOBS) == 0 and not redis.call('HGET', META, 'w') then
    redis.call('DEL', META)
  end
end

--@include lib/wheel

-- Removes a job wherever it is; returns the state code it was in (NOT_FOUND: nowhere).
local function remove_job(id, bucket, bname)
  local st = forget(id)
  if st == CODE.NOT_FOUND and bucket then
    if unwheel(bucket, bname, id) == 1 then return CODE.DELAYED end
  end
  return st
end

-- Remembers acked ids for `keep` ms: a publish of one of them repeated meanwhile (a retry
-- whose first reply was lost in a failover) is then a duplicate, not a new job. The key
-- expires `keep` ms after the last ack; older entries go a bounded number per call.
local function remember_acked(ids, now, keep)
  if keep <= 0 or #ids == 0 then return end
  local args = {}
  for _, id in ipairs(ids) do
    args[#args + 1] = now
    args[#args + 1] = id
  end
  for i = 1, #args, 2 * CHUNK do
    redis.call('ZADD', ACKED, unpack(args, i, math.min(i + 2 * CHUNK - 1, #args)))
  end
  local old = redis.call('ZRANGE', ACKED, '-inf', now - keep, 'BYSCORE', 'LIMIT', 0, FORGET_PER_CALL + #ids)
  if #old > 0 then zrem_many(ACKED, old) end
  redis.call('PEXPIRE', ACKED, keep)
end

-- DELAYED (near zset) -> READY for jobs due by `now`; expired ones vanish. Bounded by limit.
local function promote(now, limit)
  local due = redis.call('ZRANGE', DELAYED, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
  local ids, moved, gone = {}, 0, 0
  for i = 1, #due, 2 do
    local id, t = due[i], tonumber(due[i + 1])
    ids[#ids + 1] = id
    local rec = redis.call('HGET', JOBS, id)
    if rec then
      if expired(rec, now) then
        drop(id)
        redis.call('ZREM', EXPIRE, id)
        gone = gone + 1
      else
        make_ready(id, rec, t)
        moved = moved + 1
      end
    end
  end
  if #ids > 0 then zrem_many(DELAYED, ids) end
  return moved, gone
end

-- Retry backoff: how long a job waits before its next attempt after a failed one (a ttr that
-- ran out, a release without a delay). The job's own rule (record flags & 2: `>B I4 I4 H` =
-- kind, base ms, cap ms, jitter in thousandths, right after the header) or else the queue's
-- (CONF backoff fields, read once per call); kind 0 = none, 1 = fixed, 2 = exponential.
-- `r` in [0, 1) comes from the caller (ARGV), never math.random: the scripts stay
-- deterministic. Mirrored by cluster_dq.backoff.wait_ms.
local QUEUE_BACKOFF = nil -- {kind, base, cap, jitter} of CONF, false: none; read on first use
local BACKOFF_KINDS = {fixed = 1, exponential = 2}

local function queue_backoff()
  if QUEUE_BACKOFF == nil then
    local c = redis.call('HMGET', CONF, 'backoff', 'backoff_ms', 'backoff_cap_ms', 'backoff_jitter')
    QUEUE_BACKOFF = false
    if c[1] and BACKOFF_KINDS[c[1]] then
      QUEUE_BACKOFF = {BACKOFF_KINDS[c[1]], tonumber(c[2]) or 0, tonumber(c[3]) or 0,
        (tonumber(c[4]) or 0) / 1000}
    end
  end
  return QUEUE_BACKOFF
end

local function retry_wait(rec, deliveries, r)
  local kind, base, cap, jitter
  if string.byte(rec, 18) % 4 >= 2 then
    kind, base, cap, jitter = struct.unpack('>BI4I4H', rec, 19)
    jitter = jitter / 1000
  else
    local c = queue_backoff()
    if not c then return 0 end
    kind, base, cap, jitter = c[1], c[2], c[3], c[4]
  end
  if kind == 0 or base <= 0 then return 0 end
  local d = base
  if kind == 2 then
    d = base * 2 ^ math.min(math.max(deliveries - 1, 0), 40)
    if cap > 0 and d > cap then d = cap end
  end
  return d - math.floor(d * jitter * r)
end

-- The k-th job (0-based) retried by one call: its jitter draw, spread over [0, 1) from the
-- call's one random value (the golden ratio's fraction keeps successive draws apart).
local function draw(seed, k)
  return (seed + k * 0.6180339887498949) % 1
end

-- The earlier of two event times, 0 meaning none.
local function earliest(a, b)
  if a == 0 or (b ~= 0 and b < a) then return b end
  return a
end

-- A job that failed an attempt and has tries left: back to READY at once, or, with a backoff,
-- into DELAYED until its next attempt (long-polls and META.next learn of it). Returns the
-- state it went to (CODE.READY or CODE.DELAYED) and, when it lowered META.next, that time
-- (else 0): the caller signals the shard with it.
local LATEST_DUE = 281474976710655 -- 2^48 - 1: the latest due time (a record's u48)

local function retry(id, rec, now, r)
  local _, _, _, deliveries = header(rec)
  local wait = retry_wait(rec, deliveries, r)
  if wait > 0 then
    -- an uncapped exponential wait can pass any due time (base * 2^40 ~ 2^72 ms)
    local due = math.min(now + wait, LATEST_DUE)
    delay_until(id, due)
    if lower_next(due) == 1 then return CODE.DELAYED, due end
    return CODE.DELAYED, 0
  end
  make_ready(id, rec, now)
  return CODE.READY, 0
end

-- RESERVED -> READY (tries left; DELAYED with a retry backoff) or DEAD (none left) once the
-- ttr deadline passed. Returns back, dead, gone and the earliest time it lowered META.next
-- to (0: none; see retry).
local function expire_reservations(now, limit, seed)
  local due = redis.call('ZRANGE', RESERVED, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  local back, dead, gone, lowered = 0, 0, 0, 0
  for _, id in ipairs(due) do
    local rec = redis.call('HGET', JOBS, id)
    if not rec then
      -- cannot happen while the invariants hold; never leave a dangling member behind
    elseif expired(rec, now) then
      drop(id)
      redis.call('ZREM', EXPIRE, id)
      gone = gone + 1
    else
      local _, _, tries = header(rec)
      if tries > 0 then
        local _, low = retry(id, rec, now, draw(seed, back))
        lowered = earliest(lowered, low)
        back = back + 1
      else
        kill(id, DIED_TTR, now, '')
        dead = dead + 1
      end
    end
  end
  if #due > 0 then
    zrem_many(RESERVED, due)
    for i = 1, #due, CHUNK do
      redis.call('HDEL', LEASES, unpack(due, i, math.min(i + CHUNK - 1, #due)))
    end
  end
  return back, dead, gone, lowered
end

-- Whether `id` was acked less than `keep` ms before `now`.
local function acked_lately(id, now, keep)
  local t = redis.call('ZSCORE', ACKED, id)
  return t ~= false and tonumber(t) > now - keep
end

-- Places one new job (publish, republish). Returns its code (DUPLICATE, WHEEL, DELAYED or
-- READY) and the `lowered` flag: 1 when META.next moved earlier or the queue came into being.
-- `bucket`: the job's wheel bucket, looked in for a duplicate; the job goes there if `wheel`.
-- `wheel`: 0, or 1 / 2 (commands.INTO / INTO_NEW) to place it in that bucket, plus
-- SHORT_VALUE when `rec` is its short wheel value.
local function place(id, due, rec, bucket, bname, wheel, now, cap, width, lead, keep)
  local val = rec
  if wheel >= SHORT_VALUE then rec = wheel_record(due, val) end
  if redis.call('HEXISTS', JOBS, id) == 1 or (bucket and wheel_has(bucket, id))
      or acked_lately(id, now, keep) then
    return CODE.DUPLICATE, 0 -- present, or acked a moment ago (a repeated publish must not bring it back)
  end
  local lowered = 0
  if redis.call('EXISTS', META) == 0 and redis.call('EXISTS', JOBS) == 0 then
    lowered = 1 -- a queue coming into being: the caller registers it in its shard
  end
  local st
  if due <= now then
    redis.call('HSET', JOBS, id, rec)
    make_ready(id, rec, due)
    st = CODE.READY
  elseif wheel > 0 and bucket and redis.call('HLEN', bucket) < cap then
    redis.call('HSET', bucket, wheel >= SHORT_VALUE and wheel_field(id) or id, val)
    wheel_wrote(wheel >= SHORT_VALUE)
    local start = due - due % width
    redis.call('ZADD', WHEEL, 'NX', start, bname)
    count_wheel(1)
    return CODE.WHEEL, math.max(lowered, lower_next(start - lead))
  else
    redis.call('HSET', JOBS, id, rec)
    delay_until(id, due)
    lowered = math.max(lowered, lower_next(due))
    st = CODE.DELAYED
  end
  local e = expire_at(rec)
  if e > 0 then
    redis.call('ZADD', EXPIRE, e, id)
    lowered = math.max(lowered, lower_next(e))
  end
  return st, lowered
end

local function first_score(key)
  local r = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if r[2] then return tonumber(r[2]) end
  return false
end

-- Exact sizes and the next pump event (ms, or -1): the wheel needs work `lead` ms early.
local function queue_sizes(lead)
  local nxt = -1
  local function consider(t)
    if t and (nxt < 0 or t < nxt) then nxt = t end
  end
  local w = first_score(WHEEL)
  if w then consider(w - lead) end
  consider(first_score(DELAYED))
  consider(first_score(RESERVED))
  consider(first_score(EXPIRE))
  local wheel = tonumber(redis.call('HGET', META, 'w') or '0')
  return {wheel + redis.call('ZCARD', DELAYED), redis.call('ZCARD', READY),
    redis.call('ZCARD', RESERVED), redis.call('ZCARD', DEAD), nxt}
end

-- Whether the delivery holding `lease` still holds job `id` at `now`: OK when it does,
-- else why not: a LEASE_* code (negative).
local function lease_check(id, lease, now)
  local deadline = redis.call('ZSCORE', RESERVED, id)
  if deadline then
    if redis.call('HGET', LEASES, id) ~= lease then return CODE.LEASE_TAKEN end
    if tonumber(deadline) <= now then return CODE.LEASE_TTR_EXPIRED end
    return CODE.OK
  end
  if redis.call('HEXISTS', JOBS, id) == 0 then return CODE.LEASE_GONE end
  if redis.call('ZSCORE', READY, id) then return CODE.LEASE_READY end
  if redis.call('ZSCORE', DEAD, id) then return CODE.LEASE_DEAD end
  return CODE.LEASE_DELAYED
end

-- A reservation that is still running at `now` (its ttr deadline not passed).
local function reserved_until(id, now)
  local deadline = redis.call('ZSCORE', RESERVED, id)
  return deadline ~= false and tonumber(deadline) > now
end

-- The queue's notice to its long-polls: '1' when READY went from empty to non-empty (take a
-- job), else 'due:<ms>' when this call put a job into DELAYED that is due before any other
-- there (wake up by then: it is earlier than anything the long-polls knew of).
local function notify(channel, was_empty)
  if channel == '' then return end
  if was_empty and redis.call('EXISTS', READY) == 1 then
    redis.call('SPUBLISH', channel, '1')
  elseif SOONEST and (not HEAD or SOONEST < HEAD) then
    redis.call('SPUBLISH', channel, 'due:' .. SOONEST)
  end
end

-- Where a job held in JOBS is: its state code and score (NOT_FOUND: in none, which the
-- invariants rule out).
local function state_of(id)
  for _, st in ipairs({{CODE.READY, READY}, {CODE.RESERVED, RESERVED}, {CODE.DELAYED, DELAYED},
      {CODE.DEAD, DEAD}}) do
    local score = redis.call('ZSCORE', st[2], id)
    if score then return st[1], score end
  end
  return CODE.NOT_FOUND, false
end

-- Whether member `a` sorts at or before `b` in a sorted set at equal scores (memcmp order; Lua's
-- own `<` on strings follows the locale).
local function bytes_le(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a <= #b
end

-- The rank in DEAD of the first entry after position (score, member) in DEAD's order, whether
-- that entry still exists or not: a cursor that survives concurrent writes. O(log^2 n).
-- member '' means "before every member at this score".
local function dead_rank_after(score, member)
  local lo = redis.call('ZCOUNT', DEAD, '-inf', '(' .. score)
  if member == '' then return lo end
  local hi = redis.call('ZCOUNT', DEAD, '-inf', score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if bytes_le(redis.call('ZRANGE', DEAD, mid, mid)[1], member) then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- DEAD -> READY (due <= now) or DELAYED (due later), with `tries` and a fresh ttl (ms, 0 =
-- never): kick and redrive. Forgets its death, keeps its last error. Returns its state code,
-- the `lowered` flag and the new record.
local function revive(id, rec, now, due, tries, ttl)
  redis.call('ZREM', DEAD, id)
  local exp = 0
  if ttl > 0 then exp = now + ttl end
  rec = with_tries_expire(rec, tries, exp)
  redis.call('HSET', JOBS, id, rec)
  local st, lowered = CODE.READY, 0
  if due > now then
    delay_until(id, due)
    lowered = lower_next(due)
    st = CODE.DELAYED
  else
    make_ready(id, rec, now)
  end
  if exp > 0 then
    redis.call('ZADD', EXPIRE, exp, id)
    lowered = math.max(lowered, lower_next(exp))
  end
  forget_death(id)
  return st, lowered, rec
end

-- Bytes of records one call of dead_page or redrive_dead reads at most (past its first job):
-- bodies of up to 1 MB must not make a call of 1,000 jobs copy a gigabyte.
local RECORD_BYTES_PER_CALL = 8388608

-- The dead entries one sweep (redrive, purge) examines, flat {member, score, ...}: from just
-- after the cursor (score, member), or from the time of death `from` when there is none (score
-- -1), at most `examine` of them.
local function dead_window(score, member, from, examine)
  local r
  if score >= 0 then
    r = dead_rank_after(score, member)
  else
    r = redis.call('ZCOUNT', DEAD, '-inf', '(' .. from)
  end
  return redis.call('ZRANGE', DEAD, r, r + examine - 1, 'WITHSCORES')
end

-- Walks a dead window up to the time of death `to`, calling act(id) on each entry whose reason
-- is `reason` (-1: any) until `limit` were acted on. Returns the number acted on, `more` (1:
-- entries may follow the last one examined) and the last one examined (score -1: none).
-- `full()`, when given, says the call has done enough (bytes of records rewritten): it stops
-- there, as at `limit`.
local function sweep_dead(got, to, reason, limit, examine, act, full)
  local done, more, last_s, last_m = 0, 0, -1, ''
  local ended = false
  for i = 1, #got, 2 do
    local id, t = got[i], tonumber(got[i + 1])
    if t > to then
      ended = true
      break
    end
    if done >= limit or (full and full()) then
      more, ended = 1, true
      break
    end
    last_s, last_m = t, id
    if reason < 0 or note_of(id) == reason then
      act(id)
      done = done + 1
    end
  end
  if not ended and #got >= 2 * examine then more = 1 end
  return done, more, last_s, last_m
end
