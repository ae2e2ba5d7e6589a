#!lua
--[[
  Acks / deletes jobs in any state (lmstfy's DELETE /api/{ns}/{q}/job/{id}; also cancel).
  Nothing of the job remains afterwards but its id, remembered for a while (see ACKED).
  A job given with a lease is acked only while that delivery still holds it; if any lease of
  the call does not hold its job, nothing at all is acked (the caller names the conflicts).
  A job already gone is no conflict: acking it is what the holder wanted (and a repeat after a
  lost reply finds its own ack done).
  KEYS[1..12] queue: the queue's fixed keys, in the order of lib/queue.lua
  KEYS[13..] buckets...: wheel buckets of the ids
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] remember_acked: how long acked ids are remembered (ms; 0 = not at all)
  ARGV[3] check_only: '1' to check the leases only, changing nothing (a route over several
    pools checks every pool before it acks on any)
  ARGV[4] n: the number of jobs
  ARGV[5..] jobs...: 4 values per job: member, bucket KEYS index (0 = none), bucket name,
    lease ('' = none)
  Returns: {code_1 .. code_n}: the state each job was in (NOT_FOUND, DELAYED, READY, RESERVED,
    DEAD); or, with check_only or when a lease does not hold its job (nothing acked then),
    per job OK or a LEASE_* code (LEASE_GONE counts as OK)
]]
--@include lib/codes
--@include lib/queue
local now, check_only, n = tonumber(ARGV[1]), ARGV[3] == '1', tonumber(ARGV[4])
local out, refused = {}, false
for j = 0, n - 1 do
  local b = 5 + j * 4
  local why = CODE.OK
  if ARGV[b + 3] ~= '' then why = lease_check(ARGV[b], ARGV[b + 3], now) end
  if why == CODE.LEASE_GONE then why = CODE.OK end
  out[#out + 1] = why
  refused = refused or why ~= CODE.OK
end
if refused or check_only then return out end
local acked = {}
for j = 0, n - 1 do
  local b = 5 + j * 4
  local kidx = tonumber(ARGV[b + 1])
  out[j + 1] = remove_job(ARGV[b], kidx > 0 and KEYS[kidx], ARGV[b + 2])
  if out[j + 1] ~= CODE.NOT_FOUND then acked[#acked + 1] = ARGV[b] end
end
remember_acked(acked, now, tonumber(ARGV[2]))
tidy()
return out
