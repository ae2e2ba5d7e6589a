#!lua
--[[
  Publishes one or more jobs of one queue (bulk: arguments are validated before the call, so
  the only per-job outcome besides success is "duplicate id", which writes nothing).
  KEYS[1..10] queue: the queue's fixed keys, in the order of lib/queue.lua
  KEYS[11..] buckets...: wheel buckets of this call
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] lane_capacity: jobs per wheel bucket
  ARGV[3] bucket_width: the time window of a wheel bucket (ms)
  ARGV[4] notify: the queue's notify channel
  ARGV[5] open_lead: how long before its window a wheel bucket opens (ms)
  ARGV[6] remember_acked: how long acked ids are remembered (ms)
  ARGV[7] n: the number of jobs
  ARGV[8..] jobs...: 6 values per job: member, due_ms, record, bucket KEYS index (0 = none),
    bucket name, '1' to place the job in that bucket ('0': the bucket is only looked in for a
    duplicate: a fixed server id whose bucket may not be open yet)
  Returns: {code_1 .. code_n, HLEN of KEYS[11], HLEN of KEYS[12], ..., lowered}
    code: DUPLICATE, WHEEL, DELAYED (near-term or bucket full), READY
    lowered: 1 when the queue's next pump event moved earlier (the caller signals its shard)
]]
--@include lib/codes
--@include lib/queue
local now, cap, width, channel = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local lead, keep, n = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local was_empty = redis.call('EXISTS', READY) == 0
local out, lowered = {}, 0
for j = 0, n - 1 do
  local b = 8 + j * 6
  local kidx = tonumber(ARGV[b + 3])
  local st, low = place(ARGV[b], tonumber(ARGV[b + 1]), ARGV[b + 2], kidx > 0 and KEYS[kidx],
    ARGV[b + 4], ARGV[b + 5] == '1', now, cap, width, lead, keep)
  out[#out + 1] = st
  lowered = math.max(lowered, low)
end
for k = FIRST_EXTRA, #KEYS do out[#out + 1] = redis.call('HLEN', KEYS[k]) end
notify(channel, was_empty)
out[#out + 1] = lowered
return out
