#!lua flags=no-writes
--[[
  Looks a job up by id in any state, O(1)/O(log n).
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17..] bucket...: the job's wheel bucket, when its id has one (0 or 1 key)
  ARGV[1] member: the job's id
  Returns: {} when absent, else {state, record, score, note, progress}: state DELAYED
    (score = due ms), READY (score = ready rank; -1: held back by its group), RESERVED (ttr deadline), DEAD (time of death);
    note: its NOTES field (death and last error, '' when none); progress: its NOTES field
    `p:<id>`, or nil (the dedup key it was published under is in its record)
]]
--@include lib/codes
--@include lib/keys
--@include lib/wheel
local id = ARGV[1]
local rec = redis.call('HGET', JOBS, id)
if rec then
  local states = {{CODE.READY, READY}, {CODE.RESERVED, RESERVED}, {CODE.DELAYED, DELAYED}, {CODE.DEAD, DEAD}}
  for _, s in ipairs(states) do
    local score = redis.call('ZSCORE', s[2], id)
    if score then
      local notes = redis.call('HMGET', NOTES, id, 'p:' .. id)
      return {s[1], rec, score, notes[1] or '', notes[2]}
    end
  end
  local g = group_of(rec)
  if g and redis.call('ZSCORE', HELD, held_member(g, id)) then
    local notes = redis.call('HMGET', NOTES, id, 'p:' .. id)
    return {CODE.READY, rec, '-1', notes[1] or '', notes[2]}
  end
  return {}
end
if KEYS[FIRST_EXTRA] then
  rec = wheel_get(KEYS[FIRST_EXTRA], id)
  if rec then return {CODE.DELAYED, rec, tostring(struct.unpack('>I6', id)), ''} end
end
return {}
