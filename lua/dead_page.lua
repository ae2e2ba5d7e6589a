#!lua flags=no-writes
--[[
  One page of the dead letter, oldest death first, from just after a cursor position (score =
  time of death, member): an entry that stays dead is listed exactly once over a walk, however
  the dead letter changes meanwhile. Bodies are not sent, only their size. A page stops early
  (`more`) once it has read 8 MB of records: large bodies make shorter pages, never long calls.
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] after_score: the cursor's time of death (ms; -1 = from the start)
  ARGV[2] after_member: the cursor's member ('' = before every member at that score)
  ARGV[3] limit: entries per page
  Returns: {more (1 when entries follow this page), then 5 values per entry: member, time of
    death (ms), record without its body, body size (bytes), note ('' when none)}
]]
--@include lib/codes
--@include lib/keys
--@include lib/dead
local score, member, limit = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local from = 0
if score >= 0 then from = dead_rank_after(score, member) end
local got = redis.call('ZRANGE', DEAD, from, from + limit, 'WITHSCORES')
local out, bytes = {0}, 0
for i = 1, #got, 2 do
  local id = got[i]
  if i > 2 * limit or (i > 1 and bytes > RECORD_BYTES_PER_CALL) then
    out[1] = 1
    break
  end
  bytes = bytes + redis.call('HSTRLEN', JOBS, id)
  local rec = redis.call('HGET', JOBS, id) or ''
  -- the record's header and sections (lib/record.lua body_at), without the body
  local head = 18
  if #rec >= 18 then head = body_at(rec) - 1 end
  out[#out + 1] = id
  out[#out + 1] = got[i + 1]
  out[#out + 1] = string.sub(rec, 1, head)
  out[#out + 1] = math.max(#rec - head, 0)
  out[#out + 1] = redis.call('HGET', NOTES, id) or ''
end
return out
