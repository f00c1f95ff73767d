#!/usr/bin/env bash
# Fresh keys on Redis, builds alternated round by round: the way to tell
# two builds (or idemgate and idempotent-proxy-server) apart on a shared
# machine whose speed drifts by tens of percent within minutes. One run of
# bench/gateway.sh compares targets minutes apart; here each round runs
# every target back to back, so compare them within a round.
#
# Every target proxies to the same nginx `return 200` and gets its own
# Redis database, emptied before and after its run. Each row: wrk -t1 -c16
# with bench/fresh.lua (a new Idempotency-Key per request), then the
# target's CPU and the Redis server's CPU per request (user + system, from
# /proc), and Redis memory per key written (`used_memory` after the run
# minus before, over the requests).
#
# Usage: bench/alternate.sh NAME=BINARY...   e.g.
#   bench/alternate.sh before=/tmp/idemgate-before after=target/release/idemgate
# Env: ROUNDS (4), DURATION (8s), REDIS_PORT (6379), FIRST_DB (5; the
#      targets use FIRST_DB, FIRST_DB+1, …), PORT_BASE (18500),
#      IPX_BIN (idempotent-proxy-server, run as one more target when found;
#      default: on PATH or in $HOME/.cargo/bin; IPX_BIN=none leaves it out)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,21p' "$0" >&2; exit 2; }
ROUNDS=${ROUNDS:-4}; DURATION=${DURATION:-8s}
REDIS_PORT=${REDIS_PORT:-6379}; FIRST_DB=${FIRST_DB:-5}; PORT_BASE=${PORT_BASE:-18500}
IPX_BIN=${IPX_BIN:-$(command -v idempotent-proxy-server || echo "$HOME/.cargo/bin/idempotent-proxy-server")}
WORK=$(mktemp -d)
PIDS=()
# shellcheck source=bench/common.sh
. bench/common.sh
trap stop_started EXIT

rcli() { redis-cli -p "$REDIS_PORT" "$@"; }
rcli ping >/dev/null || { echo "no Redis on port $REDIS_PORT" >&2; exit 1; }
REDIS_PID=$(pgrep -f "redis-server .*:$REDIS_PORT( |$)" | head -1)
[ -n "$REDIS_PID" ] || { echo "no redis-server process for port $REDIS_PORT" >&2; exit 1; }

UP=$PORT_BASE
start_static_upstream "$UP"

# Targets: name, url, path, pid, db.
NAMES=(); URLS=(); PATHS=(); TPIDS=(); DBS=()
n=0
for spec in "$@"; do
  name=${spec%%=*}; BIN=${spec#*=}
  [ -x "$BIN" ] || { echo "$BIN is not an executable" >&2; exit 1; }
  db=$((FIRST_DB + n)); port=$((PORT_BASE + 10 + 2 * n))
  start_gateway "http://127.0.0.1:$UP" "$port" "$((port + 1))" \
    "redis://127.0.0.1:$REDIS_PORT/$db" "$WORK/$name.log"
  NAMES+=("$name"); URLS+=("http://127.0.0.1:$port"); PATHS+=(/v1/chat/completions)
  TPIDS+=("$GW_PID"); DBS+=("$db"); n=$((n + 1))
done
if [ "$IPX_BIN" != none ] && [ -x "$IPX_BIN" ]; then
  db=$((FIRST_DB + n)); port=$((PORT_BASE + 10 + 2 * n))
  start_ipx "http://127.0.0.1:$UP/v1/chat/completions" "$port" "$WORK/ipx" \
    "redis://127.0.0.1:$REDIS_PORT/$db"
  NAMES+=(idempotent-proxy); URLS+=("http://127.0.0.1:$port"); PATHS+=(/URL_BENCH)
  TPIDS+=("$IPX_PID"); DBS+=("$db")
fi

used_memory() { rcli info memory | awk -F: '/^used_memory:/ {print $2 + 0}'; }

run() { # index
  local i=$1 out m0 m1 a b r0 r1
  rcli -n "${DBS[$i]}" flushdb >/dev/null; sleep 1
  m0=$(used_memory); a=$(cpu_ticks "${TPIDS[$i]}"); r0=$(cpu_ticks "$REDIS_PID")
  out=$(BENCH_PATH="${PATHS[$i]}" wrk -t1 -c16 -d"$DURATION" --latency -s bench/fresh.lua "${URLS[$i]}" 2>&1)
  b=$(cpu_ticks "${TPIDS[$i]}"); r1=$(cpu_ticks "$REDIS_PID")
  sleep 0.5; m1=$(used_memory)
  rcli -n "${DBS[$i]}" flushdb >/dev/null
  awk -v name="${NAMES[$i]}" -v a="$a" -v b="$b" -v r0="$r0" -v r1="$r1" -v m0="$m0" -v m1="$m1" \
    -v hz="$(getconf CLK_TCK)" '
    /requests in/ { n = $1 } /Requests\/sec/ { rps = $2 } $1 == "99%" { p99 = $2 }
    /Non-2xx/ { bad = $4 }
    END {
      if (n == 0) { printf "%-18s no requests\n", name; exit }
      printf "%-18s %10s %9s %10.0f %10.0f %10.0f %8d\n", name, rps, p99,
        (b - a) / hz * 1e6 / n, (r1 - r0) / hz * 1e6 / n, (m1 - m0) / n, bad + 0
    }' <<<"$out"
}

steal() { awk '/^cpu / {print $9}' /proc/stat; }
s0=$(steal)
echo "fresh keys on Redis, wrk -t1 -c16 -d$DURATION, $ROUNDS rounds"
printf '%-18s %10s %9s %10s %10s %10s %8s\n' target req/s p99 "cpu us" "redis us" "B/key" non-2xx
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round"
  for i in "${!NAMES[@]}"; do run "$i"; done
done
s1=$(steal)
awk -v t="$((s1 - s0))" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "steal over the run: %.1f s of CPU time\n", t / hz }'
