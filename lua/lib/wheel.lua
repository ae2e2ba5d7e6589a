--[[
  Wheel entries (lua/README.md "Wheel entries"): how a job rests in its wheel bucket, short or
  whole, and the lookups, writes and removals by id that read either form.
]]
--@include lib/keys
--@include lib/jobs

-- A short entry leaves out what its bucket's name says: its field is the job's id without the
-- upper 32 bits of its due ms and without its lane (10 bytes), its value the record re-headed
-- relative to the due time (`>I4 I4 H B`: ms from publish to due, ttl in ms from publish or 0,
-- tries left, flags); the caller makes that value (cluster_dq.models.wheel_short). A whole
-- entry is the 16-byte id and the record. A field's length tells the two apart.
local BUCKET_WIDTH = 10000  -- ms of a bucket's window (keys.BUCKET_WIDTH_MS)
local SHORT = 10            -- bytes of a short field
local SHORT_VALUE = 4       -- a job of publish, or republish's wheel, as a short entry (commands.SHORT)

local function wheel_field(id)
  return string.sub(id, 5, 6) .. string.sub(id, 9)
end

-- A bucket's window start (ms) and lane, from its name `<window>:<lane>`.
local function bucket_place(bname)
  local w, lane = string.match(bname, '^(%d+):(%d+)$')
  return tonumber(w) * BUCKET_WIDTH, tonumber(lane)
end

-- The record of a job due at `due` ms from its short entry's value.
local function wheel_record(due, val)
  local delay, ttl, tries, flags = struct.unpack('>I4I4HB', val)
  local pub = due - delay
  return struct.pack('>I6I6HHBB', pub, ttl > 0 and pub + ttl or 0, tries, 0, 0, flags)
    .. string.sub(val, 12)
end

-- The job (id, record) of an entry of the bucket at window start `start` ms and lane `lane`.
local function wheel_job(start, lane, field, val)
  if #field ~= SHORT then return field, val end
  local due = start + (struct.unpack('>H', field) - start % 65536) % 65536
  return struct.pack('>I6H', due, lane) .. string.sub(field, 3), wheel_record(due, val)
end

-- Whether the queue's wheel may hold a whole entry: not when it is empty (no META.w), nor
-- while META.s is set. A writer of short entries sets META.s when the wheel held none but
-- short ones; a writer of a whole entry clears it. Read once per call (whole_maybe), then
-- kept up to date by wheel_wrote.
local WHOLE, SHORT_ONLY = nil, false -- SHORT_ONLY: META.s is set

local function whole_maybe()
  if WHOLE == nil then
    local m = redis.call('HMGET', META, 's', 'w')
    SHORT_ONLY = m[1] ~= false
    WHOLE = not SHORT_ONLY and m[2] ~= false
  end
  return WHOLE
end

-- After an entry was written into a bucket, short or whole: keeps META.s true to the wheel.
local function wheel_wrote(short)
  local whole = whole_maybe()
  if short and not whole and not SHORT_ONLY then
    redis.call('HSET', META, 's', 1)
    SHORT_ONLY = true
  elseif not short then
    if SHORT_ONLY then redis.call('HDEL', META, 's') end
    WHOLE, SHORT_ONLY = true, false
  end
end

-- Job `id`'s record and its field in `bucket` (false when it is not there).
local function wheel_get(bucket, id)
  local f = wheel_field(id)
  local val = redis.call('HGET', bucket, f)
  if val then return wheel_record(struct.unpack('>I6', id), val), f end
  if not whole_maybe() then return false end
  val = redis.call('HGET', bucket, id)
  if val then return val, id end
  return false
end

-- Whether job `id` rests in `bucket`.
local function wheel_has(bucket, id)
  return redis.call('HEXISTS', bucket, wheel_field(id)) == 1
    or (whole_maybe() and redis.call('HEXISTS', bucket, id) == 1)
end

-- Removes a job from a wheel bucket; keeps the bucket index and the count exact.
local function unwheel(bucket, bname, id)
  if redis.call('HDEL', bucket, wheel_field(id)) == 0
      and not (whole_maybe() and redis.call('HDEL', bucket, id) == 1) then
    return 0
  end
  count_wheel(-1)
  if redis.call('EXISTS', bucket) == 0 then redis.call('ZREM', WHEEL, bname) end
  return 1
end
