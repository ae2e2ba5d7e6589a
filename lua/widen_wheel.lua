#!lua
--[[
  Widens a queue's short wheel entries back into whole ones (the 16-byte id and the record),
  the only form a version without short entries reads: a downgrade (docs/operations.md).
  Clears META.s first, in every call, so a version that writes whole entries into this wheel
  afterwards leaves no short-only mark behind it.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17..] buckets...: wheel buckets to widen (each at most the lane capacity)
  ARGV[1..] names...: the bucket names, in the order of KEYS[17..]
  Returns: the number of entries widened
]]
--@include lib/codes
--@include lib/keys
--@include lib/wheel
local widened = 0
redis.call('HDEL', META, 's')
for k = FIRST_EXTRA, #KEYS do
  local bucket = KEYS[k]
  local start, lane = bucket_place(ARGV[k - FIRST_EXTRA + 1])
  local all = redis.call('HGETALL', bucket)
  for i = 1, #all, 2 do
    if #all[i] == SHORT then
      local id, rec = wheel_job(start, lane, all[i], all[i + 1])
      redis.call('HDEL', bucket, all[i])
      redis.call('HSET', bucket, id, rec)
      widened = widened + 1
    end
  end
end
return widened
