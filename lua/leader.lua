#!lua
--[[
  Acquires or renews a shard's pump leadership (SET NX PX with renewal, as one script).
  KEYS[1] the shard's leader key
  ARGV[1] this instance's token  ARGV[2] lease (ms)  ARGV[3] '1' to release instead
  Returns: 1 when this token holds the lease (for ARGV[2] ms from now), else 0
]]
local cur = redis.call('GET', KEYS[1])
if ARGV[3] == '1' then
  if cur == ARGV[1] then redis.call('DEL', KEYS[1]) end
  return 0
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
