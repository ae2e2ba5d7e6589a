--[[
  Groups: a job may name one (its record's flag 4). Within a queue, READY serves the groups
  in turn: a grouped job's READY score is not its due time but a fair tag (start-time fair
  queueing), `max(V, the group's last tag + 1)`, where V is the tag of READY's head (what is
  being served now; the job's due time when READY has no job of its priority), the group's
  last tag counting only in the busy period it was given in (below). A group with a backlog has its
  jobs one tag apart, so a group that was idle enters at the head of the line and waits
  behind at most one job of each busy group; a job its group held back comes back at the head
  (README "Groups").
  GROUPS holds, per group, while it has jobs: `n:<g>` its jobs (every state, the wheel
  included), `r:<g>` its reserved jobs, `t:<g>` its last tag; and `e` the busy period, while
  any group has jobs. GCONF holds the settings
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

-- Busy periods. READY found empty when a grouped job is tagged begins a new one: no group has
-- a job waiting there, so every group's last tag is of an earlier period and no longer counts.
-- (A burst served fast leaves its group's last tag far ahead of the clock: counted, the
-- group's next job would wait behind almost all of a backlog published since.) GROUPS `e` is
-- the current period (absent: 0; it leaves with the last group's fields), read and written
-- with a group's tag, which is written `<tag>` in period 0 and `<tag> <period>` after.
-- PERIOD: its value in this call (false: not read yet); NEW_PERIOD: this call began one, not
-- written yet.
local PERIOD, NEW_PERIOD = false, false

-- A group's `t:<g>` value: its last tag and that tag's period.
local function last_of(v)
  if not v then return nil, 0 end
  local tag, p = string.match(v, '^(%d+) (%d+)$')
  if tag then return tonumber(tag), tonumber(p) end
  return tonumber(v), 0
end

local function tag_text(v)
  if PERIOD == 0 then return v end
  return v .. ' ' .. PERIOD
end

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
    if redis.call('HLEN', GROUPS) == 1 then -- no group left but the busy period
      redis.call('HDEL', GROUPS, 'e')
      PERIOD, NEW_PERIOD = 0, false
    end
  end
end

-- V: the tag of READY's first job of priority `prio` (t when it has none): the job being
-- served among those a job of that priority competes with. `fresh` (a job is being tagged,
-- PERIOD read): READY empty begins a busy period.
local function head_tag(t, prio, fresh)
  if BATCHED and HEAD_TAG[prio] then return HEAD_TAG[prio] end
  local low = (255 - prio) * PRIO_SHIFT
  local head = redis.call('ZRANGE', READY, low, '(' .. (low + PRIO_SHIFT), 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  if not head[2] then
    if fresh and redis.call('EXISTS', READY) == 0 then PERIOD, NEW_PERIOD = PERIOD + 1, true end
    return t
  end
  local v = tonumber(head[2]) - low
  if BATCHED then HEAD_TAG[prio] = v end
  return v
end

-- The fair tag of group g's next job in READY (t: its due time; prio: its priority). Its last
-- tag counts in the period it was given in (read, with the period, in one HMGET).
local function fair_tag(g, t, prio)
  local last, p
  if BATCHED and LAST[g] then
    last, p = LAST[g], nil -- (this call's: the current period)
  elseif BATCHED then
    local got = redis.call('HMGET', GROUPS, 't:' .. g, 'n:' .. g, 'e')
    last, p = last_of(got[1])
    SIZE[g] = tonumber(got[2] or '0')
    if not PERIOD then PERIOD = tonumber(got[3] or '0') end
  else
    local got = redis.call('HMGET', GROUPS, 't:' .. g, 'e')
    last, p = last_of(got[1])
    if not PERIOD then PERIOD = tonumber(got[2] or '0') end
  end
  local v = head_tag(t, prio, true)
  if last and (p == nil or p == PERIOD) and last + 1 > v then v = last + 1 end
  if BATCHED then
    LAST[g] = v
  elseif NEW_PERIOD then
    redis.call('HSET', GROUPS, 't:' .. g, tag_text(v), 'e', PERIOD)
    NEW_PERIOD = false
  else
    redis.call('HSET', GROUPS, 't:' .. g, tag_text(v))
  end
  return v
end

-- The end of a batched call: each group's last tag and size written once (a new period with
-- the first).
local function flush_groups()
  for g, v in pairs(LAST) do
    if NEW_PERIOD then
      redis.call('HSET', GROUPS, 't:' .. g, tag_text(v), 'n:' .. g, SIZE[g] + (ADDED[g] or 0), 'e', PERIOD)
      NEW_PERIOD = false
    else
      redis.call('HSET', GROUPS, 't:' .. g, tag_text(v), 'n:' .. g, SIZE[g] + (ADDED[g] or 0))
    end
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

-- Group g's settings, read once per call: {paused, concurrency limit or false, its rate's n
-- or false, and its rate's P ms (n per P)}.
local GROUP_CONF = {}
local function group_conf(g)
  local c = GROUP_CONF[g]
  if c then return c end
  local v = redis.call('HMGET', GCONF, 'p:' .. g, 'c:' .. g, 'q:' .. g)
  c = {v[1] == '1', tonumber(v[2] or '') or false, false}
  if v[3] then
    local n, per = string.match(v[3], '^(%d+) (%d+)$')
    c[3], c[4] = tonumber(n), tonumber(per)
  end
  GROUP_CONF[g] = c
  return c
end

-- Group g's rate (GCRA without a burst), counted exactly: turns `per/n` ms apart (conf[4],
-- conf[3]), from the later of the next turn and now. The next turn is `ms + r/n` ms, r in
-- 0..n-1, whole numbers (fractional ms added up in doubles drift near 2^41, and a rate set to
-- n per P let n + 1 go in some windows of P). A delivery at millisecond `now` takes every turn
-- that falls within it (a rate above 1,000/s goes several per ms), so a window of P ms never
-- holds more than n deliveries.
-- In GCONF `a:<g>` the next turn is a decimal, `ms` then r/n to 12 places: r comes back exact
-- for every n up to 10^6, and a number is what an earlier version wrote and reads there (its
-- value, a double, is read to the nearest 1/n).
local function read_turn(g, n)
  local s = redis.call('HGET', GCONF, 'a:' .. g)
  if not s then return 0, 0 end
  local dot = string.find(s, '.', 1, true)
  if not dot then return tonumber(s), 0 end
  local ms = tonumber(string.sub(s, 1, dot - 1))
  local r = math.floor(tonumber('0' .. string.sub(s, dot)) * n + 0.5)
  if r >= n then return ms + 1, 0 end
  return ms, r
end

-- The later of the next turn `ms + r/n` and now (a turn not taken in time is not saved up).
local function turn_from(ms, r, now)
  if ms < now then return now, 0 end
  return ms, r
end

local function turn_text(t)
  local ms, r, n = t[1], t[2], t[3]
  local whole = string.format('%.0f', ms)
  if r == 0 then return whole end
  return whole .. string.sub(string.format('%.12f', r / n), 2)
end

-- A call reads a group's next turn once and keeps it (TAT[g] = {ms, r, n}); `flush_rates`
-- writes the turns it took at its end, once per group.
local TAT, TOOK = {}, {}

-- One delivery of group g at `now`: 0 when it may go (its turn taken), else the millisecond
-- it may.
local function rate_turn(g, conf, now)
  local t = TAT[g]
  if t == nil then
    local ms, r = read_turn(g, conf[3])
    t = {ms, r, conf[3]}
    TAT[g] = t
  end
  if t[1] > now then return t[1] end
  local ms, r = turn_from(t[1], t[2], now)
  r = r + conf[4]
  t[1], t[2], TOOK[g] = ms + math.floor(r / conf[3]), r % conf[3], true
  return 0
end

local function flush_rates()
  for g in pairs(TOOK) do redis.call('HSET', GCONF, 'a:' .. g, turn_text(TAT[g])) end
  TOOK = {}
end

-- How many turns of a rate whose next turn is `ms + r/n` fall within millisecond `now`, as
-- rate_turn takes them: from the later of that turn and now, every one before now + 1 (0
-- while the next turn's millisecond is later).
local function rate_turns(conf, ms, r, now)
  if ms > now then return 0 end
  ms, r = turn_from(ms, r, now)
  return math.ceil((conf[3] - r) / conf[4])
end

-- The millisecond of the turn after `turns` turns from the later of `ms + r/n` and now:
-- always after now when they are the turns of ms `now` (rate_turns).
local function turn_after(conf, ms, r, now, turns)
  ms, r = turn_from(ms, r, now)
  return ms + math.floor((r + turns * conf[4]) / conf[3])
end
