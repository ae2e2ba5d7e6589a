#!lua
--[[
  RESERVED -> READY (delay 0) or DELAYED (delay > 0): gives reserved jobs back.
  Mode 0 (give back): the delivery is not counted, the try is restored; used when a consumer
  is gone before it got the job.
  Mode 1 (release, the consumer's nack): the delivery counts, as if its ttr had passed now; a
  job with no tries left goes to DEAD, a job whose ttl ended is removed.
  KEYS[1..9] the queue's fixed keys
  ARGV[1] now (ms)  ARGV[2] delay (ms)  ARGV[3] notify channel  ARGV[4] mode  ARGV[5..] members
  Returns: {state per member: 0 not reserved (left alone), 1 delayed, 2 ready, 4 dead,
            5 expired (ttl ended); lowered (see publish.lua)}
]]
--@include lib/queue
local now, delay, nack = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[4] == '1'
local was_empty = redis.call('EXISTS', READY) == 0
local out = {}
for i = 5, #ARGV do
  local id = ARGV[i]
  local st = 0
  if redis.call('ZREM', RESERVED, id) == 1 then
    local rec = redis.call('HGET', JOBS, id)
    local _, _, tries, deliveries = header(rec)
    if not nack then
      rec = with_counts(rec, tries + 1, math.max(deliveries - 1, 0))
      redis.call('HSET', JOBS, id, rec)
    end
    if nack and expired(rec, now) then
      redis.call('HDEL', JOBS, id)
      redis.call('ZREM', EXPIRE, id)
      st = 5
    elseif nack and tries == 0 then
      redis.call('ZADD', DEAD, now, id)
      redis.call('ZREM', EXPIRE, id) -- DEAD never expires (as in lmstfy)
      st = 4
    elseif delay > 0 then
      redis.call('ZADD', DELAYED, now + delay, id)
      lower_next(now + delay)
      st = 1
    else
      make_ready(id, rec, now)
      st = 2
    end
  end
  out[#out + 1] = st
end
tidy()
notify(ARGV[3], was_empty)
out[#out + 1] = lowered
return out
