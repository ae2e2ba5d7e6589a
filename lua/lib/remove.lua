--[[
  Removes a job wherever it is: JOBS and its state set, or its wheel bucket.
]]
--@include lib/keys
--@include lib/jobs
--@include lib/wheel

-- Removes a job wherever it is; returns the state code it was in (NOT_FOUND: nowhere). t: now.
local function remove_job(id, bucket, bname, t)
  local st = forget(id, t)
  if st == CODE.NOT_FOUND and bucket then
    local rec = wheel_get(bucket, id)
    if rec and unwheel(bucket, bname, id) == 1 then
      count_group(group_of(rec), -1)
      return CODE.DELAYED
    end
  end
  return st
end
