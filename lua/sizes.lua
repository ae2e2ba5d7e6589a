#!lua flags=no-writes
--[[
  Exact sizes of every state of a queue, and the next time the pump has work in it.
  KEYS[1..10] the queue's fixed keys
  ARGV[1] bucket open lead (ms): a wheel bucket needs work `lead` ms before it starts
  Returns: {delayed, ready, reserved, dead, next event ms or -1}
]]
--@include lib/queue
return queue_sizes(tonumber(ARGV[1]))
