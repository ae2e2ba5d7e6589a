#!lua
--[[
  READY -> RESERVED for up to `count` jobs, in priority then due order. First moves what is
  due (DELAYED -> READY) and expires passed reservations, so a consumer never waits on the
  pump. Each reserved job has its tries decremented and its ttr deadline set.
  KEYS[1..9] the queue's fixed keys
  ARGV[1] now (ms)  ARGV[2] ttr (ms)  ARGV[3] count  ARGV[4] promote limit  ARGV[5] notify channel
  ARGV[6] bucket open lead (ms)
  Returns: {lowered, stale, retried, dead, expired, member_1, record_1, member_2, record_2, ...}
    (records as delivered;
    lowered: 1 when the queue's next pump event moved earlier, see publish.lua;
    stale: 1 when a wheel bucket should already be open, i.e. the pump is behind: the caller
    then opens it itself and consumes again;
    retried, dead, expired: jobs this call moved on the way: ttr passed -> READY again, ttr
    passed with no tries left -> DEAD, ttl ended -> gone; for the metrics)
]]
--@include lib/queue
local now, ttr, count, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local was_empty = redis.call('EXISTS', READY) == 0
local retried, dead, gone = expire_reservations(now, limit)
local _, gone2 = promote(now, limit)
gone = gone + gone2
local H = 5
local out = {0, 0, 0, 0, 0}
while #out - H < count * 2 do
  local popped = redis.call('ZPOPMIN', READY, count - (#out - H) / 2)
  if #popped == 0 then break end
  for i = 1, #popped, 2 do
    local id = popped[i]
    local rec = redis.call('HGET', JOBS, id)
    if rec and expired(rec, now) then
      redis.call('HDEL', JOBS, id)
      redis.call('ZREM', EXPIRE, id)
      gone = gone + 1
    elseif rec then
      local _, _, tries, deliveries = header(rec)
      rec = with_counts(rec, tries - 1, deliveries + 1)
      redis.call('HSET', JOBS, id, rec)
      redis.call('ZADD', RESERVED, now + ttr, id)
      out[#out + 1] = id
      out[#out + 1] = rec
    end
  end
end
if #out > H then lower_next(now + ttr) end
out[1], out[3], out[4], out[5] = lowered, retried, dead, gone
local w = first_score(WHEEL)
if w and w - tonumber(ARGV[6]) <= now then out[2] = 1 end
tidy()
notify(ARGV[5], was_empty)
return out
