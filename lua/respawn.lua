#!lua
--[[
  DEAD -> READY for the oldest `limit` dead jobs, each with one try and a fresh ttl (as lmstfy);
  each forgets its death (NOTES), keeps its last error.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] limit: jobs per call
  ARGV[3] ttl: the fresh ttl (ms, 0 = never expires)
  ARGV[4] notify: the queue's notify channel
  Returns: {number respawned, lowered (see publish.lua)}
]]
--@include lib/codes
--@include lib/keys
--@include lib/dead
--@include lib/notify
local now, limit, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local was_empty = redis.call('EXISTS', READY) == 0
local ids = redis.call('ZRANGE', DEAD, 0, limit - 1)
local n, lowered = 0, 0
for _, id in ipairs(ids) do
  local rec = redis.call('HGET', JOBS, id)
  if rec then -- always, while the invariants hold; never write half a job otherwise
    local _, low = revive(id, rec, now, now, 1, ttl) -- (lib/dead.lua, as kick: ready now)
    lowered = math.max(lowered, low)
    n = n + 1
  else
    redis.call('ZREM', DEAD, id)
  end
end
tidy()
notify(ARGV[4], was_empty)
return {n, lowered}
