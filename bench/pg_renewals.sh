#!/usr/bin/env bash
# Lease renewals at scale on PostgreSQL: KEYS PENDING records in the
# store's own tables, then pgbench runs the store's renewal statement (as
# this build sends it: the idemgate-postgres example `pgbench_script …
# renewal N`) on random ones, each its own commit, once per client count.
# Prints renewals/s and the server's CPU per renewal, and what that makes
# in flight per server core at the default renewal period (10 s, a third
# of the 30 s pending TTL).
#
# Usage: bench/pg_renewals.sh [URL]   (default postgres://postgres@127.0.0.1/test)
# Env: KEYS (10000) CLIENTS ("4 16 32") DURATION (15, seconds)
#      PG_OS_USER (postgres: the server's processes, for its CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
URL=${1:-postgres://postgres@127.0.0.1/test}
KEYS=${KEYS:-10000}; CLIENTS=${CLIENTS:-4 16 32}; DURATION=${DURATION:-15}
SCHEMA=bench_renewals
# shellcheck source=bench/common.sh
. bench/common.sh
TARGET=$(bench_target)
cargo build --release -q -p idemgate-postgres --example pgbench_script
WORK=$(mktemp -d)
cleanup() {
  psql -q -X "$URL" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
printf '%-8s %12s %22s %24s\n' clients renewals/s "server us/renewal" "in-flight keys per core"
for c in $CLIENTS; do
  # Fresh records for every count, so no run inherits another's dead rows.
  psql -q -X "$URL" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1
  "$TARGET/release/examples/pgbench_script" "$URL" "$SCHEMA" renewal "$KEYS" \
    >"$WORK/renew.sql" 2>"$WORK/script.log" || { cat "$WORK/script.log" >&2; exit 1; }
  psql -q -X "$URL" -c "VACUUM ANALYZE $SCHEMA.records" >/dev/null
  # shellcheck disable=SC2046 # one word per pid
  s0=$(cpu_ticks $(pgrep -u "${PG_OS_USER:-postgres}"))
  out=$(pgbench -n -M prepared -c "$c" -j 2 -T "$DURATION" -D pending_ms=30000 \
    -f "$WORK/renew.sql" "$URL" 2>&1) || { echo "$out" >&2; exit 1; }
  # shellcheck disable=SC2046
  s1=$(cpu_ticks $(pgrep -u "${PG_OS_USER:-postgres}"))
  awk -v c="$c" -v a="$s0" -v b="$s1" -v hz="$(getconf CLK_TCK)" '
    /^tps/ { tps = $3 } /actually processed/ { n = $NF }
    END { us = (b - a) / hz * 1e6 / n
          printf "%-8s %12.0f %22.0f %24.0f\n", c, tps, us, 1e6 / us * 10 }' <<<"$out"
done
