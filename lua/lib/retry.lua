--[[
  Retries: the backoff of a job that failed an attempt, and the reservations whose ttr ran
  out (back to READY, into DELAYED for a backoff, or DEAD).
]]
--@include lib/keys
--@include lib/record
--@include lib/jobs
--@include lib/notes

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

-- A job that failed an attempt and has tries left: back to READY at once, or, with a backoff,
-- into DELAYED until its next attempt (long-polls and META.next learn of it); removed now
-- (CODE.EXPIRED) when its ttl ends before that, rather than left to vanish unseen while it
-- waits. Returns the state it went to (CODE.READY, CODE.DELAYED or CODE.EXPIRED) and, when it
-- lowered META.next, that time (else 0): the caller signals the shard with it.
local LATEST_DUE = 281474976710655 -- 2^48 - 1: the latest due time (a record's u48)

local function retry(id, rec, now, r)
  local _, _, _, deliveries = header(rec)
  local wait = retry_wait(rec, deliveries, r)
  if wait > 0 then
    -- an uncapped exponential wait can pass any due time (base * 2^40 ~ 2^72 ms)
    local due = math.min(now + wait, LATEST_DUE)
    local e = expire_at(rec)
    if e > 0 and due >= e then
      discard(id, rec)
      return CODE.EXPIRED, 0
    end
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
      discard(id, rec)
      gone = gone + 1
    else
      local _, _, tries = header(rec)
      if tries > 0 then
        local st, low = retry(id, rec, now, draw(seed, back))
        lowered = earliest(lowered, low)
        if st == CODE.EXPIRED then gone = gone + 1 else back = back + 1 end
      else
        kill(id, DIED_TTR, now, '')
        dead = dead + 1
      end
    end
    if rec then unreserve(rec, now) end
  end
  if #due > 0 then
    zrem_many(RESERVED, due)
    for i = 1, #due, CHUNK do
      redis.call('HDEL', LEASES, unpack(due, i, math.min(i + CHUNK - 1, #due)))
    end
  end
  return back, dead, gone, lowered
end
