#!lua
--[[
  Publishes one or more jobs of one queue (bulk: arguments are validated before the call, so
  the only per-job outcome besides success is "duplicate id", which writes nothing).
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17..] buckets...: wheel buckets of this call
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] lane_capacity: jobs per wheel bucket
  ARGV[3] bucket_width: the time window of a wheel bucket (ms)
  ARGV[4] notify: the queue's notify channel
  ARGV[5] open_lead: how long before its window a wheel bucket opens (ms)
  ARGV[6] remember_acked: how long acked ids are remembered (ms)
  ARGV[7] whole: '1' all the jobs or none when they would take the queue beyond its max_size
    (one request's bulk), '0' job by job in order (a group of one-job requests)
  ARGV[8] n: the number of jobs
  ARGV[9..] jobs...: one value per job, packed `>H B I6 B` + member + record: its bucket's KEYS
    index (0 = none); what to do with that bucket: 0 only look there for a duplicate (a fixed
    server id whose bucket may not be open yet), 1 place the job there unless its id is there
    (HSETNX), 2 place it there, its id made up by this call (HSET: only an earlier attempt of
    the same call can have written it, with the same record; one look through the bucket instead
    of two), either plus 4 (SHORT_VALUE) when the job comes as a short wheel entry (README "Wheel entries"); due ms; the member's
    length; then the member; with SHORT_VALUE, its short field (10 bytes); then the record, or
    the short value (widened back into a record if the job goes to JOBS instead). A bucket's
    WHEEL member is its key's name after `}:w:`.
  Returns: {code_1 .. code_n, HLEN of KEYS[17], HLEN of KEYS[18], ..., lowered}
    code: DUPLICATE, WHEEL, DELAYED (near-term or bucket full), READY, FULL (the queue holds
    CONF max_size jobs, in all states: nothing written for it)
    lowered: 1 when the queue's next pump event moved earlier (the caller signals its shard);
      when a job was there already (maybe a repeat), the time the shard must look by instead
      (lib/jobs.lua again_at: META.next, or 1 to register only)
]]
--@include lib/codes
--@include lib/keys
--@include lib/record
--@include lib/jobs
--@include lib/acked
--@include lib/wheel
--@include lib/notify
local now, cap, width, channel = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local lead, keep, whole, n = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1', tonumber(ARGV[8])
local was_empty = redis.call('EXISTS', READY) == 0
BATCHED = true -- its groups' bookkeeping once per group (lib/groups.lua), flushed at the end
-- What place() (lib/place.lua) does job by job, done once per call with the same outcome (the
-- call is atomic): whether the queue comes into being, each bucket's fill (HLEN once), its WHEEL entry, META.w and META.next. A job that goes into its bucket
-- is written with HSETNX or HSET, whose reply is its duplicate check in that bucket too.
local fresh = redis.call('EXISTS', META) == 0 and redis.call('EXISTS', JOBS) == 0
local out, lowered, low, wheeled, expiring, fill, listed = {}, 0, false, 0, {}, {}, {}
local again = false -- a job was there already: maybe a repeat (lib/jobs.lua again_at)
-- ARGV[8 + j]: job j's bucket index, what to do with the bucket (without SHORT_VALUE), due ms,
-- member, record or short value, and its short field (false: none, the record is whole)
local function job(j)
  local a = ARGV[8 + j]
  local kidx, into, due, len, at = struct.unpack('>HBI6B', a)
  if into < SHORT_VALUE then
    return kidx, into, due, string.sub(a, at, at + len - 1), string.sub(a, at + len), false
  end
  local f = at + len
  return kidx, into - SHORT_VALUE, due, string.sub(a, at, f - 1), string.sub(a, f + SHORT),
    string.sub(a, f, f + SHORT - 1)
end
-- The queue's max_size (CONF): `room` = jobs it may still take (false: no limit); every state
-- counts (JOBS and the wheel), a duplicate does not.
local room = tonumber(redis.call('HGET', CONF, 'max_size') or '')
if room then
  room = room - redis.call('HLEN', JOBS) - tonumber(redis.call('HGET', META, 'w') or '0')
  if whole then
    local new = 0
    for j = 1, n do
      local kidx, _, _, id = job(j)
      if redis.call('HEXISTS', JOBS, id) == 0 and not acked_lately(id, now, keep)
          and not (kidx > 0 and wheel_has(KEYS[kidx], id)) then
        new = new + 1
      end
    end
    if new > 0 and new > room then -- nothing new (duplicates only): never full
      for _ = 1, n do out[#out + 1] = CODE.FULL end
      for k = FIRST_EXTRA, #KEYS do out[#out + 1] = redis.call('HLEN', KEYS[k]) end
      out[#out + 1] = 0
      return out
    end
  end
end
for j = 1, n do
  local kidx, into, due, id, rec, short = job(j)
  local bucket, st = kidx > 0 and KEYS[kidx], CODE.DUPLICATE
  if redis.call('HEXISTS', JOBS, id) == 1 or acked_lately(id, now, keep) then
    -- a duplicate: nothing written
  elseif room and room <= 0 then
    if not (bucket and wheel_has(bucket, id)) then st = CODE.FULL end
  else
    local fits = false
    if due > now and bucket and into > 0 then
      fill[kidx] = fill[kidx] or redis.call('HLEN', bucket)
      fits = fill[kidx] < cap
    end
    if fits then
      local other = false -- where a given id may rest in the other form
      if into == 1 then
        if not short then other = wheel_field(id) elseif whole_maybe() then other = id end
      end
      if not (other and redis.call('HEXISTS', bucket, other) == 1) and redis.call(
          into == 2 and 'HSET' or 'HSETNX', bucket, short or id, rec) == 1 then
        wheel_wrote(short ~= false)
        local start = due - due % width
        if not listed[kidx] then
          redis.call('ZADD', WHEEL, 'NX', start, string.match(bucket, '}:w:(.*)$'))
          listed[kidx] = true
        end
        fill[kidx], wheeled, st = fill[kidx] + 1, wheeled + 1, CODE.WHEEL
        if not low or start - lead < low then low = start - lead end
      end
    elseif not (bucket and wheel_has(bucket, id)) then
      if short then rec = wheel_record(due, rec) end
      redis.call('HSET', JOBS, id, rec)
      if due <= now then
        make_ready(id, rec, due)
        st = CODE.READY
      else
        delay_until(id, due) -- the queue's long-polls hear of its due time (notify)
        if not low or due < low then low = due end
        st = CODE.DELAYED
      end
      local e = expire_at(rec)
      if e > 0 then
        expiring[#expiring + 1] = e
        expiring[#expiring + 1] = id
        if not low or e < low then low = e end
      end
    end
    if st ~= CODE.DUPLICATE then
      count_group(group_at(rec, (short and st == CODE.WHEEL) and 11 or 18), 1)
      if fresh then
        lowered, fresh = 1, false -- a queue coming into being: the caller registers it in its shard
      end
      if room then room = room - 1 end
    end
  end
  out[#out + 1] = st
  again = again or st == CODE.DUPLICATE
end
write_pairs('ZADD', EXPIRE, expiring)
if wheeled > 0 then count_wheel(wheeled) end
if low then lowered = math.max(lowered, lower_next(low)) end
for k = FIRST_EXTRA, #KEYS do out[#out + 1] = fill[k] or redis.call('HLEN', KEYS[k]) end
flush_groups()
notify(channel, was_empty)
out[#out + 1] = again and again_at() or lowered
return out
