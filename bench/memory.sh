#!/usr/bin/env bash
# Memory (RSS) of the idemgate gateway, four cases, each on a fresh gateway
# (SQLite store unless said otherwise):
#   1. idle after start-up
#   2. STREAMS concurrent live SSE streams (slow simulator streams), RSS while
#      all are open (every client has its first event) and after they end
#   3. KEYS stored keys (fresh-key requests at KEY_RATE req/s via
#      idemgate-loadgen), RSS + SQLite file size; again with --store memory:
#   4. a SOAK-second replay load: REPLAY_KEYS keys stored, then replays at
#      REPLAY_RATE req/s, RSS sampled every SAMPLE_EVERY s; first/last/max,
#      slope (KiB/min) and a flat/not-flat verdict
# RSS figures are VmRSS / VmHWM (and RssAnon) from /proc/PID/status.
#
# Usage: bench/memory.sh            (full size, ~15 min)
#        STREAMS=50 KEYS=2000 SOAK=20 bench/memory.sh   (small)
# Env (defaults): STREAMS (1000) STREAM_TOKENS (30) TOKEN_MS (1000)
#   FIRST_MS (2000) RAMP (200 streams opened per s)
#   KEYS (100000) KEY_RATE (1000) SOAK (600) REPLAY_KEYS (1000)
#   REPLAY_RATE (2000) SAMPLE_EVERY (10) SETTLE (5 s before "after" samples)
#   FLAT_KIB_PER_MIN (32: |slope| of the second half of the soak at most
#   this is "flat") CASES ("idle streams keys keys-memory soak")
#   BIN_DIR (the release binaries of this tree, built when unset)
#   PORT_BASE (28100) OUT_DIR (a new temporary directory, kept)
# Nothing here is named IDEMGATE_* (the gateway reads those as config).
set -euo pipefail

STREAMS=${STREAMS:-1000}; STREAM_TOKENS=${STREAM_TOKENS:-30}; TOKEN_MS=${TOKEN_MS:-1000}
FIRST_MS=${FIRST_MS:-2000}; RAMP=${RAMP:-200}
KEYS=${KEYS:-100000}; KEY_RATE=${KEY_RATE:-1000}
SOAK=${SOAK:-600}; REPLAY_KEYS=${REPLAY_KEYS:-1000}; REPLAY_RATE=${REPLAY_RATE:-2000}
SAMPLE_EVERY=${SAMPLE_EVERY:-10}; SETTLE=${SETTLE:-5}; FLAT_KIB_PER_MIN=${FLAT_KIB_PER_MIN:-32}
CASES=${CASES:-idle streams keys keys-memory soak}
if [ -z "${BIN_DIR:-}" ]; then
  cd "$(dirname "$0")/.."
  cargo build --release -q -p idemgate -p idemgate-loadgen -p idemgate-llm-sim
  BIN_DIR=${CARGO_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps \
    | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')}/release
fi
PORT_BASE=${PORT_BASE:-28100}
OUT_DIR=${OUT_DIR:-$(mktemp -d -t idemgate-memory.XXXXXX)}
GW_BIN=$BIN_DIR/idemgate; SIM_BIN=$BIN_DIR/idemgate-llm-sim; LG_BIN=$BIN_DIR/idemgate-loadgen
SIM_PORT=$PORT_BASE; GW_PORT=$((PORT_BASE + 1)); ADMIN_PORT=$((PORT_BASE + 2))
URL=http://127.0.0.1:$GW_PORT/v1/chat/completions
AUTH='Authorization: Bearer bench-tenant'

mkdir -p "$OUT_DIR"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ "$(ulimit -n)" -ge $((STREAMS * 2 + 200)) ] || {
  echo "ulimit -n $(ulimit -n) is too low for STREAMS=$STREAMS" >&2; exit 1; }

PIDS=()
GW_PID=; SIM_PID=
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
forget_pid() { local p=$1 i; for i in "${!PIDS[@]}"; do [ "${PIDS[$i]}" = "$p" ] && unset 'PIDS[i]'; done; PIDS=("${PIDS[@]}"); }
stop() { # pid
  [ -n "$1" ] || return 0
  kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; forget_pid "$1"
}

