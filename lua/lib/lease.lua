--[[
  Whether a delivery's lease still holds its job.
]]
--@include lib/keys

-- Whether the delivery holding `lease` still holds job `id` at `now`: OK when it does,
-- else why not: a LEASE_* code (negative).
local function lease_check(id, lease, now)
  local deadline = redis.call('ZSCORE', RESERVED, id)
  if deadline then
    if redis.call('HGET', LEASES, id) ~= lease then return CODE.LEASE_TAKEN end
    if tonumber(deadline) <= now then return CODE.LEASE_TTR_EXPIRED end
    return CODE.OK
  end
  if redis.call('HEXISTS', JOBS, id) == 0 then return CODE.LEASE_GONE end
  if redis.call('ZSCORE', DEAD, id) then return CODE.LEASE_DEAD end
  if redis.call('ZSCORE', DELAYED, id) then return CODE.LEASE_DELAYED end
  return CODE.LEASE_READY -- in READY, or held back by its group (HELD)
end

-- A reservation that is still running at `now` (its ttr deadline not passed).
local function reserved_until(id, now)
  local deadline = redis.call('ZSCORE', RESERVED, id)
  return deadline ~= false and tonumber(deadline) > now
end
