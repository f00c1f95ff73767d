-- wrk: every request carries a new Idempotency-Key (first executions).
local counter = 0
local thread_tag = tostring(math.random(1, 1e9))
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench-tenant"
wrk.body = '{"model":"m","messages":[{"role":"user","content":"hello"}]}'

request = function()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = "fresh-" .. thread_tag .. "-" .. counter
  return wrk.format(nil, "/v1/chat/completions")
end