# ---------------------------------------------------------------- helpers
kib() { awk -v f="$2" '$1 == f":" {print $2}' "/proc/$1/status"; } # pid field -> kB
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
rss_line() { # pid -> "rss hwm anon" in KiB
  echo "$(kib "$1" VmRSS) $(kib "$1" VmHWM) $(kib "$1" RssAnon)"
}

start_sim() { # latency-ms
  "$SIM_BIN" --listen "127.0.0.1:$SIM_PORT" --latency-ms "$1" >"$OUT_DIR/sim-$CASE.log" 2>&1 &
  SIM_PID=$!; PIDS+=("$SIM_PID")
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$SIM_PORT/" && return 0; sleep 0.1
  done
  echo "the simulator did not start" >&2; cat "$OUT_DIR/sim-$CASE.log" >&2; exit 1
}

start_gw() { # store
  "$GW_BIN" serve --upstream "http://127.0.0.1:$SIM_PORT" --listen "127.0.0.1:$GW_PORT" \
    --admin-listen "127.0.0.1:$ADMIN_PORT" --store "$1" >"$OUT_DIR/gw-$CASE.log" 2>&1 &
  GW_PID=$!; PIDS+=("$GW_PID")
  for _ in $(seq 1 100); do
    curl -sf -o /dev/null "http://127.0.0.1:$ADMIN_PORT/healthz" && return 0; sleep 0.1
  done
  echo "the gateway did not start" >&2; cat "$OUT_DIR/gw-$CASE.log" >&2; exit 1
}

stop_all() {
  stop "$GW_PID"; GW_PID=
  stop "$SIM_PID"; SIM_PID=
}

gw_log_problems() { # -> "N non-INFO lines" and keeps them in a file; gzips big logs
  local f=$OUT_DIR/gw-$CASE.log n
  grep -v '"level":"INFO"' "$f" >"$OUT_DIR/gw-$CASE.problems" || true
  n=$(grep -c . "$OUT_DIR/gw-$CASE.problems" || true)
  if [ "$n" -gt 0 ]; then
    echo "  gateway log: $n non-INFO lines (first 5, by message):"
    sed -E 's/.*"level":"([A-Z]+)".*"message":"([^"]{0,160}).*/    \1 \2/' \
      "$OUT_DIR/gw-$CASE.problems" | sort | uniq -c | sort -rn | head -5
  else
    echo "  gateway log: $(wc -l <"$f") lines, no WARN/ERROR"
  fi
  [ "$(stat -c %s "$f")" -gt 20000000 ] && gzip -f "$f"
  LOG_PROBLEMS=$n
}

records() { # sqlite file -> rows in records (read-only)
  python3 - "$1" <<'PY'
import sqlite3, sys
c = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, timeout=30)
print(c.execute("select count(*) from records").fetchone()[0])
PY
}

metric() { # name -> value from the admin /metrics (empty when absent)
  curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v n="$1" '$1 == n {v = $2} END {print v}'
}

kv() { # "k=v k=v ..." key -> v
  tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k {print $2}'
}

ROWS=()
row() { ROWS+=("| $1 | $2 | $3 | $4 | $5 |"); } # case rss hwm anon notes (MiB)
row_kib() { # case "rss hwm anon" notes
  local a; read -r -a a <<<"$2"
  row "$1" "$(mib "${a[0]}")" "$(mib "${a[1]}")" "$(mib "${a[2]}")" "$3"
}
TIMES=()
timed() { # name: records the wall time of a case
  TIMES+=("| $1 | $(( $(date +%s) - CASE_T0 )) s |")
}

# -------------------------------------------------- the SSE stream client
cat >"$OUT_DIR/streams.py" <<'PY'
"""Holds N concurrent SSE streams through the gateway (asyncio raw sockets,
chunked decoding), opened at RAMP per second; samples the gateway's RSS
while they are live. Prints one JSON object."""
import asyncio, json, os, sys, time

