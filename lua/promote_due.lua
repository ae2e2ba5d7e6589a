#!lua
--[[
  DELAYED -> READY: moves jobs whose due time has come (exact milliseconds); jobs whose ttl
  ended on the way vanish with nothing left behind.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] limit: jobs per call
  ARGV[3] notify: the queue's notify channel
  Returns: {moved, expired}
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
--@include lib/promote
--@include lib/notify
local was_empty = redis.call('EXISTS', READY) == 0
local moved, gone = promote(tonumber(ARGV[1]), tonumber(ARGV[2]))
tidy()
notify(ARGV[3], was_empty)
return {moved, gone}
