#!lua
--[[
  Acks / deletes jobs in any state (lmstfy's DELETE /api/{ns}/{q}/job/{id}; also cancel).
  Nothing of the job remains afterwards.
  KEYS[1..8] the queue's fixed keys; KEYS[9..] wheel buckets of the ids
  ARGV[1] n, then 3 values per job: member, bucket KEYS index (0 = none), bucket name
  Returns: {state_1 .. state_n}: 0 not found, 1 delayed, 2 ready, 3 reserved, 4 dead
]]
--@include lib/queue
local out = {}
for j = 0, tonumber(ARGV[1]) - 1 do
  local b = 2 + j * 3
  local kidx = tonumber(ARGV[b + 1])
  out[#out + 1] = remove_job(ARGV[b], kidx > 0 and KEYS[kidx], ARGV[b + 2])
end
tidy()
return out
