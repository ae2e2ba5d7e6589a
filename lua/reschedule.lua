#!lua
--[[
  After a pump step: sets the queue's next wake-up to the earliest of the event the step found
  and every signal received since the claim. Never loses a wake-up.
  KEYS[1] the shard's schedule zset  KEYS[2] the shard's pending hash
  KEYS[3] the shard's epoch counter (fencing; see leader.lua)
  ARGV[1] ns/q  ARGV[2] next event found by the step (ms, -1 = none)
  ARGV[3] the caller's leadership epoch: an older one gets the error FENCED
  Returns: the wake-up set (ms), or -1 when the queue needs none
]]
if redis.call('GET', KEYS[3]) ~= ARGV[3] then
  return redis.error_reply('FENCED stale pump leader epoch ' .. ARGV[3])
end
local q, nxt = ARGV[1], tonumber(ARGV[2])
local p = redis.call('HGET', KEYS[2], q)
if p then
  p = tonumber(p)
  if nxt < 0 or p < nxt then nxt = p end
  redis.call('HDEL', KEYS[2], q)
end
if nxt < 0 then
  redis.call('ZREM', KEYS[1], q)
else
  redis.call('ZADD', KEYS[1], nxt, q)
end
return nxt
