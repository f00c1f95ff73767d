#!/usr/bin/env bash
# The soak: many fresh keys, each sent as 8 concurrent duplicates spread
# over 2 gateway processes, on Redis, PostgreSQL and one SQLite file shared
# by both processes. Fails unless every key ran upstream exactly once and
# every answer of a key is identical; prints one line of figures per store.
# CI runs the same tests with 60 keys (scripts/test); this runs them full
# size.
# Usage: scripts/soak.sh [KEYS]   (default 10000 keys per store)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh
SOAK_KEYS=${1:-10000} cargo test -q -p idemgate --test replicas_duplicates soak -- \
  --nocapture --test-threads 1 2>&1 | grep -oE "soak (sqlite|redis|postgres): .*|test result.*|panicked.*|FAILED.*"
