#!lua
--[[
  Acks (deletes) a job in any state and publishes a new one in the same queue, atomically
  (lmstfy's PUT /api/{ns}/{q}/job/{id}, which lmstfy itself does in two steps). With a lease,
  only while that delivery still holds the old job; otherwise nothing changes.
  KEYS[1..10] the queue's fixed keys; KEYS[11..] wheel buckets (old job's, new job's)
  ARGV[1] now  ARGV[2] lane capacity  ARGV[3] bucket width  ARGV[4] notify channel
  ARGV[5] old member  ARGV[6] its bucket KEYS index (0 = none)  ARGV[7] its bucket name
  ARGV[8] new member  ARGV[9] due_ms  ARGV[10] record  ARGV[11] bucket KEYS index  ARGV[12] bucket name
  ARGV[13] '1' to place the new job in that bucket  ARGV[14] bucket open lead (ms)
  ARGV[15] how long acked ids are remembered (ms)  ARGV[16] lease of the old job's delivery ('' = none)
  Returns: {old state (0 none, 1 delayed, 2 ready, 3 reserved, 4 dead), new status (as publish),
    lowered (as publish)}, or {-code, 0, 0} when the lease no longer holds the old job (codes
    of lease_check in lib/queue.lua); nothing changed then
]]
--@include lib/queue
local now, cap, width, channel = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local keep = tonumber(ARGV[15])
if ARGV[16] ~= '' then
  local why = lease_check(ARGV[5], ARGV[16], now)
  if why > 0 then return {-why, 0, 0} end
end
local was_empty = redis.call('EXISTS', READY) == 0
local okidx, nkidx = tonumber(ARGV[6]), tonumber(ARGV[11])
local old = remove_job(ARGV[5], okidx > 0 and KEYS[okidx], ARGV[7])
if old > 0 then
  if ARGV[5] == ARGV[8] then
    redis.call('ZREM', ACKED, ARGV[5]) -- the same id again: a replacement, not a duplicate
  else
    remember_acked({ARGV[5]}, now, keep)
  end
end
local st = place(ARGV[8], tonumber(ARGV[9]), ARGV[10], nkidx > 0 and KEYS[nkidx], ARGV[12],
  ARGV[13] == '1', now, cap, width, tonumber(ARGV[14]), keep)
tidy()
notify(channel, was_empty)
return {old, st, lowered}
