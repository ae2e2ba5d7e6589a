#!lua
--[[
  Keeps a queue in its shard's set of queues with settings, listed while they hold no job,
  after a change of its settings (the engine's keep_listed: the queue's settings are in
  another slot, read just before). Best effort: a settings change never fails for it.
  KEYS[1] configured: the shard's set of queues with settings
  ARGV[1] queue: ns/q
  ARGV[2] has: '1' when the queue has settings of its own or of its groups, else '0'
  Returns: 1
]]
if ARGV[2] == '1' then
  redis.call('SADD', KEYS[1], ARGV[1])
else
  redis.call('SREM', KEYS[1], ARGV[1])
end
return 1