host, port, n, ramp, gw_pid, first_ms, tok_ms, tokens = sys.argv[1:9]
port, n, ramp, gw_pid = int(port), int(n), float(ramp), int(gw_pid)
BODY = b'{"model":"m","messages":[{"role":"user","content":"hello"}],"stream":true}'
STREAM_S = (int(first_ms) + int(tok_ms) * int(tokens)) / 1000
TIMEOUT = 3 * STREAM_S + 60
RUN = os.urandom(4).hex()

first = 0          # clients that received their first data event
live = 0           # clients past their first event whose stream has not ended
ended = 0          # clients whose stream is over (cleanly or not)
ok = 0             # clean ends ([DONE] seen)
failed = 0
errors = {}
durations = []

def status():
    out = {}
    with open(f"/proc/{gw_pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "Threads"):
                out[k] = int(v.split()[0])
    return out

def err(kind):
    errors[kind] = errors.get(kind, 0) + 1

async def one(i):
    global first, ended, ok, failed, live
    t0 = time.monotonic()
    got_first = done = False
    w = None
    try:
        r, w = await asyncio.open_connection(host, port, limit=1 << 20)
        w.write(
            b"POST /v1/chat/completions HTTP/1.1\r\n"
            + f"Host: {host}:{port}\r\n".encode()
            + b"Authorization: Bearer bench-tenant\r\nContent-Type: application/json\r\n"
            + f"Idempotency-Key: stream-{RUN}-{i}\r\n".encode()
            + f"x-sim-first-token-ms: {first_ms}\r\nx-sim-token-interval-ms: {tok_ms}\r\n".encode()
            + f"x-sim-tokens: {tokens}\r\nContent-Length: {len(BODY)}\r\n".encode()
            + b"Connection: close\r\n\r\n" + BODY)
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0].decode()
        if " 200 " not in status_line + " ":
            err("status " + status_line[9:12]); failed += 1; return
        chunked = b"transfer-encoding: chunked" in head.lower()
        buf = b""
        while True:
            if chunked:
                size = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    break
                data = await r.readexactly(size + 2)
                buf += data[:-2]
            else:
                data = await r.read(65536)
                if not data:
                    break
                buf += data
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if b"data:" in ev:
                    if not got_first:
                        got_first = True; first += 1; live += 1
                    if b"data: [DONE]" in ev:
                        done = True
        if done:
            ok += 1; durations.append(time.monotonic() - t0)
        else:
            err("ended without [DONE]"); failed += 1
    except asyncio.CancelledError:
        err("timeout"); failed += 1
        raise
    except Exception as e:  # noqa: BLE001 - counted and reported
        err(type(e).__name__); failed += 1
    finally:
        ended += 1
        if got_first:
            live -= 1
        if w is not None:
            w.close()

async def main():
    t_start = time.monotonic()
    tasks = []
    samples = []
    res = {"n": n, "stream_s": STREAM_S}

    async def opener():
        for i in range(n):
            due = t_start + i / ramp
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(asyncio.wait_for(one(i), TIMEOUT)))

    op = asyncio.create_task(opener())
    all_open = None
    max_live = 0
    plateau_max = None
    while True:
        await asyncio.sleep(0.5)
        st = status()
        t = round(time.monotonic() - t_start, 1)
        samples.append((t, first, ended, live, st["VmRSS"], st["VmHWM"]))
        if live > max_live:
            max_live = live
        if all_open is None and live == n:
            all_open = {"t": t, **st}
            plateau_max = dict(st)
        elif all_open is not None and live == n:
            if st["VmRSS"] > plateau_max["VmRSS"]:
                plateau_max = {"t": t, **st}
        if op.done() and ended == n:
            break
        if time.monotonic() - t_start > TIMEOUT + n / ramp + 30:
            break
    await asyncio.gather(*tasks, return_exceptions=True)
    res.update(first_events=first, clean_ends=ok, failed=failed, errors=errors,
               max_live=max_live, all_open=all_open, plateau_max=plateau_max,
               wall_s=round(time.monotonic() - t_start, 1),
               stream_s_min=round(min(durations), 1) if durations else None,
               stream_s_max=round(max(durations), 1) if durations else None,
               peak=max(samples, key=lambda s: s[4]) if samples else None)
    with open(sys.argv[9], "w") as f:
        for s in samples:
            f.write(" ".join(map(str, s)) + "\n")
    print(json.dumps(res))

