#!lua
--[[
  Acks (deletes) a job in any state and publishes a new one in the same queue, atomically
  (lmstfy's PUT /api/{ns}/{q}/job/{id}, which lmstfy itself does in two steps). With a lease,
  only while that delivery still holds the old job; otherwise nothing changes.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17..] buckets...: wheel buckets (the new job's, the old job's)
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] lane_capacity: jobs per wheel bucket
  ARGV[3] bucket_width: the time window of a wheel bucket (ms)
  ARGV[4] notify: the queue's notify channel
  ARGV[5] old_member: the job acked
  ARGV[6] old_bucket_index: its bucket's KEYS index (0 = none)
  ARGV[7] old_bucket: its bucket's name
  ARGV[8] member: the new job
  ARGV[9] due: its due time (ms)
  ARGV[10] record: its record
  ARGV[11] bucket_index: its bucket's KEYS index (0 = none)
  ARGV[12] bucket: its bucket's name
  ARGV[13] wheel: 0, or where to place the new job in that bucket (as publish's: 1 or 2, plus
    4 when its record is its short wheel value)
  ARGV[14] open_lead: how long before its window a wheel bucket opens (ms)
  ARGV[15] remember_acked: how long acked ids are remembered (ms)
  ARGV[16] lease: the lease of the old job's delivery ('' = none)
  Returns: {old job's code (NOT_FOUND, DELAYED, READY, RESERVED, DEAD), new job's code (as
    publish), lowered (as publish)}, or {LEASE_* code, NOT_FOUND, 0} when the lease no longer
    holds the old job, or {FULL, FULL, 0} when the new job would take the queue beyond its
    max_size (CONF; the old job counts as gone); nothing changed then
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
--@include lib/acked
--@include lib/wheel
--@include lib/remove
--@include lib/place
--@include lib/lease
--@include lib/notify
local now, cap, width, channel = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local keep = tonumber(ARGV[15])
if ARGV[16] ~= '' then
  local why = lease_check(ARGV[5], ARGV[16], now)
  if why ~= CODE.OK then return {why, CODE.NOT_FOUND, 0} end
end
local okidx, nkidx = tonumber(ARGV[6]), tonumber(ARGV[11])
local max = tonumber(redis.call('HGET', CONF, 'max_size') or '')
if max and redis.call('HEXISTS', JOBS, ARGV[8]) == 0 then
  local n = redis.call('HLEN', JOBS) + tonumber(redis.call('HGET', META, 'w') or '0')
  if redis.call('HEXISTS', JOBS, ARGV[5]) == 1
      or (okidx > 0 and wheel_has(KEYS[okidx], ARGV[5])) then
    n = n - 1
  end
  if n >= max then return {CODE.FULL, CODE.FULL, 0} end
end
local was_empty = redis.call('EXISTS', READY) == 0
local old = remove_job(ARGV[5], okidx > 0 and KEYS[okidx], ARGV[7], now)
if old ~= CODE.NOT_FOUND then
  if ARGV[5] == ARGV[8] then
    redis.call('ZREM', ACKED, ARGV[5]) -- the same id again: a replacement, not a duplicate
  else
    remember_acked({ARGV[5]}, now, keep)
  end
end
local st, lowered = place(ARGV[8], tonumber(ARGV[9]), ARGV[10], nkidx > 0 and KEYS[nkidx], ARGV[12],
  tonumber(ARGV[13]), now, cap, width, tonumber(ARGV[14]), keep)
tidy()
notify(channel, was_empty)
return {old, st, lowered}
