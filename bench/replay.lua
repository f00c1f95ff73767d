-- wrk: requests cycle over a small set of keys that are already DONE (replays).
local keys = tonumber(os.getenv("REPLAY_KEYS") or "100")
local counter = 0
-- The path requests go to (idempotent-proxy-server takes /URL_<name>).
local path = os.getenv("BENCH_PATH") or "/v1/chat/completions"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench-tenant"
wrk.body = '{"model":"m","messages":[{"role":"user","content":"hello"}]}'

request = function()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = "replay-" .. (counter % keys)
  return wrk.format(nil, path)
end
