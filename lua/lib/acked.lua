--[[
  The acked ids a queue remembers, so that a publish repeated after a lost reply is a
  duplicate.
]]
--@include lib/keys

local FORGET_PER_CALL = 64       -- acked ids past their memory dropped per ack (keeps it bounded)
-- Whether ACKED exists, looked at once per call (nil: not yet): a queue remembering no acked
-- id costs a publish no look per job.
local ACKED_ANY = nil

-- Remembers acked ids for `keep` ms: a publish of one of them repeated meanwhile (a retry
-- whose first reply was lost in a failover) is then a duplicate, not a new job. The key
-- expires `keep` ms after the last ack; older entries go a bounded number per call.
local function remember_acked(ids, now, keep)
  if keep <= 0 or #ids == 0 then return end
  local args = {}
  for _, id in ipairs(ids) do
    args[#args + 1] = now
    args[#args + 1] = id
  end
  write_pairs('ZADD', ACKED, args)
  local old = redis.call('ZRANGE', ACKED, '-inf', now - keep, 'BYSCORE', 'LIMIT', 0, FORGET_PER_CALL + #ids)
  if #old > 0 then zrem_many(ACKED, old) end
  redis.call('PEXPIRE', ACKED, keep)
  ACKED_ANY = nil
end

-- Whether `id` was acked less than `keep` ms before `now`.
local function acked_lately(id, now, keep)
  if ACKED_ANY == nil then ACKED_ANY = redis.call('EXISTS', ACKED) == 1 end
  if not ACKED_ANY then return false end
  local t = redis.call('ZSCORE', ACKED, id)
  return t ~= false and tonumber(t) > now - keep
end
