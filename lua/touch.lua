#!lua
--[[
  Extends (or shortens) a reservation: its ttr now ends at now + ttr. Only a reservation that
  is still running: touching cannot bring back one whose ttr already ran out, even when the
  pump has not moved it yet. With a lease, only the delivery holding it may touch it.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] ttr: the new time to run, from now (ms)
  ARGV[3] member: the job
  ARGV[4] lease: the lease of its delivery ('' = none)
  Returns: {RESERVED (touched) / NOT_FOUND (no running reservation) / a LEASE_* code (the
    lease does not hold the job), lowered (see publish.lua)}
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
--@include lib/lease
local now, id = tonumber(ARGV[1]), ARGV[3]
if ARGV[4] ~= '' then
  local why = lease_check(id, ARGV[4], now)
  if why ~= CODE.OK then return {why, 0} end
elseif not reserved_until(id, now) then
  return {CODE.NOT_FOUND, 0}
end
local deadline = now + tonumber(ARGV[2])
redis.call('ZADD', RESERVED, deadline, id)
local lowered = lower_next(deadline) -- a shorter ttr: the pump must look earlier
return {CODE.RESERVED, lowered}
