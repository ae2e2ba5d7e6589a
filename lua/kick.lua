#!lua
--[[
  DEAD -> READY, or DELAYED until now + delay: one dead job back to work, with `tries` tries
  and a fresh ttl (lmstfy's respawn rule when the caller gives none: 1 try, the default ttl).
  Its death is forgotten (NOTES), its last error kept.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17..] bucket...: the job's wheel bucket, when its id has one (0 or 1 key): a job
    resting there is not dead (FORBIDDEN)
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] member: the job
  ARGV[3] delay: how long until it is ready (ms; 0 = now)
  ARGV[4] tries: its tries from now on
  ARGV[5] ttl: its fresh ttl (ms, 0 = never expires)
  ARGV[6] notify: the queue's notify channel
  Returns: {OK / NOT_FOUND / FORBIDDEN (not dead), the state code it is in afterwards (0:
    none), its record ('' when none), its note ('' when none), lowered (see publish.lua)}
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
--@include lib/wheel
--@include lib/notify
--@include lib/dead
local now, id, delay = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local rec = redis.call('HGET', JOBS, id)
if not rec then
  local bucket = KEYS[FIRST_EXTRA]
  if bucket then rec = wheel_get(bucket, id) end
  if rec then return {CODE.FORBIDDEN, CODE.DELAYED, rec, '', 0} end
  return {CODE.NOT_FOUND, 0, '', '', 0}
end
if not redis.call('ZSCORE', DEAD, id) then
  return {CODE.FORBIDDEN, state_of(id), rec, redis.call('HGET', NOTES, id) or '', 0}
end
local was_empty = redis.call('EXISTS', READY) == 0
local st, lowered
st, lowered, rec = revive(id, rec, now, now + delay, tonumber(ARGV[4]), tonumber(ARGV[5]))
notify(ARGV[6], was_empty)
return {CODE.OK, st, rec, redis.call('HGET', NOTES, id) or '', lowered}
