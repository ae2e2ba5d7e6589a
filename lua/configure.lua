#!lua
--[[
  Changes a queue's own settings (CONF: paused, ttr, tries, max_size, backoff...): sets the
  given fields, removes those given empty, and answers every setting after the change. A
  queue that stops being paused while READY holds jobs tells its long-polls ('1' on notify),
  as when READY becomes non-empty. Validated in Python first (cluster_dq/queueconf.py).
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] notify: the queue's notify channel
  ARGV[2..] fields...: 2 values per field: name, value ('' = remove it)
  Returns: {name_1, value_1, ...}: every setting of the queue after the change (HGETALL)
]]
--@include lib/codes
--@include lib/keys
local was_paused = redis.call('HGET', CONF, 'paused') == '1'
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', CONF, ARGV[i])
  else
    redis.call('HSET', CONF, ARGV[i], ARGV[i + 1])
  end
end
if was_paused and redis.call('HGET', CONF, 'paused') ~= '1' and ARGV[1] ~= ''
    and redis.call('EXISTS', READY) == 1 then
  redis.call('SPUBLISH', ARGV[1], '1')
end
return redis.call('HGETALL', CONF)
