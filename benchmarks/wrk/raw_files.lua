-- wrk script for benchmarks.wrk_load.run_files: each request's body is a whole file, sent as is with no
-- Content-Type, as `curl -T FILE URL` sends it (PUT by default; WRK_METHOD overrides). The files, one
-- path a line in the file named by WRK_FILES, are read once and sent in turn. Prints the same one JSON
-- line as closed_loop.lua at the end (benchmarks/wrk_load.py parses it).
local bodies = {}
for path in io.lines(os.getenv("WRK_FILES")) do
  local f = assert(io.open(path, "rb"))
  bodies[#bodies + 1] = f:read("*a")
  f:close()
end
local next_body = 0

wrk.method = os.getenv("WRK_METHOD") or "PUT"

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
