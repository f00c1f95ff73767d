# Helpers the bench scripts share (sourced, not run). The caller sets
# `WORK` (a temporary directory) and `PIDS=()` (every process started here
# is added, for `stop_started`), and `BIN` (the idemgate binary) before
# `start_gateway`, and `IPX_BIN` before `start_ipx`.

# The answer of the static upstream (nginx `return 200`): a chat completion.
# shellcheck disable=SC2034 # used by the scripts that source this file
STATIC_ANSWER='{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'

bench_target() { # the cargo target directory
  echo "${CARGO_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps \
    | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')}"
}

# The release binaries the load scripts run: BENCH_BIN, BENCH_LOADGEN and
# BENCH_SIM when all three are set (prebuilt), else this tree's, built
# first. Sets TARGET, BIN, LOADGEN and SIMBIN.
bench_binaries() {
  TARGET=$(bench_target)
  if [ -z "${BENCH_BIN:-}" ] || [ -z "${BENCH_LOADGEN:-}" ] || [ -z "${BENCH_SIM:-}" ]; then
    cargo build --release -q -p idemgate -p idemgate-loadgen -p idemgate-llm-sim
  fi
  BIN=${BENCH_BIN:-$TARGET/release/idemgate}
  LOADGEN=${BENCH_LOADGEN:-$TARGET/release/idemgate-loadgen}
  SIMBIN=${BENCH_SIM:-$TARGET/release/idemgate-llm-sim}
}

# Stops every process in PIDS and the nginx started in WORK, then removes
# WORK: the scripts' cleanup at exit.
stop_started() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}

# port [proxy-port]: nginx `return 200` with STATIC_ANSWER on port, and
# with a proxy port, nginx `proxy_pass` to it there (the plain-proxy
# floor); its files in WORK.
start_static_upstream() {
  local proxy=""
  if [ -n "${2:-}" ]; then
    proxy="upstream backend { server 127.0.0.1:$1; keepalive 64; }
  server {
    listen 127.0.0.1:$2;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
    }
  }"
  fi
  cat >"$WORK/nginx.conf" <<NGX
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  server {
    listen 127.0.0.1:$1;
    location / {
      default_type application/json;
      return 200 '$STATIC_ANSWER';
    }
  }
  $proxy
}
NGX
  nginx -c "$WORK/nginx.conf" -p "$WORK"
}

wait_http() { # url log
  for _ in $(seq 1 100); do curl -s -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "$1 did not come up:" >&2; cat "$2" >&2; exit 1
}

start_gateway() { # upstream listen-port admin-port store log; sets GW_PID
  "$BIN" serve --upstream "$1" --listen "127.0.0.1:$2" --admin-listen "127.0.0.1:$3" \
    --store "$4" ${GATEWAY_WORKERS:+--workers "$GATEWAY_WORKERS"} >"$5" 2>&1 &
  GW_PID=$!
  PIDS+=($!)
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$3/healthz" >/dev/null && return 0; sleep 0.1; done
  echo "the gateway did not start:" >&2; cat "$5" >&2; exit 1
}

start_ipx() { # upstream-url listen-port dir redis-url; sets IPX_PID
  mkdir -p "$3"
  # It reads a .env file from its working directory (and refuses to start
  # without one); REQUEST_TIMEOUT is also how long it keeps a response.
  # LOG_LEVEL is its default, info, unless IPX_LOG_LEVEL says otherwise: at
  # info it writes one JSON line per request, as idemgate does at its
  # default level, so both proxies pay for their request logs.
  cat >"$3/.env" <<ENV
SERVER_ADDR=127.0.0.1:$2
REDIS_URL=$4
REQUEST_TIMEOUT=600000
URL_BENCH=$1
LOG_LEVEL=${IPX_LOG_LEVEL:-info}
ENV
  (cd "$3" && exec env ${IPX_WORKERS:+TOKIO_WORKER_THREADS="$IPX_WORKERS"} "$IPX_BIN") >"$3/log" 2>&1 &
  IPX_PID=$!
  PIDS+=($!)
  wait_http "http://127.0.0.1:$2/" "$3/log"
}

