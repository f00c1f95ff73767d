-- wrk: every request carries a new Idempotency-Key (first executions).
local counter = 0
-- The path requests go to (idempotent-proxy-server takes /URL_<name>).
local path = os.getenv("BENCH_PATH") or "/v1/chat/completions"
local thread_tag = tostring(math.random(1, 1e9))
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench-tenant"
wrk.body = '{"model":"m","messages":[{"role":"user","content":"hello"}]}'

request = function()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = "fresh-" .. thread_tag .. "-" .. counter
  return wrk.format(nil, path)
end
