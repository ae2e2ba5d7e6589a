-- wrk script of bench_cpu.py: one request kind per run, from the environment.
--   WRK_METHOD   PUT / GET / DELETE
--   WRK_TOKEN    the X-Token header
--   WRK_BODY_FILE  the body of every request (optional)
--   WRK_IDS_FILE   one job id per line: each request's path is the URL's path followed by
--                  the next id of this thread's share (thread n takes lines n, n+T, ...)
local threads = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("index", counter)
  table.insert(threads, thread)
end

local ids, next_id, step = nil, 1, 1

function init(args)
  wrk.method = os.getenv("WRK_METHOD") or "GET"
  wrk.headers["X-Token"] = os.getenv("WRK_TOKEN")
  local body = os.getenv("WRK_BODY_FILE")
  if body and body ~= "" then
    local f = io.open(body, "rb")
    wrk.body = f:read("*a")
    f:close()
  end
  local file = os.getenv("WRK_IDS_FILE")
  if file and file ~= "" then
    ids = {}
    for line in io.lines(file) do ids[#ids + 1] = line end
    step = tonumber(os.getenv("WRK_THREADS") or "1")
    next_id = index
  end
end

function request()
  if ids == nil then
    return wrk.format()
  end
  local id = ids[((next_id - 1) % #ids) + 1]
  next_id = next_id + step
  return wrk.format(nil, wrk.path .. id)
end
