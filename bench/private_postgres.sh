#!/usr/bin/env bash
# Runs a bench command against a PostgreSQL server of its own: initdb in a
# temporary directory on this machine's disk (fsync on, as in production),
# the server started with PostgreSQL's defaults plus the settings given,
# stopped and removed when the command ends. A server shared with other
# work may be configured for that work (this machine's runs with
# `autovacuum = off`); this one is configured for the measurement, and its
# settings are printed with the results.
#
# Usage: bench/private_postgres.sh [name=value ...] -- COMMAND [ARG ...]
#   In COMMAND's arguments, @PG@ stands for the server's URL
#   (postgres://postgres@127.0.0.1:PORT/postgres).
# Example (ten minutes held, with autovacuum on):
#   bash bench/private_postgres.sh -- bash bench/held_minutes.sh '@PG@?schema=bench_minutes'
# Env: PG_PORT (18790), WARM_WAL (1: write WAL and checkpoint before the
#      command, so the server recycles WAL segments as one that has run for
#      a while does, see pg_warm_wal in bench/common.sh; 0: start from a
#      new cluster's empty pg_wal)
set -euo pipefail
cd "$(dirname "$0")/.."
PG_PORT=${PG_PORT:-18790}; WARM_WAL=${WARM_WAL:-1}
SETTINGS=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do SETTINGS+=(-c "$1"); shift; done
[ "${1:-}" = -- ] || { echo "usage: bench/private_postgres.sh [name=value ...] -- COMMAND [ARG ...]" >&2; exit 2; }
shift
[ $# -gt 0 ] || { echo "no command given" >&2; exit 2; }

PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
DIR=$(mktemp -d /var/tmp/idemgate-bench-pg.XXXXXX)
[ "$(id -u)" != 0 ] || chown postgres:postgres "$DIR"
cleanup() {
  as_postgres "$PGBIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
as_postgres "$PGBIN/initdb" -D "$DIR/data" -A trust -U postgres >/dev/null
as_postgres "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w \
  -o "-p $PG_PORT -k $DIR -c listen_addresses=127.0.0.1 -c log_checkpoints=on -c log_autovacuum_min_duration=0 ${SETTINGS[*]}" \
  start >/dev/null
URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
echo "private PostgreSQL at $URL: $(psql -X -At "$URL" -c "SELECT string_agg(name || '=' || current_setting(name), ' ' ORDER BY name) FROM pg_settings WHERE name IN ('autovacuum', 'shared_buffers', 'max_wal_size', 'checkpoint_timeout', 'wal_compression', 'synchronous_commit', 'fsync', 'ssl')")"

# shellcheck source=bench/common.sh
. bench/common.sh
[ "$WARM_WAL" != 1 ] || pg_warm_wal "$URL"

ARGS=()
for a in "$@"; do ARGS+=("${a//@PG@/$URL}"); done
status=0
"${ARGS[@]}" || status=$?
echo "server log: checkpoints and autovacuums"
grep -E "checkpoint complete|automatic vacuum of table" "$DIR/log" \
  | sed -E 's/^([0-9-]+ [0-9:.]+) [A-Z]+ \[[0-9]+\] LOG: +/\1 /' | cut -c1-240 || true
exit "$status"
