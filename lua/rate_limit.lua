#!lua
--[[
  Fixed-window rate limit for one token and direction (read or write), as lmstfy counts it:
  a refused request does not use up the window.
  KEYS[1] counter: the counter key
  ARGV[1] limit: units per window
  ARGV[2] window: the window (ms)
  ARGV[3] refund: '1' to give one unit back instead
  Returns: the ms left in the window when allowed (at least 1), 0 refused; a refund: 1.
  A refund is for the window that counted the unit: the caller gives none back once that
  window's time is over, and never takes the counter below 0.
]]
if ARGV[3] == '1' then
  if tonumber(redis.call('GET', KEYS[1]) or '0') > 0 then redis.call('DECR', KEYS[1]) end
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
return math.max(redis.call('PTTL', KEYS[1]), 1)
