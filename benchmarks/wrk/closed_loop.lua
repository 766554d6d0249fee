-- wrk script for benchmarks.wrk_load: POST the corpus bodies in turn, print one JSON line at the end.
-- Bodies come one per line from the file named by WRK_BODIES (JSON never holds a raw newline).
local bodies = {}
for line in io.lines(os.getenv("WRK_BODIES")) do
  bodies[#bodies + 1] = line
end
local next_body = 0

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

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
