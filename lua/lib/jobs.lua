--[[
  A job's moves between JOBS and the state sets, and the queue's META (its next event, its
  wheel count, the first due time of DELAYED); an empty queue keeps no META.
]]
--@include lib/keys
--@include lib/record
--@include lib/groups

-- Puts a job whose record is already in JOBS into READY (t = its due time; a grouped job's
-- place is its group's fair tag instead, lib/groups.lua).
local function make_ready(id, rec, t)
  local g = group_of(rec)
  if g then t = fair_tag(g, t, priority_of(rec)) end
  redis.call('ZADD', READY, ready_score(rec, t), id)
end

-- Whether HELD may hold a job, looked at once per call (nil: not yet); a call that holds one
-- sets it (hold).
local HELD_ANY = nil

local function hold(g, id)
  redis.call('ZADD', HELD, 0, held_member(g, id))
  HELD_ANY = true
end

-- Brings up to `n` jobs that group g holds back into READY (its pause ended, a slot of its
-- concurrency limit freed, its rate's turn came), in id order, one tag apart just behind the
-- head of their priority (so a job waiting at the head goes first, and a whole backlog a
-- resume brings back takes turns with the other groups); t: now. When
-- READY was empty, the queue's long-polls hear of it ('1' on its notify channel, whose name
-- is META's with `notify` for `meta`: any script may free a slot, an ack included, and not
-- every one is given the channel).
local function unhold(g, n, t)
  if n <= 0 then return 0 end
  if HELD_ANY == nil then HELD_ANY = redis.call('EXISTS', HELD) == 1 end
  if not HELD_ANY then return 0 end
  local held = redis.call('ZRANGE', HELD, '[' .. g .. '\0', '(' .. g .. '\1', 'BYLEX', 'LIMIT', 0, n)
  if #held == 0 then return 0 end
  local was_empty = redis.call('EXISTS', READY) == 0
  local base, k = {}, 0
  for _, m in ipairs(held) do
    local id = string.sub(m, #g + 2)
    local rec = redis.call('HGET', JOBS, id)
    if rec then
      local prio = priority_of(rec)
      base[prio] = base[prio] or head_tag(t, prio)
      k = k + 1
      redis.call('ZADD', READY, ready_score(rec, base[prio] + k), id)
    end
  end
  redis.call('ZREM', HELD, unpack(held))
  if was_empty then redis.call('SPUBLISH', string.sub(META, 1, -5) .. 'notify', '1') end
  return #held
end

-- How many more of group g's jobs may be reserved now (its settings, its reserved count:
-- `reserved` when the caller knows it); math.huge: no limit.
local function group_room(g, conf, reserved)
  if conf[1] then return 0 end
  if not conf[2] then return math.huge end
  return conf[2] - (reserved or tonumber(redis.call('HGET', GROUPS, 'r:' .. g) or '0'))
end

-- Counts a reservation of one of group g's jobs (`r:<g>`) when its settings (conf: group_conf)
-- leave room: its reserved count after it, or false (paused, or at its concurrency limit:
-- nothing counted). `give_back(g, taken)` undoes it. A group without a limit (whose count no
-- one reads in the call) is counted in GROWN, written once per group by `flush_slots` at the
-- call's end (`true` then stands for the count).
local GROWN = {}

local function give_back(g, taken)
  if taken == true then
    GROWN[g] = GROWN[g] - 1
  elseif taken <= 1 then
    redis.call('HDEL', GROUPS, 'r:' .. g)
  else
    redis.call('HINCRBY', GROUPS, 'r:' .. g, -1)
  end
end

local function flush_slots()
  for g, k in pairs(GROWN) do
    if k > 0 then redis.call('HINCRBY', GROUPS, 'r:' .. g, k) end
  end
  GROWN = {}
end

local function take_slot(g, conf)
  if conf[1] then return false end
  if not conf[2] then
    GROWN[g] = (GROWN[g] or 0) + 1
    return true
  end
  local taken = redis.call('HINCRBY', GROUPS, 'r:' .. g, 1)
  if conf[2] and taken > conf[2] then
    give_back(g, taken)
    return false
  end
  return taken
end

-- A job of group g left READY, or RESERVED, and the group's concurrency limit may now let one
-- of its held jobs go: it comes back to READY. (Each job the limit lets go is in READY or
-- reserved; one that leaves READY unreserved, deleted or expired or moved, hands its turn to a
-- held one, as a reservation's end does.)
local function let_one_go(g, t, reserved)
  local conf = group_conf(g)
  if conf[2] then unhold(g, math.min(group_room(g, conf, reserved), 1), t) end
end

-- A job of record `rec` left RESERVED: its group's reserved count drops, and a job the group
-- held back for its concurrency limit comes back to READY.
local function unreserve(rec, t)
  local g = group_of(rec)
  if not g then return end
  if SHRINKING then -- counted out at the call's end when no held job waits on the count: the
    -- group has no concurrency limit, or the queue holds no job back (an ack holds none)
    if HELD_ANY == nil then HELD_ANY = redis.call('EXISTS', HELD) == 1 end
    if not HELD_ANY or not group_conf(g)[2] then
      FREED[g] = (FREED[g] or 0) + 1
      return
    end
  end
  local reserved = redis.call('HINCRBY', GROUPS, 'r:' .. g, -1)
  if reserved <= 0 then redis.call('HDEL', GROUPS, 'r:' .. g) end
  let_one_go(g, t, math.max(reserved, 0))
end

-- Takes a job out of READY, or out of HELD where its group holds it back; 1 when it was in
-- either, else 0. A grouped job taken out of READY hands its turn on (let_one_go); t: now.
local function unready(id, rec, t)
  if redis.call('ZREM', READY, id) == 1 then
    local g = rec and group_of(rec)
    if g then let_one_go(g, t) end
    return 1
  end
  local g = rec and group_of(rec)
  if g then return redis.call('ZREM', HELD, held_member(g, id)) end
  return 0
end

-- Drops a job's record from JOBS and what it carries beside it in NOTES (field `<id>`: its
-- errors and death; `p:<id>`: its progress; `k:<key>`, the dedup key its record carries, while
-- that names this job), and counts it out of its group (rec: its record, when the caller has
-- it). Returns 1, or 0 when JOBS did not hold it.
local function drop(id, rec)
  rec = rec or redis.call('HGET', JOBS, id)
  if not rec then return 0 end
  redis.call('HDEL', JOBS, id)
  count_group(group_of(rec), -1)
  local key = dedup_of(rec)
  if key and redis.call('HGET', NOTES, 'k:' .. key) == id then
    redis.call('HDEL', NOTES, id, 'p:' .. id, 'k:' .. key)
  else -- (`d:<id>`: where versions before flag 8 kept a job's key, docs/operations.md)
    redis.call('HDEL', NOTES, id, 'p:' .. id, 'd:' .. id)
  end
  return 1
end

-- ``drop`` and the job's entry in EXPIRE: a job whose ttl has ended (or ends before it would
-- be ready again), or one forgotten; the caller takes it out of its state's set.
local function discard(id, rec)
  drop(id, rec)
  redis.call('ZREM', EXPIRE, id)
end

-- Forgets a job held in JOBS (any state but the wheel); returns the state code it was in.
-- t: now (a job its group held back may take a freed slot).
local function forget(id, t)
  local rec = redis.call('HGET', JOBS, id)
  if not rec then return CODE.NOT_FOUND end
  discard(id, rec)
  if redis.call('ZREM', RESERVED, id) == 1 then -- first: where an acked job almost always is
    redis.call('HDEL', LEASES, id)
    unreserve(rec, t)
    return CODE.RESERVED
  end
  if unready(id, rec, t) == 1 then return CODE.READY end
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

-- META.next: no pump event of this queue is earlier (set exactly by next_event.lua). NEXT is
-- META.next as this call last read or wrote it (nil: not read yet; false: none), so that a
-- call adding many events reads it once.
local NEXT = nil

-- META.next (ms), or false when it is not set.
local function next_marked()
  if NEXT == nil then NEXT = tonumber(redis.call('HGET', META, 'next') or '') or false end
  return NEXT
end

-- A script that adds an earlier event lowers META.next and reports so (the `lowered` flag of
-- its reply); the caller then signals the shard. Returns 1 when it lowered it, else 0.
local function lower_next(t)
  if not next_marked() or t < NEXT then
    redis.call('HSET', META, 'next', t)
    NEXT = t
    return 1
  end
  return 0
end

-- What a call that may be a repeat (its first attempt's reply lost, the engine's or a
-- client's retry) reports as `lowered`: the first attempt's shard signal may have been lost
-- with it, so the shard must look at the queue by META.next (its next event), or register it
-- only (1) when it has none. Callers signal at the earlier of this and their own event.
local function again_at()
  return next_marked() or 1
end

-- Sets META.next exactly: the queue's next event at t (ms; negative: it has none).
local function set_next(t)
  if t >= 0 then redis.call('HSET', META, 'next', t) else redis.call('HDEL', META, 'next') end
  NEXT = t >= 0 and t or false
end

-- An empty queue keeps no META (no jobs means no events): nothing left behind.
local function tidy()
  if redis.call('EXISTS', JOBS) == 0 and not redis.call('HGET', META, 'w') then
    redis.call('DEL', META)
    NEXT = nil
  end
end

-- The earlier of two event times, 0 meaning none.
local function earliest(a, b)
  if a == 0 or (b ~= 0 and b < a) then return b end
  return a
end

-- Where a job held in JOBS is: its state code and score (NOT_FOUND: in none, which the
-- invariants rule out). A job its group holds back is READY, score false. rec: its record,
-- when the caller has it.
local function state_of(id, rec)
  for _, st in ipairs({{CODE.READY, READY}, {CODE.RESERVED, RESERVED}, {CODE.DELAYED, DELAYED},
      {CODE.DEAD, DEAD}}) do
    local score = redis.call('ZSCORE', st[2], id)
    if score then return st[1], score end
  end
  rec = rec or redis.call('HGET', JOBS, id)
  local g = rec and group_of(rec)
  if g and redis.call('ZSCORE', HELD, held_member(g, id)) then return CODE.READY, false end
  return CODE.NOT_FOUND, false
end
