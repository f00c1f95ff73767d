#!/usr/bin/env bash
# A chaos run: `scripts/chaos.sh STORE MINUTES [idemgate-chaos flags…]`.
#
# STORE is one of
#   sqlite    one shared file;
#   redis     a private Redis master with one replica (redis-server on
#             free ports), reached through a FaultProxy; `--redis URL`
#             runs on an existing node instead (under a key prefix of the
#             run's own; no store restarts or failovers);
#   cluster   a private Redis Cluster, 3 masters and 3 replicas;
#   postgres  a private PostgreSQL primary with a synchronous streaming
#             standby (initdb, pg_basebackup -R), through a FaultProxy.
# Three `idemgate serve` replicas run in front of `idemgate-llm-sim`;
# clients and the nemesis run for MINUTES: kill -9, SIGSTOP past the
# lease and SIGTERM rolling restarts of replicas, and on a private store
# also wall-clock steps of the replicas (libfaketime), store restarts,
# failovers (the replica promoted) and, through the FaultProxy, replies
# dropped after the store applied the call (`--faults` picks others,
# store-cut and store-stall among them). Then every key is read once
# more and the checker judges the history against docs/design.md ("The
# promise, as invariants"). Prints one summary line; exits 1 on any
# violation, 2 if the run could not be carried out.
#
# PROFILE=release builds and runs release binaries (default: debug).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: scripts/chaos.sh sqlite|redis|cluster|postgres MINUTES [idemgate-chaos flags...]" >&2
  exit 2
fi
store=$1
minutes=$2
shift 2
case "$store" in
  sqlite | redis | cluster | postgres) ;;
  *)
    echo "unknown store '$store': use sqlite, redis, cluster or postgres" >&2
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
