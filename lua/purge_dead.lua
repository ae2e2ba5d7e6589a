#!lua
--[[
  DEAD -> gone for the dead jobs that match a filter (reason, time of death from..to), oldest
  death first, from just after a cursor, leaving nothing of them behind. Bounded: at most
  `examine` dead entries looked at and `limit` deleted per call; the reply says where it stopped.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] after_score: the cursor's time of death (ms; -1 = none: start at `from`)
  ARGV[2] after_member: the cursor's member
  ARGV[3] from: the earliest time of death (ms)
  ARGV[4] to: the latest time of death (ms)
  ARGV[5] reason: a death reason code (-1 = any; 0 = none recorded)
  ARGV[6] limit: jobs deleted per call
  ARGV[7] examine: dead entries looked at per call
  Returns: {number deleted, more (1: call again from the cursor), cursor score (-1: none),
    cursor member}
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
--@include lib/dead
local examine = tonumber(ARGV[7])
local got = dead_window(tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), examine)
local function act(id)
  redis.call('ZREM', DEAD, id)
  drop(id)
end
local n, more, s, m = sweep_dead(got, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]),
  examine, act)
tidy()
return {n, more, s, m}
