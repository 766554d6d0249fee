-- wrk script for benchmarks.wrk_load: send the bodies in turn, print one JSON line at the end.
-- Two kinds of body. WRK_BODIES names a file of JSON bodies, one a line (JSON never holds a raw
-- newline), POSTed as application/json. WRK_FILES (run_files) names a file of paths, one a line: each
-- file is a whole body, read once and sent as is with no Content-Type, as `curl -T FILE URL` sends it
-- (PUT unless WRK_METHOD says otherwise).
local bodies = {}
local files = os.getenv("WRK_FILES")
if files then
  for path in io.lines(files) do
    local f = assert(io.open(path, "rb"))
    bodies[#bodies + 1] = f:read("*a")
    f:close()
  end
  wrk.method = os.getenv("WRK_METHOD") or "PUT"
else
  for line in io.lines(os.getenv("WRK_BODIES")) do
    bodies[#bodies + 1] = line
  end
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end
local next_body = 0

function request()
  next_body = next_body % #bodies + 1
  return wrk.format(nil, nil, nil, bodies[next_body])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_RESULT {"requests": %d, "duration_us": %d, "status_errors": %d, "socket_errors": %d, ' ..
    '"p50_us": %d, "p95_us": %d, "p99_us": %d, "mean_us": %f}\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), latency.mean))
end
