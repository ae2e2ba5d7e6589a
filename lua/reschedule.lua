#!lua
--[[
  After a pump step: sets the queue's next wake-up to the earliest of the event the step found
  and every signal received since the claim. Never loses a wake-up. A queue the step found
  empty, with no signal since, leaves the shard's registry too (it is registered again by its
  next publish), so the registry, and the pump's size pass, hold live queues only.
  KEYS[1] schedule: the shard's schedule zset
  KEYS[2] pending: the shard's pending hash
  KEYS[3] epoch: the shard's epoch counter (fencing; see leader.lua)
  KEYS[4] queues: the shard's queue set
  ARGV[1] queue: ns/q
  ARGV[2] next: the next event found by the step (ms, -1 = none)
  ARGV[3] epoch: the caller's leadership epoch
  ARGV[4] empty: '1' when the step found the queue empty (no job in any state)
  Returns: {OK, the wake-up set (ms) or -1 when the queue needs none}, or {FENCED} when the
    epoch is not the shard's current one (nothing changed)
]]
--@include lib/codes
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return {CODE.FENCED} end
local q, nxt = ARGV[1], tonumber(ARGV[2])
local p = redis.call('HGET', KEYS[2], q)
if p then
  p = tonumber(p)
  if nxt < 0 or p < nxt then nxt = p end
  redis.call('HDEL', KEYS[2], q)
end
if nxt < 0 then
  redis.call('ZREM', KEYS[1], q)
  if ARGV[4] == '1' then redis.call('SREM', KEYS[4], q) end
else
  redis.call('ZADD', KEYS[1], nxt, q)
end
return {CODE.OK, nxt}
