--[[
  Places one new job (republish): READY, DELAYED or a wheel bucket, or a duplicate.
]]
--@include lib/keys
--@include lib/record
--@include lib/jobs
--@include lib/acked
--@include lib/wheel

-- Whether the queue is known to exist (it holds a job) in this call: looked at once.
local LIVE = false
-- false, or (a caller placing many jobs) a table id -> expiry ms: the jobs' EXPIRE entries,
-- written in one ZADD by `flush_expiring` at the end of the call.
local EXPIRE_LATER = false

local function flush_expiring()
  local args = {}
  for id, e in pairs(EXPIRE_LATER) do
    args[#args + 1] = e
    args[#args + 1] = id
  end
  write_pairs('ZADD', EXPIRE, args)
  EXPIRE_LATER = {}
end

-- Places one new job (publish, republish). Returns its code (DUPLICATE, WHEEL, DELAYED or
-- READY) and the `lowered` flag: 1 when META.next moved earlier or the queue came into being.
-- `bucket`: the job's wheel bucket, looked in for a duplicate; the job goes there if `wheel`.
-- `wheel`: 0, or 1 / 2 (commands.INTO / INTO_NEW) to place it in that bucket, plus
-- SHORT_VALUE when `rec` is its short wheel value.
local function place(id, due, rec, bucket, bname, wheel, now, cap, width, lead, keep)
  local val = rec
  if wheel >= SHORT_VALUE then rec = wheel_record(due, val) end
  if redis.call('HEXISTS', JOBS, id) == 1 or (bucket and wheel_has(bucket, id))
      or acked_lately(id, now, keep) then
    return CODE.DUPLICATE, 0 -- present, or acked a moment ago (a repeated publish must not bring it back)
  end
  local lowered = 0
  if not LIVE and redis.call('EXISTS', META) == 0 and redis.call('EXISTS', JOBS) == 0 then
    lowered = 1 -- a queue coming into being: the caller registers it in its shard
  end
  LIVE = true -- this job is about to exist, so the queue does for the rest of the call
  count_group(group_of(rec), 1)
  local st
  if due <= now then
    redis.call('HSET', JOBS, id, rec)
    make_ready(id, rec, due)
    st = CODE.READY
  elseif wheel > 0 and bucket and redis.call('HLEN', bucket) < cap then
    redis.call('HSET', bucket, wheel >= SHORT_VALUE and wheel_field(id) or id, val)
    wheel_wrote(wheel >= SHORT_VALUE)
    local start = due - due % width
    redis.call('ZADD', WHEEL, 'NX', start, bname)
    count_wheel(1)
    return CODE.WHEEL, math.max(lowered, lower_next(start - lead))
  else
    redis.call('HSET', JOBS, id, rec)
    delay_until(id, due)
    lowered = math.max(lowered, lower_next(due))
    st = CODE.DELAYED
  end
  local e = expire_at(rec)
  if e > 0 then
    if EXPIRE_LATER then EXPIRE_LATER[id] = e else redis.call('ZADD', EXPIRE, e, id) end
    lowered = math.max(lowered, lower_next(e))
  end
  return st, lowered
end
