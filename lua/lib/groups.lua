--[[
  Groups: a job may name one (its record's flag 4). Within a queue, READY serves the groups
  round-robin: a grouped job's READY score is not its due time but a fair tag (start-time
  fair queueing), `max(V, the group's last tag + 1)`, where V (META.v) is the tag of the
  grouped job delivered last. A group with a backlog has its jobs one tag apart, so a group
  that was idle enters at V, at the head of the line, and waits behind at most one job of
  each busy group (README "Groups").
  GROUPS holds, per group, while it has jobs: `n:<g>` its jobs (every state, the wheel
  included), `r:<g>` its reserved jobs, `t:<g>` its last tag. GCONF holds the settings
  (`p:<g>` paused, `c:<g>` concurrency limit, `q:<g>` rate `<n> <per ms>`, `a:<g>` the rate's
  theoretical arrival time). HELD holds the ready jobs of a group that is paused or at its
  concurrency limit, as `<g>\0<id>` (all scores 0, so a group's are one lexical range).
]]
--@include lib/keys

-- A group's member of HELD for job `id`.
local function held_member(g, id)
  return g .. '\0' .. id
end

-- Keeps `n:<g>` exact (+1 a job of the group came into being, -1 one left); its last
-- fields leave with its last job.
local function count_group(g, delta)
  if not g then return end
  if redis.call('HINCRBY', GROUPS, 'n:' .. g, delta) <= 0 then
    redis.call('HDEL', GROUPS, 'n:' .. g, 'r:' .. g, 't:' .. g)
  end
end

-- The fair tag of group g's next job in READY (t: its due time, V's start when no grouped job
-- has been delivered yet).
local function fair_tag(g, t)
  local v = tonumber(redis.call('HGET', META, 'v') or t)
  local last = redis.call('HGET', GROUPS, 't:' .. g)
  if last and tonumber(last) + 1 > v then v = tonumber(last) + 1 end
  redis.call('HSET', GROUPS, 't:' .. g, v)
  return v
end

-- Group g's settings, read once per call: {paused, concurrency limit or false, rate interval
-- (ms per job) or false, the rate's burst tolerance (ms)}.
local GROUP_CONF = {}
local function group_conf(g)
  local c = GROUP_CONF[g]
  if c then return c end
  local v = redis.call('HMGET', GCONF, 'p:' .. g, 'c:' .. g, 'q:' .. g)
  c = {v[1] == '1', tonumber(v[2] or '') or false, false, 0}
  if v[3] then
    local n, per = string.match(v[3], '^(%d+) (%d+)$')
    c[3] = tonumber(per) / tonumber(n)
    c[4] = tonumber(per) - c[3]
  end
  GROUP_CONF[g] = c
  return c
end

-- Group g's rate limit (GCRA) for one delivery at `now`: 0 when it may go (its slot taken),
-- else when it may (ms) and its slot taken for then: the caller delays the job until that time
-- and marks it (FLAG_SLOT), so that it goes through then without another look.
local function rate_slot(g, conf, now)
  local tat = tonumber(redis.call('HGET', GCONF, 'a:' .. g) or '0')
  if tat < now then tat = now end
  local at = tat - conf[4]
  redis.call('HSET', GCONF, 'a:' .. g, tat + conf[3])
  if at <= now then return 0 end
  return math.ceil(at)
end
