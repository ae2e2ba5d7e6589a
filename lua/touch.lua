#!lua
--[[
  Extends (or shortens) a reservation: its ttr now ends at now + ttr. Only a reservation that
  is still running: touching cannot bring back one whose ttr already ran out, even when the
  pump has not moved it yet. With a lease, only the delivery holding it may touch it.
  KEYS[1..10] the queue's fixed keys
  ARGV[1] now (ms)  ARGV[2] ttr (ms)  ARGV[3] member  ARGV[4] lease ('' = none)
  Returns: {1 touched / 0 not reserved / -code (the lease does not hold the job: codes of
    lease_check in lib/queue.lua), lowered (see publish.lua)}
]]
--@include lib/queue
local now, id = tonumber(ARGV[1]), ARGV[3]
if ARGV[4] ~= '' then
  local why = lease_check(id, ARGV[4], now)
  if why > 0 then return {-why, 0} end
elseif not reserved_until(id, now) then
  return {0, 0}
end
local deadline = now + tonumber(ARGV[2])
redis.call('ZADD', RESERVED, deadline, id)
lower_next(deadline) -- a shorter ttr: the pump must look earlier
return {1, lowered}
