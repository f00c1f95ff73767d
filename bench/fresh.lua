-- wrk: every request carries a new Idempotency-Key (first executions).
local counter = 0
-- The path requests go to (idempotent-proxy-server takes /URL_<name>).
local path = os.getenv("BENCH_PATH") or "/v1/chat/completions"
-- Unique to this run and thread: wrk does not seed math.random, so a
-- random tag alone repeats from run to run, and a second run against the
-- same store would send the first run's keys (replays, not fresh keys).
local thread_tag
do
  local f = io.open("/proc/sys/kernel/random/uuid", "r")
  local uuid = f and f:read("*l")
  if f then f:close() end
  thread_tag = uuid or (os.time() .. "-" .. tostring({}):sub(8))
end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench-tenant"
wrk.body = '{"model":"m","messages":[{"role":"user","content":"hello"}]}'

request = function()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = "fresh-" .. thread_tag .. "-" .. counter
  return wrk.format(nil, path)
end