asyncio.run(main())
PY

jq_get() { # json key(.path) -> value
  python3 -c 'import json,sys
v=json.loads(sys.argv[1])
for k in sys.argv[2].split("."):
    v = v.get(k) if isinstance(v, dict) else None
print("" if v is None else v)' "$1" "$2"
}

# ------------------------------------------------------------------ cases
case_idle() {
  start_sim 5
  start_gw "sqlite:$OUT_DIR/idle.db"
  sleep "$SETTLE"
  local s; s=$(rss_line "$GW_PID")
  log "idle: VmRSS/VmHWM/RssAnon KiB = $s"
  row_kib "1. idle after start-up (SQLite)" "$s" "${SETTLE} s after /healthz answered"
  stop_all
  gw_log_problems
}

case_streams() {
  start_sim 5
  start_gw "sqlite:$OUT_DIR/streams.db"
  local before; before=$(rss_line "$GW_PID")
  log "streams: $STREAMS clients at $RAMP/s, each stream ${FIRST_MS} ms + $STREAM_TOKENS x ${TOKEN_MS} ms"
  local res
  res=$(python3 "$OUT_DIR/streams.py" 127.0.0.1 "$GW_PORT" "$STREAMS" "$RAMP" "$GW_PID" \
    "$FIRST_MS" "$TOKEN_MS" "$STREAM_TOKENS" "$OUT_DIR/streams-samples.txt")
  echo "$res" >"$OUT_DIR/streams.json"
  log "streams client: $res"
  sleep "$SETTLE"
  local after; after=$(rss_line "$GW_PID")
  sleep 25
  local after30; after30=$(rss_line "$GW_PID")
  local first ok failed max_live errs
  first=$(jq_get "$res" first_events); ok=$(jq_get "$res" clean_ends)
  failed=$(jq_get "$res" failed); max_live=$(jq_get "$res" max_live); errs=$(jq_get "$res" errors)
  local rows; rows=$(records "$OUT_DIR/streams.db")
  if [ -n "$(jq_get "$res" all_open.VmRSS)" ]; then
    row "2a. $STREAMS live SSE streams, all open" \
      "$(mib "$(jq_get "$res" all_open.VmRSS)")" "$(mib "$(jq_get "$res" all_open.VmHWM)")" \
      "$(mib "$(jq_get "$res" all_open.RssAnon)")" \
      "all $first/$STREAMS had their first event at t=$(jq_get "$res" all_open.t) s; max while all open: VmRSS $(mib "$(jq_get "$res" plateau_max.VmRSS)") MiB; $(jq_get "$res" all_open.Threads) threads; before: $(mib "${before%% *}") MiB"
  else
    row "2a. $STREAMS live SSE streams (NOT all open at once)" "-" "-" "-" \
      "only $max_live live at most; first events $first/$STREAMS; peak sample $(jq_get "$res" peak)"
  fi
  row_kib "2b. after the $STREAMS streams ended (+${SETTLE} s)" "$after" \
    "clean ends $ok/$STREAMS, failed $failed $errs; $rows records stored; stream time $(jq_get "$res" stream_s_min)-$(jq_get "$res" stream_s_max) s"
  row_kib "2c. after the streams ended (+$((SETTLE + 25)) s)" "$after30" ""
  stop_all
  gw_log_problems
}

