#!lua
--[[
  Destroys a queue in every state, one bounded step at a time: each call deletes the given
  wheel buckets; the final call (when the wheel is empty) unlinks every other key, the results
  of acked jobs included.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17] results: the results of acked jobs (HASH)
  KEYS[18] results_due: their keep-until times (ZSET)
  KEYS[19] keyed: throttle windows and Idempotency-Key answers (HASH)
  KEYS[20] keyed_due: their keep-until times (ZSET)
  KEYS[21..] buckets...: wheel buckets to delete
  ARGV[1] final: '1' for the final step
  ARGV[2..] names...: the bucket names, in the order of KEYS[21..]
  Returns: {jobs deleted, 1 when the queue is gone else 0}
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
local RESULTS, RESULTS_DUE, FIRST_BUCKET = KEYS[FIRST_EXTRA], KEYS[FIRST_EXTRA + 1], FIRST_EXTRA + 4
local KEYED, KEYED_DUE = KEYS[FIRST_EXTRA + 2], KEYS[FIRST_EXTRA + 3]
local deleted = 0
for k = FIRST_BUCKET, #KEYS do
  local n = redis.call('HLEN', KEYS[k])
  if n > 0 then
    redis.call('DEL', KEYS[k])
    count_wheel(-n)
    deleted = deleted + n
  end
  redis.call('ZREM', WHEEL, ARGV[k - FIRST_BUCKET + 2])
end
if ARGV[1] ~= '1' or redis.call('ZCARD', WHEEL) > 0 then return {deleted, 0} end
deleted = deleted + redis.call('HLEN', JOBS)
redis.call('UNLINK', META, WHEEL, DELAYED, READY, RESERVED, DEAD, JOBS, EXPIRE, ACKED, LEASES, NOTES,
  GROUPS, HELD, GWAKE,
  RESULTS, RESULTS_DUE, KEYED, KEYED_DUE)
return {deleted, 1}
