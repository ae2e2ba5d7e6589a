#!lua
--[[
  Extends (or shortens) a reservation: its ttr now ends at now + ttr. A job that is not
  reserved is left alone: touching cannot bring back a reservation that already ran out.
  KEYS[1..9] the queue's fixed keys
  ARGV[1] now (ms)  ARGV[2] ttr (ms)  ARGV[3] member
  Returns: {1 touched / 0 not reserved, lowered (see publish.lua)}
]]
--@include lib/queue
local deadline = tonumber(ARGV[1]) + tonumber(ARGV[2])
if not redis.call('ZSCORE', RESERVED, ARGV[3]) then
  return {0, 0}
end
redis.call('ZADD', RESERVED, deadline, ARGV[3])
lower_next(deadline) -- a shorter ttr: the pump must look earlier
return {1, lowered}
