#!/usr/bin/env bash
# Makes sure the servers the store suites talk to are answering, starting them
# with the machine's own commands when they are not. Under CI=true a server
# that cannot be started is an error (the suites must fail, never skip).
set -u

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }

if command -v pg_isready >/dev/null && ! pg_up; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
fi
if command -v redis-server >/dev/null && ! redis_up; then
  echo "services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  for _ in $(seq 1 30); do redis_up && break; sleep 1; done
fi

status=0
pg_up && echo "services: PostgreSQL answers" || { echo "services: PostgreSQL is NOT answering"; status=1; }
redis_up && echo "services: Redis answers" || { echo "services: Redis is NOT answering"; status=1; }
if [ "${CI:-}" = "true" ] && [ $status -ne 0 ]; then
  exit 1
fi
exit 0
