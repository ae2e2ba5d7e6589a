#!lua
--[[
  Changes one group's settings (GCONF: paused, concurrency limit, rate limit) and brings back
  into READY what its group held back and may now go: all of it once a pause ends (up to
  `limit` per call), as many as the concurrency limit leaves room for; under a rate, one per
  turn from now on. Validated in Python
  first (cluster_dq/engine/groups.py). A rate limit changed or removed starts afresh.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] group: the group
  ARGV[3] limit: held jobs brought back per call
  ARGV[4] owed: with no field, held jobs an earlier call owed (its `left`): this call brings
    back up to `limit` of them
  ARGV[5] max_fields: the most fields GCONF may hold (4 per group at most): a change that
    gives settings to a group that has none is refused beyond it, nothing written
  ARGV[6..] fields...: 2 values per field: `p` (paused: 1), `c` (concurrency limit), `q` (rate:
    `<n> <per ms>`), then its value ('' = remove it). The same settings again change nothing
    and bring nothing back (a repeat after a lost reply)
  Returns: {back, left, lowered, refused}: held jobs this call brought back into READY, held jobs left
    that the group's settings would let go now (the caller calls again while left > 0), and,
    under a rate (whose held jobs go one turn at a time: lib/promote.lua), the time of the
    group's next turn when it lowered META.next (else 0: the caller signals the shard); refused:
    1 when max_fields refused the change (nothing written), else 0
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
--@include lib/promote
local now, g, limit, owed = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local FIELDS = {'p:' .. g, 'c:' .. g, 'q:' .. g}
local function held_left(room)
  local left = redis.call('ZLEXCOUNT', HELD, '[' .. g .. '\0', '(' .. g .. '\1')
  return math.min(left, room)
end
if #ARGV < 6 then -- no change: the rest of what an earlier call owed
  local back = unhold(g, math.min(owed, limit), now)
  return {back, held_left(owed - back), 0, 0}
end
local old = redis.call('HMGET', GCONF, unpack(FIELDS))
if not (old[1] or old[2] or old[3]) and redis.call('HLEN', GCONF) >= tonumber(ARGV[5]) then
  for i = 7, #ARGV, 2 do
    if ARGV[i] ~= '' then return {0, 0, 0, 1} end -- a new group's settings, one too many
  end
end
for i = 6, #ARGV, 2 do
  local f = ARGV[i] .. ':' .. g
  if ARGV[i + 1] == '' then redis.call('HDEL', GCONF, f) else redis.call('HSET', GCONF, f, ARGV[i + 1]) end
end
local new = redis.call('HMGET', GCONF, unpack(FIELDS))
-- The same settings again (a repeat after a lost reply, a PATCH of what is there): nothing
-- more; its first call let go what the change allowed.
if old[1] == new[1] and old[2] == new[2] and old[3] == new[3] then return {0, 0, 0, 0} end
if old[3] ~= new[3] then
  redis.call('HDEL', GCONF, 'a:' .. g) -- a new or no rate: its turns start afresh
  redis.call('ZREM', GWAKE, g)
end
local conf = group_conf(g)
local room = group_room(g, conf)
if conf[3] and room > 0 then
  -- under a rate, what the group holds goes one turn at a time (its wake-ups), not at once
  if held_left(1) == 0 then return {0, 0, 0, 0} end
  wake_group(g, now, limit)
  local at = redis.call('ZSCORE', GWAKE, g)
  return {0, 0, at and lower_next(tonumber(at)) == 1 and tonumber(at) or 0, 0}
end
local back = unhold(g, math.min(room, limit), now)
return {back, room > back and held_left(room - back) or 0, 0, 0}
