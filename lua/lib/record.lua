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

local function ready_score(rec, t)
  local _, _, _, _, prio = struct.unpack('>I6I6HHB', rec)
  return (255 - prio) * PRIO_SHIFT + t
end

local function expired(rec, now)
  local e = expire_at(rec)
  return e > 0 and e <= now
end
