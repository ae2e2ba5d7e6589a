#!lua
--[[
  The last step of a pump tick: exact sizes and the queue's next event, recorded in META.next
  (which later scripts lower when they add an earlier event). An empty queue keeps no META.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] open_lead: how long before its window a wheel bucket opens (ms)
  Returns: {delayed, ready, reserved, dead, next event ms or -1}
]]
--@include lib/codes
--@include lib/jobs
--@include lib/sizes
local out = queue_sizes(tonumber(ARGV[1]))
set_next(out[5])
tidy()
return out
