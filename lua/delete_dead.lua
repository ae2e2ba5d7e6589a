#!lua
--[[
  Deletes the oldest `limit` dead jobs, leaving nothing of them behind.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] limit: jobs per call
  Returns: number deleted
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
local popped = redis.call('ZPOPMIN', DEAD, tonumber(ARGV[1]))
for i = 1, #popped, 2 do drop(popped[i]) end
tidy()
return #popped / 2