# pid... : user + system clock ticks of those processes and of their
# children that have ended (a PostgreSQL backend that comes and goes
# within a run, as pgbench's do, is counted through the postmaster)
cpu_ticks() {
  local t=0 pid
  for pid in "$@"; do
    t=$((t + $(awk '{print $14 + $15 + $16 + $17}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  echo "$t"
}

# url: readies a PostgreSQL server's WAL for a measurement. A server with
# few old WAL segments (a new cluster, or one idle since its last
# checkpoints) has none to recycle: the backend whose commit fills a
# segment creates the next one and writes its 16 MB of zeros itself, inside
# that commit. At 2,000 fresh keys/s on a new private server that stalled
# every request in flight for about 50 ms every 4.7 s (three episodes of
# ~100 slow requests in a 15 s held row), a cost a server under steady load
# does not pay: it renames old segments instead. Two checkpoints after
# ~300 MB of WAL leave about 20 segments to recycle (8 s here).
pg_warm_wal() {
  local i
  for i in 1 2; do
    psql -X -q "$1" -c "CREATE TABLE idemgate_warm_wal_$i AS SELECT g, repeat('x', 100) AS pad FROM generate_series(1, 2000000) g" \
      -c "DROP TABLE idemgate_warm_wal_$i" -c "CHECKPOINT"
  done
  echo "PostgreSQL WAL segments ready to use: $(psql -X -At "$1" -c "SELECT count(*) FROM pg_ls_waldir()")"
}

# url-with-schema rows: gives a store's records table free space to reuse,
# as a table has once its first records expired and the purge and vacuum
# freed their space (the steady state of a store running longer than its
# done TTL). The store's schema is made by the store itself (`idemgate keys
# show` connects, which migrates), then ROWS rows the size of the store's
# (a 450-byte payload and a timeline entry) are written, deleted and
# vacuumed, the file kept at its size (`vacuum_truncate = off`).
#
# Why: a table that grows extends its file a page at a time, and
# PostgreSQL 15 writes each new page as zeros through the page cache. At
# 2,000 fresh keys/s that is about 3 MB/s of dirty pages that nothing
# flushes until the kernel's 30 s expiry writes them back at once (80–90
# MB), and the WAL fsyncs of every commit wait behind it: a 270 ms stall of
# hundreds of requests in a 40 s held row. A table that reuses freed space
# has no such pages.
pg_reusable_space() {
  local url=$1 rows=$2 base schema
  base=${url%%\?*}
  schema=$(sed -n 's/.*[?&]schema=\([^&]*\).*/\1/p' <<<"$url")
  "${BIN:-$BENCH_BIN}" keys show --store "$url" idemgate-bench-schema >/dev/null 2>&1 || true
  psql -X -q "$base" -v ON_ERROR_STOP=1 \
    -c "ALTER TABLE $schema.records SET (vacuum_truncate = off)" \
    -c "INSERT INTO $schema.records (id, tenant, namespace, client_key, fingerprint, state,
                                     token, fence, expires_at, payload, entry)
        SELECT 'space:' || md5(g::text) || md5((g + 1)::text), 'anonymous', '/', md5(g::text),
               decode(md5(g::text) || md5((g + 2)::text), 'hex'), 'D', decode(md5(g::text), 'hex'),
               g, now(), decode(repeat('ab', 450), 'hex'),
               jsonb_build_object('at_ms', g, 'replica', md5(g::text), 'outcome', 'executed',
                                  'status', 200, 'trace_id', md5((g + 3)::text))
        FROM generate_series(1, $rows) g" \
    -c "DELETE FROM $schema.records" -c "VACUUM $schema.records" -c "VACUUM $schema.records" \
    -c "CHECKPOINT"
  echo "PostgreSQL records table with space to reuse: $(psql -X -At "$base" \
    -c "SELECT pg_size_pretty(pg_relation_size('$schema.records')) || ' heap, ' || pg_size_pretty(pg_indexes_size('$schema.records')) || ' indexes'")"
}
