--[[
  DELAYED -> READY for the jobs that came due, and the groups' rate wake-ups (HELD -> READY).
]]
--@include lib/keys
--@include lib/record
--@include lib/jobs

-- Group g's rate wake-up at `now`: the held jobs whose turns fall within this ms go (its room
-- allowing, at most `limit`), and its next wake-up is registered, at its next turn, while it
-- still holds jobs back.
local function wake_group(g, now, limit)
  redis.call('ZREM', GWAKE, g)
  local conf = group_conf(g)
  local room = conf[3] and group_room(g, conf) or 0
  if room <= 0 then return end
  local ms, r = read_turn(g, conf[3])
  local turns = rate_turns(conf, ms, r, now)
  -- the turns within this ms go now; the next one, after them, as if they were taken
  unhold(g, math.min(turns, room, limit), now)
  local at = turn_after(conf, ms, r, now, turns)
  local more = redis.call('ZRANGE', HELD, '[' .. g .. '\0', '(' .. g .. '\1', 'BYLEX', 'LIMIT', 0, 1)
  if #more > 0 then
    redis.call('ZADD', GWAKE, at, g)
    lower_next(at)
  end
end

-- The groups' rate wake-ups due by `now` (GWAKE, at most `limit`).
local function wake_groups(now, limit)
  local due = redis.call('ZRANGE', GWAKE, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  for _, g in ipairs(due) do wake_group(g, now, limit) end
end

-- DELAYED (near zset) -> READY for jobs due by `now`; expired ones vanish; and the groups'
-- rate wake-ups due by then. Bounded by limit. Nothing to look at while META.next, which no
-- event of the queue comes before (its first due time and wake-up included), is later.
local function promote(now, limit)
  local marked = next_marked()
  if marked and marked > now then return 0, 0 end
  wake_groups(now, limit)
  local due = redis.call('ZRANGE', DELAYED, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
  local ids, moved, gone = {}, 0, 0
  for i = 1, #due, 2 do
    local id, t = due[i], tonumber(due[i + 1])
    ids[#ids + 1] = id
    local rec = redis.call('HGET', JOBS, id)
    if rec then
      if expired(rec, now) then
        discard(id, rec)
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
