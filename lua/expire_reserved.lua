#!lua
--[[
  RESERVED -> READY (tries left) or DEAD (no tries left) for reservations whose ttr passed.
  KEYS[1..10] the queue's fixed keys
  ARGV[1] now (ms)  ARGV[2] limit  ARGV[3] notify channel
  Returns: {back to ready, dead-lettered, expired (ttl ended)}
]]
--@include lib/queue
local was_empty = redis.call('EXISTS', READY) == 0
local back, dead, gone = expire_reservations(tonumber(ARGV[1]), tonumber(ARGV[2]))
tidy()
notify(ARGV[3], was_empty)
return {back, dead, gone}
