#!/usr/bin/env bash
# A long held rate, minute by minute: one gateway in front of the
# simulator (SLOW_MS, 20 ms, uncompressed answers), and one
# `idemgate-loadgen` run of fresh keys per minute, so each minute has its
# own percentiles (flat latency shows as flat rows). On a PostgreSQL store
# the store's tables' live and dead rows and sizes are printed at the
# start and after every minute (its tables' and indexes' sizes apart).
# bench/private_postgres.sh runs it against a server of its own:
#   bash bench/private_postgres.sh -- bash bench/held_minutes.sh '@PG@?schema=bench_minutes'
#
# Usage: bench/held_minutes.sh STORE_URL   (e.g. postgres://postgres@127.0.0.1/test?schema=bench_minutes)
# Env: MINUTES (10) RATE (1000) SLOW_MS (20) PORT_BASE (18700)
#      BENCH_BIN, BENCH_LOADGEN, BENCH_SIM (prebuilt binaries; default:
#        build the release binaries of this tree)
set -euo pipefail
cd "$(dirname "$0")/.."
STORE=${1:?usage: bench/held_minutes.sh STORE_URL}
MINUTES=${MINUTES:-10}; RATE=${RATE:-1000}; SLOW_MS=${SLOW_MS:-20}
PORT_BASE=${PORT_BASE:-18700}
SIM=$PORT_BASE; GW=$((PORT_BASE + 1)); ADMIN=$((PORT_BASE + 2))
# shellcheck source=bench/common.sh
. bench/common.sh
bench_binaries
WORK=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

SCHEMA=
case "$STORE" in
  postgres://*|postgresql://*)
    SCHEMA=$(sed -n 's/.*[?&]schema=\([a-z0-9_]*\).*/\1/p' <<<"$STORE"); SCHEMA=${SCHEMA:-idemgate} ;;
esac
sizes() {
  [ -n "$SCHEMA" ] || return 0
  psql -X -At "${STORE%%\?*}" -c "SELECT string_agg(relname || ' live=' || n_live_tup || \
    ' dead=' || n_dead_tup || ' table=' || pg_size_pretty(pg_table_size(relid)) || \
    ' indexes=' || pg_size_pretty(pg_indexes_size(relid)) || \
    ' autovacuums=' || autovacuum_count, '; ' ORDER BY relname) FROM pg_stat_user_tables \
    WHERE schemaname = '$SCHEMA' AND relname <> 'idemgate_schema_version'"
}

"$SIMBIN" --listen "127.0.0.1:$SIM" --latency-ms "$SLOW_MS" >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$SIM/" "$WORK/sim.log"
start_gateway "http://127.0.0.1:$SIM" "$GW" "$ADMIN" "$STORE" "$WORK/gw.log"
echo "store: $STORE   $RATE fresh keys/s for $MINUTES minutes, upstream answers in ${SLOW_MS} ms"
[ -z "$SCHEMA" ] || echo "start: $(sizes)"
for m in $(seq 1 "$MINUTES"); do
  out=$("$LOADGEN" --url "http://127.0.0.1:$GW/v1/chat/completions" --rate "$RATE" \
    --duration 60s --warmup "$([ "$m" = 1 ] && echo 5s || echo 1s)" --connections 512 \
    --mode fresh --label "minute$m" --header 'Authorization: Bearer bench-tenant' \
    --header 'X-Sim-Encoding: identity' --format kv)
  awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
         printf "%-9s achieved=%s p50=%.2fms p99=%.2fms p99.9=%.2fms errors=%d\n", v["label"],
           v["achieved"], v["p50_us"] / 1000, v["p99_us"] / 1000, v["p999_us"] / 1000,
           v["errors"] + v["non2xx"] }' <<<"$out"
  [ -z "$SCHEMA" ] || echo "  $(sizes)"
done
