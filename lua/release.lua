#!lua
--[[
  RESERVED -> READY (delay 0) or DELAYED (delay > 0): gives a reserved job back without
  counting the delivery (the try is restored). Used when a consumer is gone before it got the
  job, and for nack with a delay.
  KEYS[1..9] the queue's fixed keys
  ARGV[1] now (ms)  ARGV[2] delay (ms)  ARGV[3] notify channel  ARGV[4..] members
  Returns: {number released (jobs not reserved are left alone), lowered (see publish.lua)}
]]
--@include lib/queue
local now, delay = tonumber(ARGV[1]), tonumber(ARGV[2])
local was_empty = redis.call('EXISTS', READY) == 0
local n = 0
for i = 4, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', RESERVED, id) == 1 then
    local rec = redis.call('HGET', JOBS, id)
    local _, _, tries, deliveries = header(rec)
    rec = with_counts(rec, tries + 1, math.max(deliveries - 1, 0))
    redis.call('HSET', JOBS, id, rec)
    if delay > 0 then
      redis.call('ZADD', DELAYED, now + delay, id)
      lower_next(now + delay)
    else
      make_ready(id, rec, now)
    end
    n = n + 1
  end
end
notify(ARGV[3], was_empty)
return {n, lowered}
