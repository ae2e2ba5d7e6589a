#!lua
--[[
  Acks (deletes) a job in any state and publishes a new one in the same queue, atomically
  (lmstfy's PUT /api/{ns}/{q}/job/{id}, which lmstfy itself does in two steps).
  KEYS[1..9] the queue's fixed keys; KEYS[10..] wheel buckets (old job's, new job's)
  ARGV[1] now  ARGV[2] lane capacity  ARGV[3] bucket width  ARGV[4] notify channel
  ARGV[5] old member  ARGV[6] its bucket KEYS index (0 = none)  ARGV[7] its bucket name
  ARGV[8] new member  ARGV[9] due_ms  ARGV[10] record  ARGV[11] bucket KEYS index  ARGV[12] bucket name
  ARGV[13] bucket open lead (ms)  ARGV[14] how long acked ids are remembered (ms)
  Returns: {old state (0 none, 1 delayed, 2 ready, 3 reserved, 4 dead), new status (as publish),
    lowered (as publish)}
]]
--@include lib/queue
local now, cap, width, channel = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local was_empty = redis.call('EXISTS', READY) == 0
local okidx, nkidx = tonumber(ARGV[6]), tonumber(ARGV[11])
local old = remove_job(ARGV[5], okidx > 0 and KEYS[okidx], ARGV[7])
if old > 0 then remember_acked({ARGV[5]}, now, tonumber(ARGV[14])) end
local st = place(ARGV[8], tonumber(ARGV[9]), ARGV[10], nkidx > 0 and KEYS[nkidx], ARGV[12], now, cap, width,
  tonumber(ARGV[13]))
notify(channel, was_empty)
return {old, st, lowered}
