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
  ARGV[4..] fields...: 2 values per field: `p` (paused: 1), `c` (concurrency limit), `q` (rate:
    `<n> <per ms>`), then its value ('' = remove it)
  Returns: {back, left, lowered}: held jobs this call brought back into READY, held jobs left
    that the group's settings would let go now (the caller calls again while left > 0), and,
    under a rate (whose held jobs go one turn at a time: lib/promote.lua), the time of the
    group's next turn when it lowered META.next (else 0: the caller signals the shard)
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
--@include lib/promote
local now, g, limit = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
for i = 4, #ARGV, 2 do
  local f = ARGV[i] .. ':' .. g
  if ARGV[i + 1] == '' then redis.call('HDEL', GCONF, f) else redis.call('HSET', GCONF, f, ARGV[i + 1]) end
  if ARGV[i] == 'q' then
    redis.call('HDEL', GCONF, 'a:' .. g) -- a new or no rate: its turns start afresh
    redis.call('ZREM', GWAKE, g)
  end
end
local conf = group_conf(g)
local room = group_room(g, conf)
if conf[3] and room > 0 then
  -- under a rate, what the group holds goes one turn at a time (its wake-ups), not at once
  local held = redis.call('ZRANGE', HELD, '[' .. g .. '\0', '(' .. g .. '\1', 'BYLEX', 'LIMIT', 0, 1)
  if #held == 0 then return {0, 0, 0} end
  redis.call('ZADD', GWAKE, 'LT', now, g)
  wake_groups(now, 1)
  local at = redis.call('ZSCORE', GWAKE, g)
  return {0, 0, at and lower_next(tonumber(at)) == 1 and tonumber(at) or 0}
end
local back = unhold(g, math.min(room, limit), now)
local left = 0
if room > back then
  left = redis.call('ZLEXCOUNT', HELD, '[' .. g .. '\0', '(' .. g .. '\1')
  if left > room - back then left = room - back end
end
return {back, left, 0}
