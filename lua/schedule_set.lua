#!lua
--[[
  Sets a schedule's firing state if it is still the one the caller read (compare-and-set),
  and with it the schedule's definition: a PUT, a pause or resume, a delete, and a firer's
  claim and confirmation of occurrences are each one such call, so an occurrence is claimed
  by one firer only. The state is an opaque string made by cluster_dq/schedules.py.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17] schedules: the queue's schedules hash (d:<name> definition, s:<name> state)
  ARGV[1] name: the schedule's name
  ARGV[2] expected: the state the caller read ('' = the schedule must not exist)
  ARGV[3] state: the new state ('' = delete the schedule)
  ARGV[4] definition: the new definition ('' = keep it)
  ARGV[5] limit: the most schedules the queue may have (a new one beyond it is refused)
  Returns: {1 when set, or when the state is `state` already (a repeat); 0 when the state
    was not `expected`, or the queue is full: nothing changed; the number of schedules of
    the queue}
]]
local SCHED = KEYS[17]
local name, expected, state, definition = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local current = redis.call('HGET', SCHED, 's:' .. name) or ''
local count = redis.call('HLEN', SCHED) / 2
-- A repeat of a call whose reply was lost finds its own state: done, not a conflict.
if current == state and state ~= expected then return {1, count} end
if current ~= expected then return {0, count} end
if state == '' then
  redis.call('HDEL', SCHED, 'd:' .. name, 's:' .. name)
  return {1, count - (current == '' and 0 or 1)}
end
if current == '' then
  if count >= tonumber(ARGV[5]) then return {0, count} end
  count = count + 1
end
if definition ~= '' then
  redis.call('HSET', SCHED, 'd:' .. name, definition, 's:' .. name, state)
else
  redis.call('HSET', SCHED, 's:' .. name, state)
end
return {1, count}
