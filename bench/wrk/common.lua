-- Shared by json.lua and binary.lua (loaded with dofile): reads the request body from the file
-- named by BENCH_BODY and prints one machine-readable result line from done().
local M = {}

function M.read_body()
   local path = os.getenv("BENCH_BODY")
   assert(path and path ~= "", "BENCH_BODY (request body file) is not set")
   local f = assert(io.open(path, "rb"))
   local body = f:read("*a")
   f:close()
   return body
end

function M.done(summary, latency, requests)
   local e = summary.errors
   local secs = summary.duration / 1e6
   -- wrk counts every answer with status > 399 in errors.status; socket errors separately.
   io.write(string.format(
      "BENCH_RESULT {\"requests\": %d, \"duration_s\": %.6f, \"rps\": %.3f, " ..
      "\"p50_us\": %d, \"p90_us\": %d, \"p99_us\": %d, \"max_us\": %d, \"non2xx\": %d, " ..
      "\"connect_err\": %d, \"read_err\": %d, \"write_err\": %d, \"timeout_err\": %d}\n",
      summary.requests, secs, summary.requests / secs,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
      e.status, e.connect, e.read, e.write, e.timeout))
end

return M
