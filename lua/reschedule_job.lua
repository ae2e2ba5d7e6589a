#!lua
--[[
  READY or DELAYED (a wheel bucket included) -> DELAYED until `due`, or READY when `due` is not
  after now (due now, then: a time already past is not kept, so its place in READY, its
  lateness and the queue listing's agree): one job's new due time. A job resting in a wheel bucket moves into JOBS and the
  `delayed` zset (its id still names the bucket; every lookup by id looks in JOBS first).
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17..] bucket...: the job's wheel bucket, when its id has one (0 or 1 key)
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] member: the job
  ARGV[3] bucket_name: its wheel bucket's name ('' = none)
  ARGV[4] due: the new due time (ms)
  ARGV[5] notify: the queue's notify channel
  Returns: {OK / NOT_FOUND / FORBIDDEN (reserved or dead) / TOO_LATE (the due time is at or
    past the job's ttl end), the state code it is in afterwards (0: none), its record ('' when
    none), its note ('' when none), lowered (see publish.lua)}
]]
--@include lib/codes
--@include lib/keys
--@include lib/record
--@include lib/jobs
--@include lib/wheel
--@include lib/notify
local now, id, bname, due = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])
local bucket = KEYS[FIRST_EXTRA]
local rec = redis.call('HGET', JOBS, id)
local st, wheeled = CODE.NOT_FOUND, false
if rec then
  st = state_of(id, rec)
elseif bucket then
  rec = wheel_get(bucket, id)
  if rec then st, wheeled = CODE.DELAYED, true end
end
if not rec then return {CODE.NOT_FOUND, 0, '', '', 0} end
local note = redis.call('HGET', NOTES, id) or ''
if st ~= CODE.READY and st ~= CODE.DELAYED then return {CODE.FORBIDDEN, st, rec, note, 0} end
local e = expire_at(rec)
if e > 0 and math.max(due, now) >= e then return {CODE.TOO_LATE, st, rec, note, 0} end
local was_empty = redis.call('EXISTS', READY) == 0
local lowered = 0
-- the due time its record carries, when its id does not say it (not one already past: from now)
local moved = with_due(rec, math.max(due, now), id)
if wheeled or moved ~= rec then
  rec = moved
  redis.call('HSET', JOBS, id, rec)
end
if wheeled then
  unwheel(bucket, bname, id)
  if e > 0 then
    redis.call('ZADD', EXPIRE, e, id)
    lowered = lower_next(e)
  end
elseif st == CODE.READY then
  unready(id, rec, now)
else
  redis.call('ZREM', DELAYED, id)
end
if due > now then
  delay_until(id, due) -- the queue's long-polls hear of it (notify)
  lowered = math.max(lowered, lower_next(due))
  st = CODE.DELAYED
else
  make_ready(id, rec, now) -- due now, as its record says: behind the jobs already due
  st = CODE.READY
end
notify(ARGV[5], was_empty)
return {CODE.OK, st, rec, note, lowered}
