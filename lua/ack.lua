#!lua
--[[
  Acks / deletes jobs in any state (lmstfy's DELETE /api/{ns}/{q}/job/{id}; also cancel).
  Nothing of the job remains afterwards but its id, remembered for a while (see ACKED).
  KEYS[1..9] the queue's fixed keys; KEYS[10..] wheel buckets of the ids
  ARGV[1] now (ms)  ARGV[2] how long acked ids are remembered (ms; 0 = not at all)
  ARGV[3] n, then 3 values per job: member, bucket KEYS index (0 = none), bucket name
  Returns: {state_1 .. state_n}: 0 not found, 1 delayed, 2 ready, 3 reserved, 4 dead
]]
--@include lib/queue
local out, acked = {}, {}
for j = 0, tonumber(ARGV[3]) - 1 do
  local b = 4 + j * 3
  local kidx = tonumber(ARGV[b + 1])
  out[#out + 1] = remove_job(ARGV[b], kidx > 0 and KEYS[kidx], ARGV[b + 2])
  if out[#out] > 0 then acked[#acked + 1] = ARGV[b] end
end
remember_acked(acked, tonumber(ARGV[1]), tonumber(ARGV[2]))
tidy()
return out
