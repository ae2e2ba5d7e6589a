#!lua flags=no-writes
--[[
  Exact sizes of every state of a queue, and the next time the pump has work in it.
  KEYS[1..8] the queue's fixed keys
  ARGV[1] bucket open lead (ms): a wheel bucket needs work `lead` ms before it starts
  Returns: {delayed, ready, reserved, dead, next event ms or -1}
]]
--@include lib/queue
local lead = tonumber(ARGV[1])
local nxt = -1
local function consider(t)
  if t and (nxt < 0 or t < nxt) then nxt = t end
end
local w = first_score(WHEEL)
if w then consider(w - lead) end
consider(first_score(DELAYED))
consider(first_score(RESERVED))
consider(first_score(EXPIRE))
local wheel = tonumber(redis.call('HGET', META, 'w') or '0')
return {wheel + redis.call('ZCARD', DELAYED), redis.call('ZCARD', READY),
  redis.call('ZCARD', RESERVED), redis.call('ZCARD', DEAD), nxt}
