#!lua
--[[
  Removes jobs whose ttl ended (DELAYED near-term, READY, RESERVED; DEAD never expires and
  wheel jobs cannot expire before they are opened, since ttl >= delay). Nothing is left behind.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] limit: jobs per call
  Returns: number of jobs removed
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
local due = redis.call('ZRANGE', EXPIRE, '-inf', tonumber(ARGV[1]), 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]))
local n = 0
for _, id in ipairs(due) do
  if forget(id, tonumber(ARGV[1])) ~= CODE.NOT_FOUND then n = n + 1 end
  redis.call('ZREM', EXPIRE, id)
end
tidy()
return n