load_keys() { # store label db-or-empty
  local store=$1 label=$2 db=$3
  start_sim 5
  start_gw "$store"
  local ms=$(( KEYS * 1000 / KEY_RATE ))
  log "$label: $KEYS fresh keys at $KEY_RATE req/s (${ms} ms)"
  local out
  out=$("$LG_BIN" --url "$URL" --rate "$KEY_RATE" --duration "${ms}ms" --warmup 0s \
    --connections 64 --mode fresh --header "$AUTH" --format kv --label keys)
  log "loadgen: $out"
  sleep "$SETTLE"
  local s; s=$(rss_line "$GW_PID")
  local tracked; tracked=$(metric idempotency_keys_tracked)
  local note="loadgen completed $(kv "$out" completed), non-2xx $(kv "$out" non2xx), errors $(kv "$out" errors), achieved $(kv "$out" achieved)/s, p99 $(( $(kv "$out" p99_us) / 1000 )) ms"
  if [ -n "$db" ]; then
    local dbs wal shm rows
    dbs=$(stat -c %s "$db"); wal=$(stat -c %s "$db-wal" 2>/dev/null || echo 0)
    shm=$(stat -c %s "$db-shm" 2>/dev/null || echo 0)
    rows=$(records "$db")
    note="$note; $rows records; SQLite file $(mib $((dbs / 1024))) MiB + WAL $(mib $((wal / 1024))) MiB + SHM $(mib $((shm / 1024))) MiB"
  fi
  note="$note; keys_tracked metric ${tracked:-?}"
  log "$label: VmRSS/VmHWM/RssAnon KiB = $s; $note"
  row_kib "$label" "$s" "$note"
  stop_all
  gw_log_problems
}

case_keys() { load_keys "sqlite:$OUT_DIR/keys.db" "3a. $KEYS stored keys, SQLite" "$OUT_DIR/keys.db"; }
case_keys_memory() { load_keys "memory:" "3b. $KEYS stored keys, memory:" ""; }

