#!lua
--[[
  Publishes one or more jobs of one queue (bulk: arguments are validated before the call, so
  the only per-job outcome besides success is "duplicate id", which writes nothing).
  KEYS[1..10] the queue's fixed keys (see lua/README.md); KEYS[11..] wheel buckets of this call
  ARGV[1] now (ms)  ARGV[2] lane capacity  ARGV[3] bucket width (ms)  ARGV[4] notify channel
  ARGV[5] bucket open lead (ms)  ARGV[6] how long acked ids are remembered (ms)
  ARGV[7] n, then 6 values per job: member, due_ms, record, bucket KEYS index (0 = none),
    bucket name, '1' to place the job in that bucket ('0': the bucket is only looked in for a
    duplicate: a fixed server id whose bucket may not be open yet)
  Returns: {status_1 .. status_n, HLEN of KEYS[11], HLEN of KEYS[12], ..., lowered}
    status: 0 duplicate, 1 wheel, 2 delayed (near-term or bucket full), 3 ready
    lowered: 1 when the queue's next pump event moved earlier (the caller signals its shard)
]]
--@include lib/queue
local now, cap, width, channel = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local lead, keep, n = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local was_empty = redis.call('EXISTS', READY) == 0
local out = {}
for j = 0, n - 1 do
  local b = 8 + j * 6
  local kidx = tonumber(ARGV[b + 3])
  out[#out + 1] = place(ARGV[b], tonumber(ARGV[b + 1]), ARGV[b + 2], kidx > 0 and KEYS[kidx],
    ARGV[b + 4], ARGV[b + 5] == '1', now, cap, width, lead, keep)
end
for k = FIRST_EXTRA, #KEYS do out[#out + 1] = redis.call('HLEN', KEYS[k]) end
notify(channel, was_empty)
out[#out + 1] = lowered
return out
