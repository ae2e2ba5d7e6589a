--[[
  A job's moves between JOBS and the state sets, and the queue's META (its next event, its
  wheel count, the first due time of DELAYED); an empty queue keeps no META.
]]
--@include lib/keys
--@include lib/record

-- Puts a job whose record is already in JOBS into READY (t = its due time).
local function make_ready(id, rec, t)
  redis.call('ZADD', READY, ready_score(rec, t), id)
end

-- Drops a job's record from JOBS and what it carries beside it in NOTES (field `<id>`: its
-- errors and death; `p:<id>`: its progress; `d:<id>`: the dedup key it holds, whose `k:<key>`
-- goes with it while it names this job). Returns 1, or 0 when JOBS did not hold it.
local function drop(id)
  if redis.call('HDEL', JOBS, id) == 0 then return 0 end
  local key = redis.call('HGET', NOTES, 'd:' .. id)
  if key then
    if redis.call('HGET', NOTES, 'k:' .. key) == id then redis.call('HDEL', NOTES, 'k:' .. key) end
    redis.call('HDEL', NOTES, id, 'p:' .. id, 'd:' .. id)
  else
    redis.call('HDEL', NOTES, id, 'p:' .. id)
  end
  return 1
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

-- The earlier of two event times, 0 meaning none.
local function earliest(a, b)
  if a == 0 or (b ~= 0 and b < a) then return b end
  return a
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
