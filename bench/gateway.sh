#!/usr/bin/env bash
# Gateway load benchmark, all in one run so the figures compare as ratios.
#
# Part 1, closed loop (wrk, as fast as the target answers; the upstream is
# nginx `return 200`, which answers at once):
#   direct   wrk -> static upstream
#   nginx    wrk -> nginx proxy_pass -> upstream   (the plain-proxy floor)
#   idemgate wrk -> idemgate (fresh keys, then replayed keys) -> upstream
#   idempotent-proxy-server (Redis stores only, when its binary is there)
#   on PostgreSQL, two pgbench floors first (-c CONNS, as long): the minimal
#     one (bench/pg_floor_minimal.sql, two plain statements) and the
#     store's own claim and completion as this build sends them (the
#     idemgate-postgres example pgbench_script); the fresh-key row is then
#     given as a ratio to each
#
# Part 2, held rate (bench/loadgen, open loop: request i is due at
# start + i/rate, latency from that time, so queueing is counted). The
# upstream is the simulator answering in SLOW_MS (20) ms:
#   direct   loadgen -> simulator
#   idemgate loadgen -> idemgate -> simulator (fresh keys, then replays)
#   idempotent-proxy-server, as above
# Every row asks the simulator for uncompressed answers (see UPSTREAM_PLAIN).
# "Added" is idemgate minus direct at the same percentile and rate; each
# proxy row also reports the proxy's and the store's CPU per request.
#
# Part 3, stream pacing (bench/stream_gaps.py with the official openai client
# from .venv, skipped without it, and with a plain socket): STREAMS streams
# one after the other on one kept-alive client, a token every TOKEN_MS ms,
# direct and through idemgate; the gaps between chunks should stay at
# TOKEN_MS.
#
# Usage: bench/gateway.sh [STORE_URL]   (default: sqlite in a temp dir)
# Env: DURATION (8s) CONNS (16) THREADS (1) PORT_BASE (18091)
#      HELD_RATE (5000) HELD_DURATION (30s) HELD_WARMUP (5s)
#      HELD_CONNS (512) SLOW_MS (20)
#      STREAMS (50) TOKEN_MS (10)
#      PARTS ("wrk held stream": the parts to run)
#      TRACE_DIR (held rows also write LABEL.trace there, every request's
#        timing, for bench/tail.py)
#      WAKEUPS (1: held proxy rows also count the proxy's context switches
#        and futex calls per request, with `perf stat`)
#      BENCH_BIN, BENCH_LOADGEN, BENCH_SIM (prebuilt binaries; default:
#        build the release binaries of this tree)
#      GATEWAY_WORKERS (the gateway's --workers; default: one per core)
#      IPX_BIN (idempotent-proxy-server; default: found on PATH or in
#        $HOME/.cargo/bin, skipped when missing), IPX_REDIS_DB (9),
#      IPX_WORKERS (its TOKIO_WORKER_THREADS; default: one per core),
#      IPX_LOG_LEVEL (its LOG_LEVEL; default: info, its own default, at
#        which it logs one line per request as idemgate does)
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8s}; CONNS=${CONNS:-16}; THREADS=${THREADS:-1}
HELD_RATE=${HELD_RATE:-5000}; HELD_DURATION=${HELD_DURATION:-30s}
HELD_WARMUP=${HELD_WARMUP:-5s}; HELD_CONNS=${HELD_CONNS:-512}; SLOW_MS=${SLOW_MS:-20}
PARTS=${PARTS:-wrk held stream}
STREAMS=${STREAMS:-50}; TOKEN_MS=${TOKEN_MS:-10}
WORK=$(mktemp -d)
STORE=${1:-sqlite:$WORK/bench.db}
PORT_BASE=${PORT_BASE:-18091}
UP=$PORT_BASE; PROXY=$((PORT_BASE + 1)); GW=$((PORT_BASE + 2)); ADMIN=$((PORT_BASE + 3))
SIM=$((PORT_BASE + 4)); GW_SLOW=$((PORT_BASE + 5)); ADMIN_SLOW=$((PORT_BASE + 6))
IPX=$((PORT_BASE + 7)); IPX_SLOW=$((PORT_BASE + 8))
SIM_STREAM=$((PORT_BASE + 9)); GW_STREAM=$((PORT_BASE + 10)); ADMIN_STREAM=$((PORT_BASE + 11))
# shellcheck source=bench/common.sh
. bench/common.sh
bench_binaries
IPX_BIN=${IPX_BIN:-$(command -v idempotent-proxy-server || echo "$HOME/.cargo/bin/idempotent-proxy-server")}
IPX_REDIS_DB=${IPX_REDIS_DB:-9}
PIDS=(); GW_PID=; IPX_PID=
trap stop_started EXIT

