#!lua
--[[
  Acks / deletes jobs in any state (lmstfy's DELETE /api/{ns}/{q}/job/{id}; also cancel).
  Nothing of the job remains afterwards but its id, remembered for a while (see ACKED).
  A job given with a lease is acked only while that delivery still holds it; if any lease of
  the call does not hold its job, nothing at all is acked (the caller names the conflicts).
  A job already gone is no conflict: acking it is what the holder wanted (and a repeat after a
  lost reply finds its own ack done).
  KEYS[1..10] the queue's fixed keys; KEYS[11..] wheel buckets of the ids
  ARGV[1] now (ms)  ARGV[2] how long acked ids are remembered (ms; 0 = not at all)
  ARGV[3] '1' to check the leases only, changing nothing (a route over several pools checks
    every pool before it acks on any)
  ARGV[4] n, then 4 values per job: member, bucket KEYS index (0 = none), bucket name,
    lease ('' = none)
  Returns: {state_1 .. state_n}: 0 not found, 1 delayed, 2 ready, 3 reserved, 4 dead;
    or, when a lease does not hold its job, nothing acked and per job 0 or -code (the codes of
    lease_check in lib/queue.lua)
]]
--@include lib/queue
local now, check_only, n = tonumber(ARGV[1]), ARGV[3] == '1', tonumber(ARGV[4])
local out, refused = {}, false
for j = 0, n - 1 do
  local b = 5 + j * 4
  local why = 0
  if ARGV[b + 3] ~= '' then why = lease_check(ARGV[b], ARGV[b + 3], now) % 6 end
  out[#out + 1] = -why
  refused = refused or why > 0
end
if refused or check_only then return out end
local acked = {}
for j = 0, n - 1 do
  local b = 5 + j * 4
  local kidx = tonumber(ARGV[b + 1])
  out[j + 1] = remove_job(ARGV[b], kidx > 0 and KEYS[kidx], ARGV[b + 2])
  if out[j + 1] > 0 then acked[#acked + 1] = ARGV[b] end
end
remember_acked(acked, now, tonumber(ARGV[2]))
tidy()
return out
