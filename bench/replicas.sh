#!/usr/bin/env bash
# The gateway load benchmark (bench/gateway.sh) on each store, one after the
# other in one run so the figures compare: SQLite (the embedded default),
# Redis (the shared server, a random key prefix) and PostgreSQL (the shared
# server, db `test`, a random schema). Each store's keys are removed after.
# Usage: bench/replicas.sh [sqlite] [redis] [postgres] [redis-inline]
#                          [postgres-inline] [postgres-async] [postgres-tls]
#                          [postgres-steady]
#   (default: the first three; `-inline` writes replay timeline entries on the
#   request path, as before the background writer, for comparison;
#   `postgres-async` commits claims with synchronous_commit = off;
#   PostgreSQL runs without TLS on loopback, as Redis does, and
#   `postgres-tls` with `sslmode=require`; `postgres-steady` first gives
#   the records table PG_SPACE_ROWS rows of freed space to reuse, as in a
#   store past its done TTL, see pg_reusable_space in bench/common.sh)
# Env: as bench/gateway.sh; REDIS_URL (redis://127.0.0.1:6379),
#      POSTGRES_URL (postgres://postgres@127.0.0.1:5432/test), PG_POOL (16),
#      PG_SPACE_ROWS (300000)
set -euo pipefail
cd "$(dirname "$0")/.."
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
POSTGRES_URL=${POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
PG_POOL=${PG_POOL:-16}
STORES=("$@"); [ ${#STORES[@]} -eq 0 ] && STORES=(sqlite redis postgres)

# One set of binaries for every run, copied out of the (possibly shared)
# target directory so a concurrent build cannot swap them mid-run.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# shellcheck source=bench/common.sh
. bench/common.sh
cargo build --release -q -p idemgate -p idemgate-loadgen -p idemgate-llm-sim
TARGET=${CARGO_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps \
  | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')}
for b in idemgate idemgate-loadgen idemgate-llm-sim; do cp "$TARGET/release/$b" "$WORK/$b"; done
export BENCH_BIN="$WORK/idemgate" BENCH_LOADGEN="$WORK/idemgate-loadgen" BENCH_SIM="$WORK/idemgate-llm-sim"
# The copy must be this tree's build (one that has the networked stores).
probe=$("$BENCH_BIN" serve --upstream http://127.0.0.1:1 --store redis://127.0.0.1:1 \
  --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 2>&1 || true)
if ! grep -q "cannot open the redis store" <<<"$probe"; then
  echo "the release binary lacks the networked stores (another tree's build?)" >&2
  exit 1
fi

tag="igbench$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
for store in "${STORES[@]}"; do
  timeline=background; claims=sync; sslmode=disable; space=0
  case "$store" in
    *-inline) timeline=inline; store=${store%-inline} ;;
    *-async) claims=async; store=${store%-async} ;;
    *-tls) sslmode=require; store=${store%-tls} ;;
    *-steady) space=1; store=${store%-steady} ;;
  esac
  case "$store" in
    sqlite) bash bench/gateway.sh ;;
    redis)
      bash bench/gateway.sh "$REDIS_URL/?prefix=$tag&timeline=$timeline"
      host=${REDIS_URL#redis://}; port=${host##*:}; host=${host%%:*}
      redis-cli -h "$host" -p "$port" --scan --pattern "$tag:*" \
        | xargs -r -n 500 redis-cli -h "$host" -p "$port" del >/dev/null ;;
    postgres)
      pg_warm_wal "$POSTGRES_URL"
      url="$POSTGRES_URL?schema=$tag&pool=$PG_POOL&timeline=$timeline&claim_commit=$claims&sslmode=$sslmode"
      [ "$space" = 0 ] || pg_reusable_space "$url" "${PG_SPACE_ROWS:-300000}"
      bash bench/gateway.sh "$url"
      for _ in 1 2 3; do
        psql "$POSTGRES_URL" -q -c "DROP SCHEMA IF EXISTS $tag CASCADE" 2>/dev/null && break
        sleep 1
      done ;;
    *) echo "unknown store $store" >&2; exit 2 ;;
  esac
  echo
done
