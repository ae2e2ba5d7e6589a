#!lua
--[[
  Sets a queue's next pump wake-up in its shard schedule after a pump step, unless a publisher
  lowered it meanwhile (then the earlier of the two wins). Never loses a wake-up.
  KEYS[1] the shard's schedule zset
  ARGV[1] ns/q  ARGV[2] score seen when the step began  ARGV[3] next event ms (-1 = none)
  Returns: 1 when the wake-up was replaced, 0 when an earlier one was kept
]]
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
local nxt = tonumber(ARGV[3])
if cur and tonumber(cur) == tonumber(ARGV[2]) then
  if nxt < 0 then
    redis.call('ZREM', KEYS[1], ARGV[1])
  else
    redis.call('ZADD', KEYS[1], nxt, ARGV[1])
  end
  return 1
end
if nxt >= 0 then redis.call('ZADD', KEYS[1], 'LT', nxt, ARGV[1]) end
return 0
