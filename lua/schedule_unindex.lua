#!lua
--[[
  Takes a schedule out of its shard's timer index, unless someone set its timer since the
  firer read it (a resume, a PUT, another firer): the firer found it paused or deleted.
  KEYS[1] timers: the shard's schedule timers zset
  ARGV[1] member: ns/q/name
  ARGV[2] score: the timer the firer set when it claimed the schedule
  Returns: 1 removed, 0 left as it is
]]
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) == tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
