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
--@include lib/record
--@include lib/jobs
--@include lib/notes
--@include lib/notify
local now, limit, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local was_empty = redis.call('EXISTS', READY) == 0
local ids = redis.call('ZRANGE', DEAD, 0, limit - 1)
local exp = 0
if ttl > 0 then exp = now + ttl end
local n, lowered = 0, 0
for _, id in ipairs(ids) do
  local rec = redis.call('HGET', JOBS, id)
  if rec then -- always, while the invariants hold; never write half a job otherwise
    rec = with_due(with_tries_expire(rec, 1, exp), now) -- (a debounce's: due now)
    redis.call('HSET', JOBS, id, rec)
    make_ready(id, rec, now)
    forget_death(id)
    if exp > 0 then
      redis.call('ZADD', EXPIRE, exp, id)
      lowered = math.max(lowered, lower_next(exp))
    end
    n = n + 1
  end
end
if #ids > 0 then zrem_many(DEAD, ids) end
tidy()
notify(ARGV[4], was_empty)
return {n, lowered}
