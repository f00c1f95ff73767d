#!/usr/bin/env bash
# Gateway load benchmark, all in one run so the figures compare as ratios:
#   direct   wrk -> static upstream (nginx `return 200` JSON)
#   nginx    wrk -> nginx proxy_pass -> upstream   (the plain-proxy floor)
#   idemgate wrk -> idemgate (fresh keys, then replayed keys) -> upstream
# Usage: bench/gateway.sh [STORE_URL]   (default: sqlite in a temp dir)
# Env: DURATION (8s) CONNS (16) THREADS (1) PORT_BASE (18091)
#      BENCH_BIN (a prebuilt binary; default: build the release binary)
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8s}; CONNS=${CONNS:-16}; THREADS=${THREADS:-1}
WORK=$(mktemp -d)
STORE=${1:-sqlite:$WORK/bench.db}
PORT_BASE=${PORT_BASE:-18091}
UP=$PORT_BASE; PROXY=$((PORT_BASE + 1)); GW=$((PORT_BASE + 2)); ADMIN=$((PORT_BASE + 3))
if [ -n "${BENCH_BIN:-}" ]; then
  BIN=$BENCH_BIN
else
  BIN=${CARGO_TARGET_DIR:-target}/release/idemgate
  cargo build --release -q -p idemgate
fi
cleanup() {
  [ -n "${GW_PID:-}" ] && kill "$GW_PID" 2>/dev/null || true
  [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

cat > "$WORK/nginx.conf" <<NGX
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  upstream backend { server 127.0.0.1:$UP; keepalive 64; }
  server {
    listen 127.0.0.1:$UP;
    location / {
      default_type application/json;
      return 200 '{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}';
    }
  }
  server {
    listen 127.0.0.1:$PROXY;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
NGX
nginx -c "$WORK/nginx.conf" -p "$WORK"

"$BIN" serve --upstream "http://127.0.0.1:$UP" --listen "127.0.0.1:$GW" \
  --admin-listen "127.0.0.1:$ADMIN" --store "$STORE" >"$WORK/gw.log" 2>&1 &
GW_PID=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$ADMIN/healthz" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$ADMIN/healthz" >/dev/null || { echo "the gateway did not start:" >&2; cat "$WORK/gw.log" >&2; exit 1; }

run() { # name url script
  local out
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency ${3:+-s "$3"} "$2" 2>&1)
  local rps p50 p99
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  local errs
  errs=$(awk '/Non-2xx/ {print $4}' <<<"$out")
  printf '%-22s %12s %10s %10s %8s\n' "$1" "$rps" "$p50" "$p99" "${errs:-0}"
  echo "$1|$rps" >>"$WORK/rps"
}

# Warm the replay keys once.
for i in $(seq 0 99); do
  curl -sf -o /dev/null -X POST "http://127.0.0.1:$GW/v1/chat/completions" \
    -H 'Content-Type: application/json' -H 'Authorization: Bearer bench-tenant' \
    -H "Idempotency-Key: replay-$i" \
    -d '{"model":"m","messages":[{"role":"user","content":"hello"}]}'
done

echo "store: $STORE   wrk -t$THREADS -c$CONNS -d$DURATION"
printf '%-22s %12s %10s %10s %8s\n' "target" "req/s" "p50" "p99" "non-2xx"
run "upstream direct" "http://127.0.0.1:$UP/v1/chat/completions" bench/fresh.lua
run "nginx proxy_pass" "http://127.0.0.1:$PROXY/v1/chat/completions" bench/fresh.lua
run "idemgate fresh keys" "http://127.0.0.1:$GW" bench/fresh.lua
run "idemgate replays" "http://127.0.0.1:$GW" bench/replay.lua
nginx_rps=$(awk -F'|' '/^nginx/ {print $2}' "$WORK/rps")
echo
echo "ratios to nginx proxy_pass:"
while IFS='|' read -r name val; do
  awk -v n="$name" -v v="$val" -v g="$nginx_rps" 'BEGIN { printf "  %-22s %.2fx\n", n, v/g }'
done <"$WORK/rps"
