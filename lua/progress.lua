#!lua
--[[
  Records a reserved job's progress (small JSON, checked by the caller) in NOTES field
  `p:<id>`, replacing the last one; it leaves with the job's record (drop in lib/jobs.lua).
  With a lease, only the delivery holding the job may; without one, any running reservation
  (its ttr not run out). Anything else changes nothing.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  KEYS[17..] bucket...: the job's wheel bucket, when its id has one (0 or 1 key)
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] member: the job
  ARGV[3] lease: the lease of its delivery ('' = none)
  ARGV[4] progress: what to record
  Returns: OK (recorded), NOT_FOUND (no lease given and no such job), or a LEASE_* code: the
    lease does not hold the job, or (no lease given) the job is not in a running reservation:
    where it is (LEASE_GONE: gone)
]]
--@include lib/codes
--@include lib/keys
--@include lib/wheel
--@include lib/lease
local now, id, lease = tonumber(ARGV[1]), ARGV[2], ARGV[3]
-- Without a lease, the reservation's own lease stands in: the check is then "reserved and
-- its ttr still running", and a refusal says where the job is, as for a lease.
local why = lease_check(id, lease ~= '' and lease or redis.call('HGET', LEASES, id), now)
if why == CODE.LEASE_GONE and KEYS[FIRST_EXTRA] and wheel_has(KEYS[FIRST_EXTRA], id) then
  why = CODE.LEASE_DELAYED -- resting in its wheel bucket
end
if why == CODE.LEASE_GONE and lease == '' then return CODE.NOT_FOUND end
if why ~= CODE.OK then return why end
redis.call('HSET', NOTES, 'p:' .. id, ARGV[4])
return CODE.OK
