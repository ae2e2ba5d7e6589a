--[[
  A queue's exact sizes and its next pump event.
]]
--@include lib/keys

local function first_score(key)
  local r = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if r[2] then return tonumber(r[2]) end
  return false
end

-- Exact sizes and the next pump event (ms, or -1): the wheel needs work `lead` ms early.
local function queue_sizes(lead)
  local nxt = -1
  local function consider(t)
    if t and (nxt < 0 or t < nxt) then nxt = t end
  end
  local w = first_score(WHEEL)
  if w then consider(w - lead) end
  consider(first_score(DELAYED))
  consider(first_score(RESERVED))
  consider(first_score(EXPIRE))
  consider(first_score(GWAKE))
  local wheel = tonumber(redis.call('HGET', META, 'w') or '0')
  return {wheel + redis.call('ZCARD', DELAYED), redis.call('ZCARD', READY) + redis.call('ZCARD', HELD),
    redis.call('ZCARD', RESERVED), redis.call('ZCARD', DEAD), nxt}
end
