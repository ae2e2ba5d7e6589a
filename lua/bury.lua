#!lua
--[[
  RESERVED, READY or DELAYED (a wheel bucket included) -> DEAD with the reason `buried` and a
  text, kept as the job's last error. With a lease, only while that delivery holds the job.
  A job resting in a wheel bucket moves into JOBS (its id still names the bucket; every lookup
  by id looks in JOBS first).
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17..] bucket...: the job's wheel bucket, when its id has one (0 or 1 key)
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] member: the job
  ARGV[3] bucket_name: its wheel bucket's name ('' = none)
  ARGV[4] lease: the lease of its delivery ('' = none)
  ARGV[5] text: why it was buried ('' = keep its last error)
  Returns: {OK / NOT_FOUND (none, or past its ttl) / FORBIDDEN (already dead) / a LEASE_* code,
    the state code it is in afterwards (0: none), its record ('' when none), its note ('' when none), lowered (0)}
]]
--@include lib/codes
--@include lib/keys
--@include lib/record
--@include lib/jobs
--@include lib/notes
--@include lib/wheel
--@include lib/lease
local now, id, bname, lease, text = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local bucket = KEYS[FIRST_EXTRA]
if lease ~= '' then
  local why = lease_check(id, lease, now)
  if why ~= CODE.OK then return {why, 0, '', '', 0} end
end
local rec = redis.call('HGET', JOBS, id)
if rec then
  local st = state_of(id, rec)
  if st == CODE.DEAD or st == CODE.NOT_FOUND then
    return {CODE.FORBIDDEN, st, rec, redis.call('HGET', NOTES, id) or '', 0}
  end
  -- past its ttl: gone (the pump removes it), never dead, which would keep it for good
  if expired(rec, now) then return {CODE.NOT_FOUND, 0, '', '', 0} end
  if st == CODE.READY then
    unready(id, rec, now)
  else
    redis.call('ZREM', st == CODE.RESERVED and RESERVED or DELAYED, id)
  end
  if st == CODE.RESERVED then
    redis.call('HDEL', LEASES, id)
    unreserve(rec, now)
  end
else
  if bucket then rec = wheel_get(bucket, id) end
  if not rec or expired(rec, now) then return {CODE.NOT_FOUND, 0, '', '', 0} end
  unwheel(bucket, bname, id)
  redis.call('HSET', JOBS, id, rec)
end
kill(id, DIED_BURIED, now, text)
return {CODE.OK, CODE.DEAD, rec, redis.call('HGET', NOTES, id) or '', 0}
