#!lua flags=no-writes
--[[
  Exact sizes of every state of a queue, and the next time the pump has work in it.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] open_lead: how long before its window a wheel bucket opens (ms): a wheel bucket
    needs work that long before it starts
  Returns: {delayed, ready (held-back jobs of its groups included), reserved, dead, next event
    ms or -1}
]]
--@include lib/codes
--@include lib/sizes
return queue_sizes(tonumber(ARGV[1]))
