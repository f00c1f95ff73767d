#!/usr/bin/env bash
# Where a fresh key's time and CPU go, on one store: one gateway in front
# of nginx `return 200` (the static upstream of bench/gateway.sh), wrk
# sending fresh keys in closed loop, then
#   - req/s, p50 and p99 as wrk saw them;
#   - the CPU per key of the gateway, of the store's server (PostgreSQL:
#     every process of its OS user; Redis: the server on the store's port)
#     and of the whole machine (every core, /proc/stat), and how busy the
#     machine was: a closed loop on a busy machine is bound by CPU, on an
#     idle one by waiting;
#   - each store operation's count and mean time, and its p50/p90/p99/p99.9
#     as bucket bounds, from the gateway's own histogram
#     (`idemgate_store_operation_seconds`);
#   - on PostgreSQL with pg_stat_statements loaded, every statement run
#     more than 100 times: calls, mean execution time and WAL per call;
#   - on Redis, the server's time per call of each command
#     (`INFO commandstats`; its counters are reset first).
#
# Usage: bench/store_ops.sh STORE_URL
#   The keys under the URL's `prefix` (Redis) or its `schema` (PostgreSQL)
#   are removed at the end: give the run a prefix or schema of its own.
#   e.g. with a PostgreSQL of its own that loads pg_stat_statements:
#   bash bench/private_postgres.sh shared_preload_libraries=pg_stat_statements \
#     -- bash bench/store_ops.sh '@PG@?schema=bench_ops'
# Env: DURATION (8s) CONNS (16) PORT_BASE (18501), GATEWAY_WORKERS,
#      BENCH_BIN, BENCH_LOADGEN, BENCH_SIM (prebuilt binaries)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: bench/store_ops.sh STORE_URL" >&2; exit 2; }
STORE=$1
DURATION=${DURATION:-8s}; CONNS=${CONNS:-16}; PORT_BASE=${PORT_BASE:-18501}
UP=$PORT_BASE; GW=$((PORT_BASE + 1)); ADMIN=$((PORT_BASE + 2))
# shellcheck source=bench/common.sh
. bench/common.sh
bench_binaries
PIDS=(); GW_PID=
WORK=$(mktemp -d)
pg_url() { echo "${STORE%%\?*}"; }
REDIS_HP=${STORE#redis://}; REDIS_HP=${REDIS_HP%%/*}; REDIS_HP=${REDIS_HP%%\?*}
redis_cli() { redis-cli -h "${REDIS_HP%%:*}" -p "${REDIS_HP##*:}" "$@"; }
param() { # the value of query parameter $1 of the store URL
  local q=${STORE#*\?}
  [ "$q" != "$STORE" ] || return 0
  tr '&' '\n' <<<"$q" | sed -n "s/^$1=//p" | head -1
}
cleanup() {
  stop_started
  # What the run wrote: its key prefix on Redis, its schema on PostgreSQL.
  local prefix schema
  case "$STORE" in
    redis://*)
      prefix=$(param prefix)
      [ -z "$prefix" ] || redis_cli --scan --pattern "$prefix:*" \
        | xargs -r -n 500 redis-cli -h "${REDIS_HP%%:*}" -p "${REDIS_HP##*:}" DEL >/dev/null || true ;;
    postgres://*|postgresql://*)
      schema=$(param schema)
      [ -z "$schema" ] || psql -X -q "$(pg_url)" -c "DROP SCHEMA IF EXISTS $schema CASCADE" 2>/dev/null || true ;;
  esac
}
trap cleanup EXIT

store_pids() {
  case "$STORE" in
    postgres://*|postgresql://*) pgrep -u "${PG_OS_USER:-postgres}" | tr '\n' ' ' ;;
    redis://*) pgrep -f "redis-server .*:${REDIS_HP##*:}( |$)" | tr '\n' ' ' ;;
  esac
}
machine() { # busy and total clock ticks of every core
  awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat
}

start_static_upstream "$UP"
start_gateway "http://127.0.0.1:$UP" "$GW" "$ADMIN" "$STORE" "$WORK/gw.log"

case "$STORE" in
  postgres://*|postgresql://*)
    PGSS=$(psql -X -At "$(pg_url)" -c "SELECT count(*) FROM pg_settings WHERE name = 'shared_preload_libraries' AND setting LIKE '%pg_stat_statements%'")
    if [ "$PGSS" = 1 ]; then
      psql -X -q "$(pg_url)" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
        -c "SELECT pg_stat_statements_reset()" >/dev/null
    fi ;;
  redis://*) redis_cli CONFIG RESETSTAT >/dev/null ;;
esac

curl -s "http://127.0.0.1:$ADMIN/metrics" >"$WORK/before"
read -r busy0 total0 < <(machine)
# shellcheck disable=SC2046 # one word per pid
g0=$(cpu_ticks "$GW_PID"); s0=$(cpu_ticks $(store_pids))
wrk -t1 -c"$CONNS" -d"$DURATION" --latency -s bench/fresh.lua "http://127.0.0.1:$GW" >"$WORK/wrk" 2>&1
# shellcheck disable=SC2046
g1=$(cpu_ticks "$GW_PID"); s1=$(cpu_ticks $(store_pids))
read -r busy1 total1 < <(machine)
curl -s "http://127.0.0.1:$ADMIN/metrics" >"$WORK/after"

n=$(awk '/requests in/ {print $1}' "$WORK/wrk")
hz=$(getconf CLK_TCK); cores=$(nproc)
echo "store: $STORE   wrk -t1 -c$CONNS -d$DURATION, fresh keys, static upstream"
awk '/Requests\/sec/ {rps = $2} / 50%/ {p50 = $2} / 99%/ {p99 = $2}
  END {printf "fresh keys/s: %s   p50 %s   p99 %s\n", rps, p50, p99}' "$WORK/wrk"
awk -v g0="$g0" -v g1="$g1" -v s0="$s0" -v s1="$s1" -v b0="$busy0" -v b1="$busy1" \
  -v t0="$total0" -v t1="$total1" -v n="$n" -v hz="$hz" -v cores="$cores" \
  -v embedded="$([ -n "$(store_pids)" ] || echo 1)" 'BEGIN {
  if (n <= 0) { print "no request answered"; exit 1 }
  server = embedded ? "none (in the gateway)" : sprintf("%.0f us", (s1 - s0) / hz * 1e6 / n)
  printf "CPU per key: gateway %.0f us, store server %s, whole machine %.0f us (%d cores %.0f%% busy)\n",
    (g1 - g0) / hz * 1e6 / n, server,
    (b1 - b0) / hz * 1e6 / n, cores, 100 * (b1 - b0) / (t1 - t0)
}'
echo "store operations (the gateway's histogram; quantiles are bucket bounds):"
python3 - "$WORK/before" "$WORK/after" <<'PY'
import re
import sys

def read(path):
    values = {}
    for line in open(path):
        if line.startswith("idemgate_store_operation_seconds_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values

before, after = read(sys.argv[1]), read(sys.argv[2])
ops = {}
for name, value in after.items():
    m = re.match(r"idemgate_store_operation_seconds_(sum|count|bucket)\{(.*)\}", name)
    if not m:
        continue
    op = re.search(r'op="([^"]+)"', m.group(2)).group(1)
    delta = value - before.get(name, 0.0)
    entry = ops.setdefault(op, {"buckets": []})
    if m.group(1) == "bucket":
        le = re.search(r'le="([^"]+)"', m.group(2)).group(1)
        entry["buckets"].append((float("inf") if le == "+Inf" else float(le), delta))
    else:
        entry[m.group(1)] = delta
for op, e in sorted(ops.items(), key=lambda kv: -kv[1].get("count", 0)):
    count = e.get("count", 0)
    if count < 1:
        continue
    line = f"  {op:<14} {count:>8.0f} calls   mean {e['sum'] / count * 1e3:7.3f} ms"
    buckets = sorted(e["buckets"])
    if count >= 100 and buckets:
        for q in (0.5, 0.9, 0.99, 0.999):
            bound = next(le for le, c in buckets if c >= q * count)
            line += f"   p{q * 100:g} <= {bound * 1e3:g} ms"
    print(line)
PY
case "$STORE" in
  postgres://*|postgresql://*)
    if [ "$PGSS" = 1 ]; then
      echo "statements (pg_stat_statements, more than 100 calls):"
      psql -X "$(pg_url)" -c "SELECT calls, round((total_exec_time / calls * 1000)::numeric, 1) AS exec_us_per_call, round(wal_records::numeric / calls, 2) AS wal_records_per_call, round(wal_bytes / calls) AS wal_bytes_per_call, left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS statement FROM pg_stat_statements WHERE calls > 100 ORDER BY calls DESC"
    else
      echo "(pg_stat_statements is not loaded: no per-statement figures)"
    fi ;;
  redis://*)
    echo "Redis server time per call (INFO commandstats):"
    redis_cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' '/^cmdstat_/ && $3 > 100 {
      sub("cmdstat_", "", $1); printf "  %-10s %9d calls   %6.2f us per call\n", $1, $3, $7 }' ;;
esac
