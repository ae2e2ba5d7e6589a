#!lua
--[[
  The pump claims the due queues of its shard: each wake-up is pushed to `lease` (a re-check
  should the pump die mid-step) and the queue's pending signals are cleared; signals that
  arrive after this are kept in `pending` and folded in by reschedule.lua.
  KEYS[1] the shard's schedule zset  KEYS[2] the shard's pending hash
  KEYS[3] the shard's epoch counter (fencing; see leader.lua)
  ARGV[1] now (ms)  ARGV[2] limit  ARGV[3] lease end (ms)
  ARGV[4] the caller's leadership epoch: an older one gets the error FENCED
  Returns: the claimed queues (ns/q)
]]
if redis.call('GET', KEYS[3]) ~= ARGV[4] then
  return redis.error_reply('FENCED stale pump leader epoch ' .. ARGV[4])
end
local due = redis.call('ZRANGE', KEYS[1], '-inf', tonumber(ARGV[1]), 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]))
for _, q in ipairs(due) do
  redis.call('ZADD', KEYS[1], tonumber(ARGV[3]), q)
  redis.call('HDEL', KEYS[2], q)
end
return due
