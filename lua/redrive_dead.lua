#!lua
--[[
  DEAD -> READY, or DELAYED until now + delay, for the dead jobs that match a filter (reason,
  time of death from..to), oldest death first, from just after a cursor; as kick does to each
  (tries, fresh ttl, death forgotten, last error kept). Bounded: at most `examine` dead entries
  looked at, `limit` moved and 8 MB of records rewritten per call (past the first); the reply
  says where it stopped.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] after_score: the cursor's time of death (ms; -1 = none: start at `from`)
  ARGV[3] after_member: the cursor's member
  ARGV[4] from: the earliest time of death (ms)
  ARGV[5] to: the latest time of death (ms)
  ARGV[6] reason: a death reason code (-1 = any; 0 = none recorded)
  ARGV[7] limit: jobs moved per call
  ARGV[8] examine: dead entries looked at per call
  ARGV[9] delay: how long until they are ready (ms; 0 = now)
  ARGV[10] tries: their tries from now on
  ARGV[11] ttl: their fresh ttl (ms, 0 = never expires)
  ARGV[12] notify: the queue's notify channel
  Returns: {number moved, more (1: call again from the cursor), cursor score (-1: none), cursor
    member, lowered (see publish.lua)}
]]
--@include lib/codes
--@include lib/keys
--@include lib/notify
--@include lib/dead
local now = tonumber(ARGV[1])
local delay, tries, ttl = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local was_empty = redis.call('EXISTS', READY) == 0
local examine = tonumber(ARGV[8])
local got = dead_window(tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), examine)
local lowered, bytes = 0, 0
local function full() return bytes > RECORD_BYTES_PER_CALL end
local function act(id)
  bytes = bytes + redis.call('HSTRLEN', JOBS, id)
  local rec = redis.call('HGET', JOBS, id)
  if rec then -- always, while the invariants hold
    local _, low = revive(id, rec, now, now + delay, tries, ttl)
    lowered = math.max(lowered, low)
  else
    redis.call('ZREM', DEAD, id)
  end
end
local n, more, s, m = sweep_dead(got, tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]),
  examine, act, full)
notify(ARGV[12], was_empty)
return {n, more, s, m, lowered}
