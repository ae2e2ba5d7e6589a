--[[
  Groups: a job may name one (its record's flag 4). Within a queue, READY serves the groups
  in turn: a grouped job's READY score is not its due time but a fair tag (start-time fair
  queueing), `max(V, the group's last tag + 1)`, where V is the tag of READY's head (what is
  being served now; the job's due time when READY is empty). A group with a backlog has its
  jobs one tag apart, so a group that was idle enters at the head of the line and waits
  behind at most one job of each busy group; a job its group held back comes back at the head
  (README "Groups").
  GROUPS holds, per group, while it has jobs: `n:<g>` its jobs (every state, the wheel
  included), `r:<g>` its reserved jobs, `t:<g>` its last tag. GCONF holds the settings
  (`p:<g>` paused, `c:<g>` concurrency limit, `q:<g>` rate `<n> <per ms>`, `a:<g>` the rate's
  theoretical arrival time). HELD holds the ready jobs of a group that is paused, at its
  concurrency limit or past its rate, as `<g>\0<id>` (all scores 0, so a group's are one
  lexical range); GWAKE, group -> when its rate lets its next held job go.
]]
--@include lib/keys
--@include lib/record

-- A group's member of HELD for job `id`.
local function held_member(g, id)
  return g .. '\0' .. id
end

-- A call that only adds jobs (publish.lua) batches its groups' bookkeeping: READY's head of
-- each priority is read once (the tags it adds are never below it: it changes only when that
-- priority had no job), and each group's last tag and size are read once (one HMGET, when the
-- group's first ready job needs its tag) and written once, by `flush_groups` at its end (one
-- HSET of both; an HINCRBY for a group whose jobs all wait).
local BATCHED, HEAD_TAG, LAST, SIZE, ADDED = false, {}, {}, {}, {}

-- A call that only removes jobs (ack.lua) batches the other way: SHRINKING set, each group's
-- size falls once per call, and so does its reserved count when no job it holds back waits on
-- that count (lib/jobs.lua unreserve), by `flush_shrunk` at its end.
local SHRINKING, LEFT, FREED = false, {}, {}

-- Keeps `n:<g>` exact (+1 a job of the group came into being, -1 one left); its last
-- fields leave with its last job, and its rate's wake-up with them (it holds nothing then).
local function count_group(g, delta)
  if not g then return end
  if BATCHED and delta > 0 then
    ADDED[g] = (ADDED[g] or 0) + delta
    return
  end
  if SHRINKING and delta < 0 then
    LEFT[g] = (LEFT[g] or 0) - delta
    return
  end
  if redis.call('HINCRBY', GROUPS, 'n:' .. g, delta) <= 0 then
    redis.call('HDEL', GROUPS, 'n:' .. g, 'r:' .. g, 't:' .. g)
    redis.call('ZREM', GWAKE, g)
  end
end

-- V: the tag of READY's first job of priority `prio` (t when it has none): the job being
-- served among those a job of that priority competes with.
local function head_tag(t, prio)
  if BATCHED and HEAD_TAG[prio] then return HEAD_TAG[prio] end
  local low = (255 - prio) * PRIO_SHIFT
  local head = redis.call('ZRANGE', READY, low, '(' .. (low + PRIO_SHIFT), 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  if not head[2] then return t end
  local v = tonumber(head[2]) - low
  if BATCHED then HEAD_TAG[prio] = v end
  return v
end

-- The fair tag of group g's next job in READY (t: its due time; prio: its priority).
local function fair_tag(g, t, prio)
  local v = head_tag(t, prio)
  local last
  if not BATCHED then
    last = tonumber(redis.call('HGET', GROUPS, 't:' .. g) or '')
  elseif LAST[g] then
    last = LAST[g]
  else
    local got = redis.call('HMGET', GROUPS, 't:' .. g, 'n:' .. g)
    last, SIZE[g] = tonumber(got[1] or ''), tonumber(got[2] or '0')
  end
  if last and last + 1 > v then v = last + 1 end
  if BATCHED then LAST[g] = v else redis.call('HSET', GROUPS, 't:' .. g, v) end
  return v
end

-- The end of a batched call: each group's last tag and size written once.
local function flush_groups()
  for g, v in pairs(LAST) do
    redis.call('HSET', GROUPS, 't:' .. g, v, 'n:' .. g, SIZE[g] + (ADDED[g] or 0))
    ADDED[g] = nil
  end
  for g, n in pairs(ADDED) do redis.call('HINCRBY', GROUPS, 'n:' .. g, n) end
end

-- The end of a shrinking call: each group's reserved count and size written once.
local function flush_shrunk()
  SHRINKING = false
  for g, k in pairs(FREED) do
    if redis.call('HINCRBY', GROUPS, 'r:' .. g, -k) <= 0 then redis.call('HDEL', GROUPS, 'r:' .. g) end
  end
  for g, k in pairs(LEFT) do count_group(g, -k) end
  FREED, LEFT = {}, {}
end

-- Group g's settings, read once per call: {paused, concurrency limit or false, ms between
-- two deliveries under its rate or false}.
local GROUP_CONF = {}
local function group_conf(g)
  local c = GROUP_CONF[g]
  if c then return c end
  local v = redis.call('HMGET', GCONF, 'p:' .. g, 'c:' .. g, 'q:' .. g)
  c = {v[1] == '1', tonumber(v[2] or '') or false, false}
  if v[3] then
    local n, per = string.match(v[3], '^(%d+) (%d+)$')
    c[3] = tonumber(per) / tonumber(n)
  end
  GROUP_CONF[g] = c
  return c
end

-- Group g's rate (GCRA without a burst) for one delivery at `now`: 0 when it may go (its turn
-- taken), else the millisecond it may. Turns are `conf[3]` ms apart, from the later of the
-- next turn and now (`a:<g>`: the next turn, fractional); a delivery at millisecond `now`
-- takes every turn that falls within it (a rate above 1,000/s goes several per ms), so a
-- window of `per` ms never holds more than n deliveries.
local EPS = 0.001 -- ms: what adding up fractional turns may be off by (doubles near 2^41)

-- A call reads a group's next turn once and keeps it (TAT); `flush_rates` writes the turns
-- it took at its end, once per group.
local TAT, TOOK = {}, {}

local function rate_turn(g, conf, now)
  local tat = TAT[g]
  if tat == nil then
    tat = tonumber(redis.call('HGET', GCONF, 'a:' .. g) or '0')
    TAT[g] = tat
  end
  if math.floor(tat + EPS) > now then return math.floor(tat + EPS) end
  TAT[g], TOOK[g] = math.max(tat, now) + conf[3], true
  return 0
end

local function flush_rates()
  for g in pairs(TOOK) do redis.call('HSET', GCONF, 'a:' .. g, TAT[g]) end
  TOOK = {}
end

-- How many turns of group g's rate fall within millisecond `now`, as rate_turn counts them
-- (a turn at t falls within it when floor(t + EPS) <= now): from the later of its next turn
-- and now, every turn before now + 1 - EPS (0 while its next turn is later).
local function rate_turns(conf, tat, now)
  if math.floor(tat + EPS) > now then return 0 end
  return math.max(math.ceil((now + 1 - EPS - math.max(tat, now)) / conf[3]), 1)
end

-- The millisecond of the turn after `turns` turns from the later of tat and now: always
-- after now when they are the turns of ms `now` (rate_turns).
local function turn_after(conf, tat, now, turns)
  return math.floor(math.max(tat, now) + turns * conf[3] + EPS)
end
