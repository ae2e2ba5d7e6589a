#!lua
--[[
  Fixed-window rate limit for one token and direction (read or write), as lmstfy counts it:
  a refused request does not use up the window.
  KEYS[1] counter: the counter key
  ARGV[1] limit: units per window
  ARGV[2] window: the window (ms)
  ARGV[3] refund: '1' to give one unit back instead
  Returns: 1 allowed, 0 refused (a flag)
]]
if ARGV[3] == '1' then
  if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('DECR', KEYS[1]) end
  return 1
end
local n = redis.call('INCR', KEYS[1])
-- Whenever the counter has no expiry, not only when it was just made: a counter left
-- without one (a failed PEXPIRE, a hand-made key) would otherwise refuse the token forever.
if n == 1 or redis.call('PTTL', KEYS[1]) == -1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if n > tonumber(ARGV[1]) then
  redis.call('DECR', KEYS[1])
  return 0
end
return 1