case_soak() {
  start_sim 5
  start_gw "sqlite:$OUT_DIR/soak.db"
  log "soak: storing $REPLAY_KEYS keys"
  "$LG_BIN" --url "$URL" --rate 100 --duration 1s --warmup 0s --connections 8 \
    --mode replay --keys "$REPLAY_KEYS" --header "$AUTH" --format kv --label store >/dev/null
  local stored; stored=$(rss_line "$GW_PID")
  log "soak: $REPLAY_KEYS keys stored, VmRSS/VmHWM/RssAnon KiB = $stored; replays at $REPLAY_RATE req/s for ${SOAK} s"
  "$LG_BIN" --url "$URL" --rate "$REPLAY_RATE" --duration "${SOAK}s" --warmup 0s \
    --connections 64 --mode replay --keys "$REPLAY_KEYS" --header "$AUTH" --format kv \
    --label soak >"$OUT_DIR/soak-loadgen.txt" 2>&1 &
  local lg=$!; PIDS+=("$lg")
  local t0; t0=$(date +%s.%N)
  : >"$OUT_DIR/soak-samples.txt"
  sleep 2
  local next=2
  while kill -0 "$lg" 2>/dev/null; do
    local t; t=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    echo "$t $(rss_line "$GW_PID")" >>"$OUT_DIR/soak-samples.txt"
    next=$((next + SAMPLE_EVERY))
    # tenths of a second to the next sample; wakes early when the load ends
    local ticks; ticks=$(awk -v a="$t0" -v b="$(date +%s.%N)" -v n="$next" 'BEGIN { d = (a + n - b) * 10; print (d > 0 ? int(d) : 0) }')
    for _ in $(seq 1 "$ticks"); do kill -0 "$lg" 2>/dev/null || break; sleep 0.1; done
  done
  wait "$lg" || true; forget_pid "$lg"
  local out; out=$(cat "$OUT_DIR/soak-loadgen.txt")
  log "loadgen: $out"
  local after; after=$(rss_line "$GW_PID")
  # first/last/max and slopes (least squares, KiB/min) of VmRSS
  local stats
  stats=$(awk -v flat="$FLAT_KIB_PER_MIN" '
    { t[NR] = $1; r[NR] = $2; h[NR] = $3 }
    function slope(a, b,   i, n, sx, sy, sxx, sxy) {
      n = 0; sx = sy = sxx = sxy = 0
      for (i = a; i <= b; i++) { n++; sx += t[i]; sy += r[i]; sxx += t[i] * t[i]; sxy += t[i] * r[i] }
      if (n < 2 || n * sxx - sx * sx == 0) return 0
      return (n * sxy - sx * sy) / (n * sxx - sx * sx) * 60
    }
    END {
      max = 0; for (i = 1; i <= NR; i++) if (r[i] > max) max = r[i]
      s_all = slope(1, NR); half = int(NR / 2) + 1; s_half = slope(half, NR)
      min2 = r[half]; max2 = r[half]; for (i = half; i <= NR; i++) { if (r[i] < min2) min2 = r[i]; if (r[i] > max2) max2 = r[i] }
      verdict = (s_half <= flat && s_half >= -flat) ? "flat" : "NOT-flat"
      printf "%d %d %d %d %.1f %.1f %s %d %d %.0f\n", NR, r[1], r[NR], max, s_all, s_half, verdict, min2, max2, t[NR]
    }' "$OUT_DIR/soak-samples.txt")
  local a; read -r -a a <<<"$stats"
  log "soak samples (t s, VmRSS, VmHWM, RssAnon KiB):"; sed 's/^/    /' "$OUT_DIR/soak-samples.txt"
  log "soak: n=${a[0]} first=${a[1]} last=${a[2]} max=${a[3]} KiB; slope all ${a[4]} KiB/min, second half ${a[5]} KiB/min -> ${a[6]}"
  local lgnote="loadgen achieved $(kv "$out" achieved)/s, completed $(kv "$out" completed), non-2xx $(kv "$out" non2xx), errors $(kv "$out" errors), unsent $(kv "$out" unsent), p99 $(kv "$out" p99_us) us"
  row_kib "4a. soak: $REPLAY_KEYS keys stored, before replays" "$stored" ""
  row "4b. soak: first sample (t=2 s)" "$(mib "${a[1]}")" "-" "-" "${a[0]} samples every ${SAMPLE_EVERY} s over ${SOAK} s of $REPLAY_RATE replays/s"
  row "4c. soak: last sample (t=${a[9]} s)" "$(mib "${a[2]}")" "-" "-" "$lgnote"
  row "4d. soak: max sample" "$(mib "${a[3]}")" "-" "-" \
    "slope ${a[4]} KiB/min (all samples), ${a[5]} KiB/min (second half, range $(mib "${a[7]}")-$(mib "${a[8]}") MiB): **${a[6]}** (flat = second-half |slope| <= $FLAT_KIB_PER_MIN KiB/min)"
  row_kib "4e. soak: after the load ended" "$after" "VmHWM here is the whole soak's peak"
  stop_all
  gw_log_problems
}

# ------------------------------------------------------------------- main
log "idemgate memory run: STREAMS=$STREAMS KEYS=$KEYS SOAK=$SOAK KEY_RATE=$KEY_RATE REPLAY_RATE=$REPLAY_RATE REPLAY_KEYS=$REPLAY_KEYS; out $OUT_DIR"
log "gateway $("$GW_BIN" --version 2>/dev/null || echo '?') ($(sha256sum "$GW_BIN" | cut -c1-12)); $(nproc) cores; ulimit -n $(ulimit -n)"
T_ALL=$(date +%s)
for CASE in $CASES; do
  CASE_T0=$(date +%s)
  case "$CASE" in
    idle) case_idle ;;
    streams) case_streams ;;
    keys) case_keys ;;
    keys-memory) case_keys_memory ;;
    soak) case_soak ;;
    *) echo "unknown case $CASE" >&2; exit 2 ;;
  esac
  timed "$CASE"
done

echo
echo "## idemgate gateway memory (MiB = KiB/1024; from /proc/PID/status)"
echo
echo "| case | VmRSS MiB | VmHWM MiB | RssAnon MiB | notes |"
echo "|---|---:|---:|---:|---|"
printf '%s\n' "${ROWS[@]}"
echo
echo "| case | wall time |"
echo "|---|---:|"
printf '%s\n' "${TIMES[@]}"
echo "| total | $(( $(date +%s) - T_ALL )) s |"
echo
echo "outputs and logs: $OUT_DIR"
