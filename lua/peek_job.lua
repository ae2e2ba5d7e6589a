#!lua flags=no-writes
--[[
  Looks a job up by id in any state, O(1)/O(log n).
  KEYS[1..10] the queue's fixed keys; KEYS[11] the job's wheel bucket, when its id has one
  ARGV[1] member
  Returns: {} when absent, else {state, record, score}: state 1 delayed (score = due ms),
    2 ready (score = ready rank), 3 reserved (ttr deadline), 4 dead (time of death)
]]
--@include lib/queue
local id = ARGV[1]
local rec = redis.call('HGET', JOBS, id)
if rec then
  local states = {{2, READY}, {3, RESERVED}, {1, DELAYED}, {4, DEAD}}
  for _, s in ipairs(states) do
    local score = redis.call('ZSCORE', s[2], id)
    if score then return {s[1], rec, score} end
  end
  return {}
end
if KEYS[FIRST_EXTRA] then
  rec = redis.call('HGET', KEYS[FIRST_EXTRA], id)
  if rec then return {1, rec, tostring(struct.unpack('>I6', id))} end
end
return {}
