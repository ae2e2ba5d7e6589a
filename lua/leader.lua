#!lua
--[[
  Acquires or renews a shard's pump leadership (SET NX PX with renewal, as one script), with a
  fencing epoch: every new leadership increments the shard's epoch, and the shard's pump
  scripts (claim, reschedule) refuse a step that carries an older one, so a stalled leader
  that still believes it leads cannot touch the shard's schedule once another one took over.
  KEYS[1] leader: the shard's leader key
  KEYS[2] epoch: the shard's epoch counter
  ARGV[1] token: this instance's token
  ARGV[2] lease: how long the leadership is held (ms)
  ARGV[3] release: '1' to give the leadership up instead
  Returns: the epoch of this token's leadership (for `lease` ms from now); when another token
    holds it, minus the ms its lease has left (a follower asks again then, not sooner); 0
    when given up
]]
local cur = redis.call('GET', KEYS[1])
if ARGV[3] == '1' then
  if cur == ARGV[1] then redis.call('DEL', KEYS[1]) end
  return 0
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return redis.call('INCR', KEYS[2])
end
return -math.max(redis.call('PTTL', KEYS[1]), 1)
