--[[
  The queue's notice to its long-polls (a job to take, or one due sooner than they knew).
]]
--@include lib/keys
--@include lib/jobs

-- The queue's notice to its long-polls: '1' when READY went from empty to non-empty (take a
-- job), else 'due:<ms>' when this call put a job into DELAYED that is due before any other
-- there (wake up by then: it is earlier than anything the long-polls knew of).
local function notify(channel, was_empty)
  if channel == '' then return end
  if was_empty and redis.call('EXISTS', READY) == 1 then
    redis.call('SPUBLISH', channel, '1')
  elseif SOONEST and (not HEAD or SOONEST < HEAD) then
    redis.call('SPUBLISH', channel, 'due:' .. SOONEST)
  end
end
