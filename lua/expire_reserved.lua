#!lua
--[[
  RESERVED -> READY (tries left; DELAYED while a retry backoff runs) or DEAD (no tries left) for reservations whose ttr passed.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] limit: jobs per call
  ARGV[3] notify: the queue's notify channel
  ARGV[4] seed: a random number in [0, 1): the jitter of retry backoffs (lib/retry.lua retry)
  Returns: {back to ready, dead-lettered, expired (ttl ended)}
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
--@include lib/retry
--@include lib/notify
local was_empty = redis.call('EXISTS', READY) == 0
local back, dead, gone = expire_reservations(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4]))
tidy()
notify(ARGV[3], was_empty)
return {back, dead, gone}
