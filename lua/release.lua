#!lua
--[[
  RESERVED -> READY (delay 0) or DELAYED (delay > 0): gives reserved jobs back. Only a
  reservation still running (ttr not passed), and, with a lease, only the delivery holding it.
  Mode 0 (give back): the delivery is not counted, the try is restored; used when a consumer
  is gone before it got the job (always with the lease of the reservation given back, so a
  repeat cannot touch a later delivery of the same job).
  Mode 1 (release, the consumer's nack): the delivery counts, as if its ttr had passed now; a
  job with no tries left goes to DEAD, a job whose ttl ended is removed; released without a
  delay, a job with a retry backoff (its own or its queue's) waits it out in DELAYED.
  In either mode a job whose ttl ends before it would be ready again (its delay's end, or its
  backoff's) is removed now, not left to vanish while it waits: EXPIRED.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] delay: how long until the job is ready again (ms)
  ARGV[3] notify: the queue's notify channel
  ARGV[4] mode: '0' give back, '1' release (nack)
  ARGV[5] seed: a random number in [0, 1): the jitter of retry backoffs (lib/retry.lua retry)
  ARGV[6] error: the consumer's error text, kept as each released job's last error ('' = none)
  ARGV[7..] jobs...: 2 values per job: member, lease ('' = none)
  Returns: {code per job: NOT_FOUND (not reserved, left alone), DELAYED, READY, DEAD, EXPIRED
    (ttl ended), or a LEASE_* code (the lease does not hold the job, left alone); lowered:
    when the queue's next pump event moved earlier, the earliest event added (ms), else 0}
]]
--@include lib/codes
--@include lib/keys
--@include lib/record
--@include lib/jobs
--@include lib/notes
--@include lib/retry
--@include lib/lease
--@include lib/notify
local now, delay, nack, err = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[4] == '1', ARGV[6]
local was_empty = redis.call('EXISTS', READY) == 0
local seed, retried = tonumber(ARGV[5]), 0
local out, lowered = {}, 0
-- Whether the job's ttl ends before `delay` does (a retry backoff's end: lib/retry.lua retry).
local function ends_first(rec, delay, now)
  local e = expire_at(rec)
  return delay > 0 and e > 0 and now + delay >= e
end
for i = 7, #ARGV, 2 do
  local id, lease = ARGV[i], ARGV[i + 1]
  local st, why = CODE.NOT_FOUND, CODE.OK
  if lease ~= '' then why = lease_check(id, lease, now) end
  local rec = redis.call('HGET', JOBS, id)
  if why ~= CODE.OK then
    st = why
  elseif rec and reserved_until(id, now) then
    redis.call('ZREM', RESERVED, id)
    redis.call('HDEL', LEASES, id)
    unreserve(rec, now)
    local _, _, tries, deliveries = header(rec)
    if not nack then
      rec = with_counts(rec, tries + 1, math.max(deliveries - 1, 0))
      redis.call('HSET', JOBS, id, rec)
    end
    if nack and expired(rec, now) then
      discard(id, rec)
      st = CODE.EXPIRED
    elseif nack and tries == 0 then
      kill(id, DIED_NACKED, now, err)
      st = CODE.DEAD
    elseif ends_first(rec, delay, now) then
      discard(id, rec)
      st = CODE.EXPIRED
    elseif delay > 0 then
      delay_until(id, now + delay)
      if lower_next(now + delay) == 1 then lowered = earliest(lowered, now + delay) end
      st = CODE.DELAYED
    elseif nack then
      local low
      st, low = retry(id, rec, now, draw(seed, retried))
      lowered, retried = earliest(lowered, low), retried + 1
    else
      make_ready(id, rec, now)
      st = CODE.READY
    end
  end
  if st == CODE.DELAYED or st == CODE.READY then note_error(id, err) end
  out[#out + 1] = st
end
tidy()
notify(ARGV[3], was_empty)
out[#out + 1] = lowered
return out
