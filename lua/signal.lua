#!lua
--[[
  A publisher (or consumer) tells a queue's shard that the queue has an event at `at` earlier
  than the pump knew of; it also registers the queue. Called after the queue's own script.
  KEYS[1] schedule: the shard's schedule zset
  KEYS[2] pending: the shard's pending hash
  KEYS[3] queues: the shard's queue set
  ARGV[1] queue: ns/q
  ARGV[2] at: the event time (ms), or -1 to register only
  Returns: 1
]]
local q, t = ARGV[1], tonumber(ARGV[2])
redis.call('SADD', KEYS[3], q)
if t >= 0 then
  redis.call('ZADD', KEYS[1], 'LT', t, q)
  local p = redis.call('HGET', KEYS[2], q)
  if not p or t < tonumber(p) then redis.call('HSET', KEYS[2], q, t) end
end
return 1
