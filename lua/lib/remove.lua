--[[
  Removes a job wherever it is: JOBS and its state set, or its wheel bucket.
]]
--@include lib/keys
--@include lib/jobs
--@include lib/wheel

-- Removes a job wherever it is; returns the state code it was in (NOT_FOUND: nowhere).
local function remove_job(id, bucket, bname)
  local st = forget(id)
  if st == CODE.NOT_FOUND and bucket then
    if unwheel(bucket, bname, id) == 1 then return CODE.DELAYED end
  end
  return st
end
