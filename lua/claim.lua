#!lua
--[[
  The pump claims the due queues of its shard: each wake-up is pushed to `lease_end` (a
  re-check should the pump die mid-step) and the queue's pending signals are cleared; signals
  that arrive after this are kept in `pending` and folded in by reschedule.lua.
  KEYS[1] schedule: the shard's schedule zset
  KEYS[2] pending: the shard's pending hash
  KEYS[3] epoch: the shard's epoch counter (fencing; see leader.lua)
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] limit: queues per call
  ARGV[3] lease_end: when a claimed queue is looked at again (ms)
  ARGV[4] epoch: the caller's leadership epoch
  Returns: {OK, queue_1 (ns/q), ...}, or {FENCED} when the epoch is not the shard's current
    one (nothing changed)
]]
--@include lib/codes
if redis.call('GET', KEYS[3]) ~= ARGV[4] then return {CODE.FENCED} end
local due = redis.call('ZRANGE', KEYS[1], '-inf', tonumber(ARGV[1]), 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]))
local out = {CODE.OK}
for _, q in ipairs(due) do
  redis.call('ZADD', KEYS[1], tonumber(ARGV[3]), q)
  redis.call('HDEL', KEYS[2], q)
  out[#out + 1] = q
end
return out
