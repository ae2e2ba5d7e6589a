#!lua
--[[
  DELAYED -> READY: moves jobs whose due time has come (exact milliseconds); jobs whose ttl
  ended on the way vanish with nothing left behind.
  KEYS[1..10] the queue's fixed keys
  ARGV[1] now (ms)  ARGV[2] limit (jobs per call)  ARGV[3] notify channel
  Returns: {moved, expired}
]]
--@include lib/queue
local was_empty = redis.call('EXISTS', READY) == 0
local moved, gone = promote(tonumber(ARGV[1]), tonumber(ARGV[2]))
tidy()
notify(ARGV[3], was_empty)
return {moved, gone}
