#!lua
--[[
  Opens wheel buckets: moves every job of the given buckets into the near-term DELAYED zset
  (from where promote moves them to READY at their exact due millisecond). Jobs whose ttl has
  already ended are dropped. The caller passes at most a few buckets (each <= lane capacity).
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17..] buckets...: the buckets to open
  ARGV[1] now: the caller's clock (ms)
  ARGV[2..] names...: the bucket names, in the order of KEYS[17..]
  Returns: {moved, expired}
]]
--@include lib/codes
--@include lib/keys
--@include lib/record
--@include lib/jobs
--@include lib/wheel
local now = tonumber(ARGV[1])
local moved, gone = 0, 0
for k = FIRST_EXTRA, #KEYS do
  local bucket, bname = KEYS[k], ARGV[k - FIRST_EXTRA + 2]
  local start, lane = bucket_place(bname)
  local all = redis.call('HGETALL', bucket)
  for i = 1, #all, 2 do
    local id, rec = wheel_job(start, lane, all[i], all[i + 1])
    if expired(rec, now) then
      count_group(group_of(rec), -1)
      gone = gone + 1
    else
      redis.call('HSET', JOBS, id, rec)
      redis.call('ZADD', DELAYED, struct.unpack('>I6', id), id)
      local e = expire_at(rec)
      if e > 0 then redis.call('ZADD', EXPIRE, e, id) end
      moved = moved + 1
    end
  end
  if #all > 0 then
    redis.call('DEL', bucket)
    count_wheel(-(#all / 2))
  end
  redis.call('ZREM', WHEEL, bname)
end
tidy()
return {moved, gone}
