#!/usr/bin/env bash
# A chaos run: `scripts/chaos.sh STORE MINUTES [idemgate-chaos flags…]`.
#
# STORE is `sqlite` (one shared file) or `redis` (one node, the local one
# at 127.0.0.1:6379 unless IDEMGATE_CHAOS_REDIS says otherwise, under a
# key prefix of the run's own). `cluster` and `postgres` are not
# implemented yet. Three `idemgate serve` replicas run in front of
# `idemgate-llm-sim`; clients and the nemesis (kill -9, SIGSTOP past the
# lease, SIGTERM rolling restarts) run for MINUTES, then every key is read
# once more and the checker judges the history against docs/design.md
# ("The promise, as invariants"). Prints one summary line; exits 1 on any
# violation, 2 if the run could not be carried out.
#
# PROFILE=release builds and runs release binaries (default: debug).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: scripts/chaos.sh sqlite|redis MINUTES [idemgate-chaos flags...]" >&2
  exit 2
fi
store=$1
minutes=$2
shift 2
case "$store" in
  sqlite | redis) ;;
  cluster | postgres)
    echo "chaos on $store is not implemented yet (docs/design.md, \"Not yet implemented\"); use sqlite or redis" >&2
    exit 2
    ;;
  *)
    echo "unknown store '$store': use sqlite or redis" >&2
    exit 2
    ;;
esac
profile=${PROFILE:-debug}
if [ "$profile" = release ]; then
  cargo build --release -p idemgate -p idemgate-llm-sim -p idemgate-chaos
else
  cargo build -p idemgate -p idemgate-llm-sim -p idemgate-chaos
fi
dir="target/chaos/$store-$(date -u +%Y%m%dT%H%M%SZ)"
exec "target/$profile/idemgate-chaos" \
  --store "$store" --minutes "$minutes" --dir "$dir" \
  --idemgate-bin "target/$profile/idemgate" \
  --llm-sim-bin "target/$profile/idemgate-llm-sim" \
  "$@"
