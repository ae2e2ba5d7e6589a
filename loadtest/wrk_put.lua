-- wrk script: PUT the body in $WRK_BODY_FILE with the token in $WRK_TOKEN (publish / bulk).
local f = io.open(os.getenv("WRK_BODY_FILE"), "rb")
wrk.method = "PUT"
wrk.body = f:read("*a")
f:close()
wrk.headers["X-Token"] = os.getenv("WRK_TOKEN")
local non201 = 0
response = function(status, headers, body)
  if status ~= 201 then non201 = non201 + 1 end
end
done = function(summary, latency, requests)
  io.write(string.format("non-201 responses in last thread: %d\n", non201))
end