# idempotent-proxy-server keeps its records in Redis; it runs beside the
# Redis store's runs only (so it shares the server idemgate uses there).
IPX_ON=0
case "$STORE" in
  redis://*)
    if [ -x "$IPX_BIN" ]; then IPX_ON=1; else
      echo "idempotent-proxy-server not found ($IPX_BIN): its rows are skipped" >&2; fi ;;
esac
redis_base() { # redis://host:port from the store URL
  local hp=${STORE#redis://}; hp=${hp%%/*}; hp=${hp%%\?*}; echo "redis://$hp"
}

ipx_cleanup() {
  local hp=${STORE#redis://}; hp=${hp%%/*}; hp=${hp%%\?*}
  redis-cli -h "${hp%%:*}" -p "${hp##*:}" -n "$IPX_REDIS_DB" --scan --pattern '*POST:*' \
    | xargs -r -n 500 redis-cli -h "${hp%%:*}" -p "${hp##*:}" -n "$IPX_REDIS_DB" del >/dev/null || true
}

warm_replays() { # base-url path
  for i in $(seq 0 99); do
    curl -sf -o /dev/null -X POST "$1$2" \
      -H 'Content-Type: application/json' -H 'Authorization: Bearer bench-tenant' \
      -H "Idempotency-Key: replay-$i" \
      -d '{"model":"m","messages":[{"role":"user","content":"hello"}]}'
  done
}

# ---------------------------------------------------------------- part 1
# The store server's processes, for its CPU per request: PostgreSQL's are
# every process of the server's user (backends come and go), Redis's the
# server on the store's port; SQLite runs inside the gateway.
store_pids() {
  case "$STORE" in
    postgres://*|postgresql://*) pgrep -u "${PG_OS_USER:-postgres}" | tr '\n' ' ' ;;
    redis://*)
      local hp=${STORE#redis://}; hp=${hp%%/*}; hp=${hp%%\?*}
      pgrep -f "redis-server .*:${hp##*:}( |$)" | tr '\n' ' ' ;;
  esac
}

us_per_req() { # ticks-before ticks-after requests
  awk -v a="$1" -v b="$2" -v hz="$(getconf CLK_TCK)" -v n="${3:-0}" \
    'BEGIN { if (n > 0 && b > a) printf "%.0f", (b - a) / hz * 1e6 / n; else print "-" }'
}

pg_url() { # the store URL without idemgate's query parameters, for pgbench and psql
  echo "${STORE%%\?*}"
}

# pgbench -D values shaped like what the gateway sends for one fresh key:
# a 32-byte fingerprint, an 8-byte token, a stored answer of about the
# static upstream's size with its headers, a timeline entry, the default
# lease and retention.
pg_floor_vars() {
  local hex
  hex() { head -c "$1" /dev/urandom | od -An -v -tx1 | tr -d ' \n'; }
  printf '%s\n' -D tenant=bench-tenant -D namespace=/ \
    -D "fingerprint=\\x$(hex 32)" -D "token=\\x$(hex 8)" -D "payload=\\x$(hex 420)" \
    -D 'entry={"at_ms":1,"replica":"bench","outcome":"executed","status":200,"latency_us":900}' \
    -D pending_ms=30000 -D done_ms=86400000
}

run_pgbench() { # name script: a floor row, with the server's CPU per transaction
  local name=$1 script=$2 out tps n s0 s1 vars
  mapfile -t vars < <(pg_floor_vars)
  # shellcheck disable=SC2046 # one word per pid
  s0=$(cpu_ticks $(store_pids))
  out=$(pgbench -n -M prepared -c "$CONNS" -j "$THREADS" -T "$(seconds "$DURATION")" \
    -f "$script" "${vars[@]}" "$(pg_url)" 2>&1) || { echo "$out" >&2; exit 1; }
  # shellcheck disable=SC2046
  s1=$(cpu_ticks $(store_pids))
  tps=$(awk '/^tps/ {printf "%.2f", $3}' <<<"$out")
  n=$(awk '/actually processed/ {print $NF}' <<<"$out")
  printf '%-30s %12s %10s %10s %8s %10s %10s\n' "$name" "$tps" - - 0 - "$(us_per_req "$s0" "$s1" "$n")"
  echo "$name|$tps" >>"$WORK/floors"
}

pg_floors() {
  local own=$TARGET/release/examples/pgbench_script
  cargo build --release -q -p idemgate-postgres --example pgbench_script
  psql -q -X -v ON_ERROR_STOP=1 "$(pg_url)" >/dev/null <<'SQL'
DROP SCHEMA IF EXISTS bench_floor CASCADE;
DROP SCHEMA IF EXISTS bench_floor_minimal CASCADE;
CREATE SCHEMA bench_floor_minimal;
CREATE TABLE bench_floor_minimal.records (id text PRIMARY KEY, fence bigint NOT NULL,
  state text NOT NULL, expires_at timestamptz NOT NULL, payload bytea);
SQL
  "$own" "$STORE" bench_floor >"$WORK/own.sql" 2>"$WORK/own.log" || { cat "$WORK/own.log" >&2; exit 1; }
  : >"$WORK/floors"
  run_pgbench "pgbench minimal floor" bench/pg_floor_minimal.sql
  run_pgbench "pgbench idemgate statements" "$WORK/own.sql"
  # The floors wrote hundreds of MB of WAL: a checkpoint now lets the
  # gateway's rows recycle those segments rather than create new ones
  # inside their commits (see pg_warm_wal in bench/common.sh).
  psql -q -X "$(pg_url)" -c CHECKPOINT
}

run_wrk() { # name url path script [pid...]: the pids' CPU is charged per request
  local name=$1 url=$2 path=$3 script=$4 out rps p50 p99 errs reqs t0 t1 s0 s1 cpu scpu
  shift 4
  # shellcheck disable=SC2046 # one word per pid
  s0=$(cpu_ticks $(store_pids))
  t0=$(cpu_ticks "$@")
  out=$(BENCH_PATH="${path:-/v1/chat/completions}" \
    wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency -s "$script" "$url" 2>&1)
  t1=$(cpu_ticks "$@")
  # shellcheck disable=SC2046
  s1=$(cpu_ticks $(store_pids))
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  errs=$(awk '/Non-2xx/ {print $4}' <<<"$out")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  cpu=$(us_per_req "$t0" "$t1" "$reqs")
  scpu=$(us_per_req "$s0" "$s1" "$reqs")
  printf '%-30s %12s %10s %10s %8s %10s %10s\n' "$name" "$rps" "$p50" "$p99" "${errs:-0}" "$cpu" "$scpu"
  echo "$name|$rps" >>"$WORK/rps"
}

part_wrk() {
  start_static_upstream "$UP" "$PROXY"
  start_gateway "http://127.0.0.1:$UP" "$GW" "$ADMIN" "$STORE" "$WORK/gw.log"
  warm_replays "http://127.0.0.1:$GW" /v1/chat/completions
  if [ "$IPX_ON" = 1 ]; then
    start_ipx "http://127.0.0.1:$UP/v1/chat/completions" "$IPX" "$WORK/ipx" "$(redis_base)/$IPX_REDIS_DB"
    warm_replays "http://127.0.0.1:$IPX" /URL_BENCH
  fi

  echo "store: $STORE   wrk -t$THREADS -c$CONNS -d$DURATION (closed loop, upstream answers at once)"
  echo "cpu us/req: CPU of the process under test per request (nginx rows: both its"
  echo "roles, so proxy_pass minus direct is the proxy hop); store us/req: the store server's"
  echo "processes over the same run (none for SQLite, which runs inside the gateway)"
  printf '%-30s %12s %10s %10s %8s %10s %10s\n' "target" "req/s" "p50" "p99" "non-2xx" "cpu us/req" "store us/req"
  : >"$WORK/rps"
  local nginx_pids
  nginx_pids=$(pgrep -P "$(cat "$WORK/nginx.pid")" | tr '\n' ' ')
  case "$STORE" in postgres://*|postgresql://*) pg_floors ;; esac
  # shellcheck disable=SC2086 # one word per pid
  run_wrk "upstream direct" "http://127.0.0.1:$UP/v1/chat/completions" "" bench/fresh.lua $nginx_pids
  # shellcheck disable=SC2086
  run_wrk "nginx proxy_pass" "http://127.0.0.1:$PROXY/v1/chat/completions" "" bench/fresh.lua $nginx_pids
  run_wrk "idemgate fresh keys" "http://127.0.0.1:$GW" "" bench/fresh.lua "$GW_PID"
  run_wrk "idemgate replays" "http://127.0.0.1:$GW" "" bench/replay.lua "$GW_PID"
  if [ "$IPX_ON" = 1 ]; then
    run_wrk "idempotent-proxy fresh keys" "http://127.0.0.1:$IPX" /URL_BENCH bench/fresh.lua "$IPX_PID"
    run_wrk "idempotent-proxy replays" "http://127.0.0.1:$IPX" /URL_BENCH bench/replay.lua "$IPX_PID"
  fi
  local nginx_rps
  nginx_rps=$(awk -F'|' '/^nginx/ {print $2}' "$WORK/rps")
  echo
  echo "ratios to nginx proxy_pass:"
  while IFS='|' read -r name val; do
    awk -v n="$name" -v v="$val" -v g="$nginx_rps" 'BEGIN { printf "  %-30s %.2fx\n", n, v/g }'
  done <"$WORK/rps"
  if [ -s "$WORK/floors" ]; then
    local fresh
    fresh=$(awk -F'|' '$1 == "idemgate fresh keys" {print $2}' "$WORK/rps")
    echo "idemgate fresh keys as a ratio to each PostgreSQL floor (target: >= 0.6x the minimal):"
    while IFS='|' read -r name val; do
      awk -v n="$name" -v v="$val" -v f="$fresh" 'BEGIN { printf "  %-30s %.2fx\n", n, f/v }'
    done <"$WORK/floors"
  fi
  echo
}

# ---------------------------------------------------------------- part 2
seconds() { # 30s, 500ms, 2m -> seconds
  awk -v d="$1" 'BEGIN { n = d + 0; if (d ~ /ms$/) n /= 1000; else if (d ~ /m$/) n *= 60; print n }'
}

held() { # label url mode extra-header [pid...]: the pids' CPU is charged per request
  local label=$1 url=$2 mode=$3 header=$4 out t0 t1 s0 s1 sent perf_pid=
  shift 4
  if [ "${WAKEUPS:-0}" = 1 ] && [ $# -gt 0 ]; then
    perf stat -x, -e context-switches,syscalls:sys_enter_futex -p "$(IFS=,; echo "$*")" \
      -o "$WORK/wakeups-$label" &
    perf_pid=$!
  fi
  # shellcheck disable=SC2046 # one word per pid
  s0=$(cpu_ticks $(store_pids)); t0=$(cpu_ticks "$@")
  out=$("$LOADGEN" --url "$url" --rate "$HELD_RATE" --duration "$HELD_DURATION" \
    --warmup "$HELD_WARMUP" --connections "$HELD_CONNS" --mode "$mode" --label "$label" \
    --header 'Authorization: Bearer bench-tenant' --header "$header" --format kv \
    ${TRACE_DIR:+--trace "$TRACE_DIR/$label.trace"})
  # shellcheck disable=SC2046
  t1=$(cpu_ticks "$@"); s1=$(cpu_ticks $(store_pids))
  # Requests sent over the warm-up and the measured window alike.
  sent=$(awk -v r="$HELD_RATE" -v a="$(seconds "$HELD_WARMUP")" -v b="$(seconds "$HELD_DURATION")" \
    'BEGIN { printf "%d", r * (a + b) }')
  [ $# -gt 0 ] && out="$out cpu_us=$(us_per_req "$t0" "$t1" "$sent") store_cpu_us=$(us_per_req "$s0" "$s1" "$sent")"
  if [ -n "$perf_pid" ]; then
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
    out="$out $(awk -F, -v n="$sent" '
      $3 == "context-switches" { cs = $1 } $3 ~ /futex/ { fx = $1 }
      END { printf "switches_per_req=%.2f futex_per_req=%.2f", cs / n, fx / n }' "$WORK/wakeups-$label")"
  fi
  echo "$out" | tee -a "$WORK/held"
}

# Every held row tells the simulator to answer uncompressed (the gateway
# forwards the header). The gateway offers gzip, deflate and brotli
# upstream, and the simulator picks brotli; a provider compresses on its
# own machines, but the simulator does it on the cores the gateway, the
# store and the generator share. At 2,000 req/s that doubled the
# simulator's CPU, about 0.3 of a core, and the rows that made it compress
# queued behind it: the direct row runs alone, so it suffered less, and
# idempotent-proxy-server's requests never asked for compression. With
# every row uncompressed, "added" is the proxy's work.
UPSTREAM_PLAIN='X-Sim-Encoding: identity'

field() { # label key
  awk -v l="label=$1" -v k="$2" '$1 == l { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) print kv[2] } }' "$WORK/held"
}

part_held() {
  "$SIMBIN" --listen "127.0.0.1:$SIM" --latency-ms "$SLOW_MS" >"$WORK/sim.log" 2>&1 &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$SIM/" "$WORK/sim.log"
  local store=$STORE
  # A file of its own for the held-rate gateway (SQLite).
  case "$store" in sqlite:*) store="sqlite:$WORK/held.db" ;; esac
  start_gateway "http://127.0.0.1:$SIM" "$GW_SLOW" "$ADMIN_SLOW" "$store" "$WORK/gw-slow.log"
  if [ "$IPX_ON" = 1 ]; then
    start_ipx "http://127.0.0.1:$SIM/v1/chat/completions" "$IPX_SLOW" "$WORK/ipx-slow" "$(redis_base)/$IPX_REDIS_DB"
  fi
  echo "store: $STORE   held $HELD_RATE req/s for $HELD_DURATION (warm-up $HELD_WARMUP), upstream answers in ${SLOW_MS} ms"
  : >"$WORK/held"
  [ -z "${TRACE_DIR:-}" ] || mkdir -p "$TRACE_DIR"
  held direct "http://127.0.0.1:$SIM/v1/chat/completions" fresh "$UPSTREAM_PLAIN"
  held idemgate-fresh "http://127.0.0.1:$GW_SLOW/v1/chat/completions" fresh "$UPSTREAM_PLAIN" "$GW_PID"
  held idemgate-replay "http://127.0.0.1:$GW_SLOW/v1/chat/completions" replay "$UPSTREAM_PLAIN" "$GW_PID"
  if [ "$IPX_ON" = 1 ]; then
    held idempotent-proxy-fresh "http://127.0.0.1:$IPX_SLOW/URL_BENCH" fresh "$UPSTREAM_PLAIN" "$IPX_PID"
  fi
  echo
  echo "cpu us/req: CPU of the proxy process per request sent (warm-up included); store us/req:"
  echo "the store server's processes over the same time"
  printf '%-26s %10s %9s %9s %9s %9s %8s %10s %12s\n' "target" "achieved" "p50 ms" "p99 ms" \
    "p99.9 ms" "max ms" "errors" "cpu us/req" "store us/req"
  for l in $(awk '{ sub("label=", "", $1); print $1 }' "$WORK/held"); do
    awk -v l="label=$l" '$1 == l {
      for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      printf "%-26s %10s %9.2f %9.2f %9.2f %9.2f %8d %10s %12s\n", substr($1, 7), v["achieved"],
        v["p50_us"] / 1000, v["p99_us"] / 1000, v["p999_us"] / 1000, v["max_us"] / 1000,
        v["errors"] + v["non2xx"] + v["unsent"], v["cpu_us"] == "" ? "-" : v["cpu_us"],
        v["store_cpu_us"] == "" ? "-" : v["store_cpu_us"] }' "$WORK/held"
  done
  if [ "${WAKEUPS:-0}" = 1 ]; then
    echo
    echo "the proxy's context switches and futex calls per request sent (perf stat):"
    awk '$0 ~ /switches_per_req=/ {
      for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      printf "  %-24s switches %6s   futex %6s\n", substr($1, 7), v["switches_per_req"], v["futex_per_req"] }' "$WORK/held"
  fi
  echo
  echo "added latency over the direct path at $HELD_RATE req/s (target: p99 <= 1 ms):"
  for l in idemgate-fresh idemgate-replay idempotent-proxy-fresh; do
    [ -n "$(field "$l" p99_us)" ] || continue
    awk -v l="$l" -v a50="$(field "$l" p50_us)" -v d50="$(field direct p50_us)" \
      -v a99="$(field "$l" p99_us)" -v d99="$(field direct p99_us)" \
      -v a999="$(field "$l" p999_us)" -v d999="$(field direct p999_us)" \
      'BEGIN { printf "  %-24s p50 %+.2f ms   p99 %+.2f ms   p99.9 %+.2f ms\n", l,
        (a50 - d50) / 1000, (a99 - d99) / 1000, (a999 - d999) / 1000 }'
  done
  echo
}

# ---------------------------------------------------------------- part 3
part_stream() {
  local py=.venv/bin/python
  if ! "$py" -c 'import openai' 2>/dev/null; then
    echo "stream part skipped: no .venv with the openai client (run scripts/setup.sh)" >&2
    return 0
  fi
  "$SIMBIN" --listen "127.0.0.1:$SIM_STREAM" --first-token-ms 20 --token-interval-ms "$TOKEN_MS" \
    >"$WORK/sim-stream.log" 2>&1 &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$SIM_STREAM/" "$WORK/sim-stream.log"
  local store=$STORE
  case "$store" in sqlite:*) store="sqlite:$WORK/stream.db" ;; esac
  start_gateway "http://127.0.0.1:$SIM_STREAM" "$GW_STREAM" "$ADMIN_STREAM" "$store" "$WORK/gw-stream.log"
  echo "store: $STORE   $STREAMS streams one after the other on one kept-alive client, a token every ${TOKEN_MS} ms"
  local client
  for client in openai socket; do
    "$py" bench/stream_gaps.py direct "http://127.0.0.1:$SIM_STREAM" "$STREAMS" "$client"
    "$py" bench/stream_gaps.py idemgate "http://127.0.0.1:$GW_STREAM" "$STREAMS" "$client"
  done
  echo
}

for part in $PARTS; do
  case "$part" in
    wrk) part_wrk ;;
    held) part_held ;;
    stream) part_stream ;;
    *) echo "unknown part $part (use wrk, held, stream)" >&2; exit 2 ;;
  esac
done
[ "$IPX_ON" = 1 ] && ipx_cleanup
exit 0
