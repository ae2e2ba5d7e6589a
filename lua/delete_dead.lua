#!lua
--[[
  Deletes the oldest `limit` dead jobs, leaving nothing of them behind.
  KEYS[1..10] the queue's fixed keys
  ARGV[1] limit
  Returns: number deleted
]]
--@include lib/queue
local popped = redis.call('ZPOPMIN', DEAD, tonumber(ARGV[1]))
for i = 1, #popped, 2 do redis.call('HDEL', JOBS, popped[i]) end
tidy()
return #popped / 2
