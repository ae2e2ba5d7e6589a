#!lua
--[[
  Acks / deletes jobs in any state (lmstfy's DELETE /api/{ns}/{q}/job/{id}; also cancel).
  Nothing of the job remains afterwards but its id, remembered for a while (see ACKED), and
  the result the consumer gave (if any), kept in RESULTS for keep_result ms.
  A job given with a lease is acked only while that delivery still holds it; if any lease of
  the call does not hold its job, nothing at all is acked (the caller names the conflicts).
  A job already gone is no conflict: acking it is what the holder wanted (and a repeat after a
  lost reply finds its own ack done).
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17..] buckets...: wheel buckets of the ids; then, when a job has a result, the queue's
    results HASH and results_due ZSET (at KEYS[results] and the one after it)
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] remember_acked: how long acked ids are remembered (ms; 0 = not at all)
  ARGV[3] check_only: '1' to check the leases only, changing nothing (a route over several
    pools checks every pool before it acks on any)
  ARGV[4] results: KEYS index of the results HASH (0 = no job of the call has a result)
  ARGV[5] keep_result: how long a result is kept after the ack (ms)
  ARGV[6] n: the number of jobs
  ARGV[7..] jobs...: 5 values per job: member, bucket KEYS index (0 = none), bucket name,
    lease ('' = none), result ('' = none; kept only when the job was found)
  Returns: {code_1 .. code_n}: the state each job was in (NOT_FOUND, DELAYED, READY, RESERVED,
    DEAD); or, with check_only or when a lease does not hold its job (nothing acked then),
    per job OK or a LEASE_* code (LEASE_GONE counts as OK)
]]
--@include lib/codes
--@include lib/keys
--@include lib/jobs
--@include lib/acked
--@include lib/remove
--@include lib/lease
local now, check_only, n = tonumber(ARGV[1]), ARGV[3] == '1', tonumber(ARGV[6])
local STRIDE = 5
local out, refused = {}, false
for j = 0, n - 1 do
  local b = 7 + j * STRIDE
  local why = CODE.OK
  if ARGV[b + 3] ~= '' then why = lease_check(ARGV[b], ARGV[b + 3], now) end
  if why == CODE.LEASE_GONE then why = CODE.OK end
  out[#out + 1] = why
  refused = refused or why ~= CODE.OK
end
if refused or check_only then return out end
SHRINKING = true -- its groups' counts fall once per group (lib/groups.lua), flushed below
local acked, results = {}, {}
for j = 0, n - 1 do
  local b = 7 + j * STRIDE
  local kidx = tonumber(ARGV[b + 1])
  out[j + 1] = remove_job(ARGV[b], kidx > 0 and KEYS[kidx], ARGV[b + 2], now)
  if out[j + 1] ~= CODE.NOT_FOUND then
    acked[#acked + 1] = ARGV[b]
    if ARGV[b + 4] ~= '' then results[#results + 1] = b end
  end
end
flush_shrunk()
remember_acked(acked, now, tonumber(ARGV[2]))
local ridx = tonumber(ARGV[4])
if ridx > 0 and #results > 0 then
  -- value: done ms, kept-until ms (>I6 I6), then the result; RESULTS_DUE orders them by
  -- kept-until, and the ones past it go a bounded number per call (as ACKED's)
  local RESULTS, RESULTS_DUE, keep = KEYS[ridx], KEYS[ridx + 1], tonumber(ARGV[5])
  local until_ms = now + keep
  for _, b in ipairs(results) do
    redis.call('HSET', RESULTS, ARGV[b], struct.pack('>I6I6', now, until_ms) .. ARGV[b + 4])
    redis.call('ZADD', RESULTS_DUE, until_ms, ARGV[b])
  end
  local old = redis.call('ZRANGE', RESULTS_DUE, '-inf', now, 'BYSCORE', 'LIMIT', 0, FORGET_PER_CALL + #results)
  if #old > 0 then
    zrem_many(RESULTS_DUE, old)
    for i = 1, #old, CHUNK do
      redis.call('HDEL', RESULTS, unpack(old, i, math.min(i + CHUNK - 1, #old)))
    end
  end
  redis.call('PEXPIRE', RESULTS, keep)
  redis.call('PEXPIRE', RESULTS_DUE, keep)
end
tidy()
return out
