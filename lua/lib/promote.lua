--[[
  DELAYED -> READY for the jobs that came due.
]]
--@include lib/keys
--@include lib/record
--@include lib/jobs

-- DELAYED (near zset) -> READY for jobs due by `now`; expired ones vanish. Bounded by limit.
local function promote(now, limit)
  local due = redis.call('ZRANGE', DELAYED, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
  local ids, moved, gone = {}, 0, 0
  for i = 1, #due, 2 do
    local id, t = due[i], tonumber(due[i + 1])
    ids[#ids + 1] = id
    local rec = redis.call('HGET', JOBS, id)
    if rec then
      if expired(rec, now) then
        drop(id, rec)
        redis.call('ZREM', EXPIRE, id)
        gone = gone + 1
      else
        make_ready(id, rec, t)
        moved = moved + 1
      end
    end
  end
  if #ids > 0 then zrem_many(DELAYED, ids) end
  return moved, gone
end
