--[[
  A job's record (`>I6 I6 H H B B`: published, expire at, tries left, deliveries, priority,
  flags, then its body and options): its fields, and its score in READY.
]]
local PRIO_SHIFT = 4398046511104 -- 2^42: ready score = (255 - priority) * 2^42 + due_ms

local function expire_at(rec)
  local _, e = struct.unpack('>I6I6', rec)
  return e
end

local function header(rec) -- published, expire_at, tries_left, deliveries, priority, flags
  return struct.unpack('>I6I6HHBB', rec)
end

local function with_counts(rec, tries, deliveries)
  return string.sub(rec, 1, 12) .. struct.pack('>HH', tries, deliveries) .. string.sub(rec, 17)
end

local function with_tries_expire(rec, tries, exp)
  return string.sub(rec, 1, 6) .. struct.pack('>I6H', exp, tries) .. string.sub(rec, 15)
end

local function priority_of(rec)
  return string.byte(rec, 17)
end

local function ready_score(rec, t)
  return (255 - priority_of(rec)) * PRIO_SHIFT + t
end

local function expired(rec, now)
  local e = expire_at(rec)
  return e > 0 and e <= now
end

-- The record's flags (its 18th byte): 1 attributes, 2 its own backoff, 4 a group (`u8 len` +
-- the name, after the backoff), 8 the simple or debounce dedup key it was published under
-- (`u8 len` + the key, after the group); 16 the job's due time when its id does not say it (a
-- debounce's job; a job a reschedule or a revival moved; `>I6`, after the attributes, before
-- the body: with_due).
local FLAG_GROUP, FLAG_DEDUP, FLAG_DUE = 4, 8, 16
local BACKOFF_SIZE = 11 -- `>B I4 I4 H`

-- The group named in a record, or in a short wheel value when `at` = 11 (where its flags byte
-- is; 18 in a record); false: none.
local function group_at(rec, at)
  local flags = string.byte(rec, at)
  if bit.band(flags, FLAG_GROUP) == 0 then return false end
  local i = at + 1
  if bit.band(flags, 2) ~= 0 then i = i + BACKOFF_SIZE end
  return string.sub(rec, i + 1, i + string.byte(rec, i))
end

local function group_of(rec)
  return group_at(rec, 18)
end

-- Where the record's sections after its backoff and group begin (its 1-based index), by its
-- `flags`: the sections come in this order (backoff 2, group 4, key 8, attributes 1, due 16).
local function key_at(rec, flags)
  local at = 19
  if bit.band(flags, 2) ~= 0 then at = at + BACKOFF_SIZE end
  if bit.band(flags, FLAG_GROUP) ~= 0 then at = at + 1 + string.byte(rec, at) end
  return at
end

-- The dedup key a record carries (flag 8); false: none.
local function dedup_of(rec)
  local flags = string.byte(rec, 18)
  if bit.band(flags, FLAG_DEDUP) == 0 then return false end
  local at = key_at(rec, flags)
  return string.sub(rec, at + 1, at + string.byte(rec, at))
end

-- Where a record's body begins (its 1-based index): after the header and every section.
local function body_at(rec)
  local flags = string.byte(rec, 18)
  local at = key_at(rec, flags)
  if bit.band(flags, FLAG_DEDUP) ~= 0 then at = at + 1 + string.byte(rec, at) end
  if bit.band(flags, 1) ~= 0 then at = at + 2 + struct.unpack('>H', rec, at) end
  if bit.band(flags, FLAG_DUE) ~= 0 then at = at + 6 end
  return at
end

-- The due time a server-made id carries (its top 48 bits); false for a client's id (which
-- starts with a name character; models.is_wheel_member).
local function id_due(id)
  if #id == 16 and string.byte(id, 1) < 0x20 then return (struct.unpack('>I6', id)) end
  return false
end

-- The record of job `id` with the due time it carries (flag 16) set to `due` (a reschedule, a
-- kick, a redrive: its lateness counts from when it is due now). A record without one gains
-- it (6 bytes) unless `due` is the one its id carries.
local function with_due(rec, due, id)
  local flags = string.byte(rec, 18)
  local at = body_at(rec)
  if bit.band(flags, FLAG_DUE) ~= 0 then
    return string.sub(rec, 1, at - 7) .. struct.pack('>I6', due) .. string.sub(rec, at)
  end
  if id_due(id) == due then return rec end
  return string.sub(rec, 1, 17) .. string.char(bit.bor(flags, FLAG_DUE)) .. string.sub(rec, 19, at - 1)
    .. struct.pack('>I6', due) .. string.sub(rec, at)
end
