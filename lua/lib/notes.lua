--[[
  A job's notes (NOTES): why and when it died, and its last error.
]]
--@include lib/keys

-- NOTES field `<id>`: why and when the job died and its last error, packed '>BI6' (reason
-- code, died at ms; both 0 while the job is alive) then the error text. A job with neither has
-- no field. Reason codes (cluster_dq/models.py DEATH_REASONS mirrors them):
local DIED_TTR = 1      -- ttr_expired: its last try's reservation ran out
local DIED_NACKED = 2   -- tries_exhausted: its last try was released (nacked) by the consumer

local DIED_BURIED = 3   -- buried: a consumer or an operator buried it

local function note_of(id)
  local n = redis.call('HGET', NOTES, id)
  if not n then return 0, 0, '' end
  local why, at = struct.unpack('>BI6', n)
  return why, at, string.sub(n, 8)
end

local function set_note(id, why, at, err)
  if why == 0 and err == '' then
    redis.call('HDEL', NOTES, id)
  else
    redis.call('HSET', NOTES, id, struct.pack('>BI6', why, at) .. err)
  end
end

-- Keeps `err` as the job's last error ('' = leave it as it is).
local function note_error(id, err)
  if err == '' then return end
  local why, at = note_of(id)
  set_note(id, why, at, err)
end

-- A job whose record is in JOBS, already out of its state, goes to DEAD: why, when, and its
-- last error (`err`, or the one it had when '').
local function kill(id, why, now, err)
  redis.call('ZADD', DEAD, now, id)
  redis.call('ZREM', EXPIRE, id) -- DEAD never expires (as in lmstfy)
  local _, _, had = note_of(id)
  if err == '' then err = had end
  set_note(id, why, now, err)
end

-- A job leaves DEAD alive: its death is forgotten, its last error kept.
local function forget_death(id)
  local why, _, err = note_of(id)
  if why ~= 0 then set_note(id, 0, 0, err) end
end
