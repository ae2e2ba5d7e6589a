#!lua flags=no-writes
--[[
  Groups as the API shows them: each one's jobs, reserved jobs, held-back jobs and settings.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1..] groups...: the groups to describe
  Returns: {size, reserved, held, paused, concurrency, rate} per group, flat: size and reserved
    from GROUPS (0: none), held from HELD, paused '1' or '', concurrency and rate as GCONF has
    them ('' = none)
]]
--@include lib/codes
--@include lib/keys
local out = {}
for _, g in ipairs(ARGV) do
  local n = redis.call('HMGET', GROUPS, 'n:' .. g, 'r:' .. g)
  local c = redis.call('HMGET', GCONF, 'p:' .. g, 'c:' .. g, 'q:' .. g)
  out[#out + 1] = tonumber(n[1] or '0')
  out[#out + 1] = tonumber(n[2] or '0')
  out[#out + 1] = redis.call('ZLEXCOUNT', HELD, '[' .. g .. '\0', '(' .. g .. '\1')
  out[#out + 1] = c[1] or ''
  out[#out + 1] = c[2] or ''
  out[#out + 1] = c[3] or ''
end
return out
