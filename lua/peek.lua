#!lua flags=no-writes
--[[
  The head of the ready queue or of the dead letter, without changing anything.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] which: 'ready' or 'dead'
  Returns: {} when empty, else {member, record, score}
]]
--@include lib/codes
--@include lib/keys
local key = READY
if ARGV[1] == 'dead' then key = DEAD end
local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
if #head == 0 then return {} end
return {head[1], redis.call('HGET', JOBS, head[1]), head[2]}
