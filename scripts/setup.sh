#!/usr/bin/env bash
# Installs what the test suites need beyond cargo, on a fresh machine of this
# project's kind: promtool (Debian `prometheus`) for the alert-rule tests,
# Chromium for the dashboard test (headless), libfaketime for the
# wall-clock step test and the chaos runs, the Redis server and client
# (built with TLS) and the PostgreSQL server binaries (initdb, postgres,
# pg_basebackup) for the suites and chaos runs that start private
# servers, plain or TLS-only, and a Python venv (.venv) with the official
# openai/anthropic clients for the end-to-end tests, and Node.js with npm
# for the TypeScript SDK end-to-end tests (their packages are installed by
# scripts/test, `npm ci`).
# Idempotent: does nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# libfaketime: the wall-clock step test and the chaos runs' clock steps
# run the gateway under it.
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || need_apt+=(faketime)
{ command -v redis-server && command -v redis-cli; } >/dev/null 2>&1 || need_apt+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! .venv/bin/python -c "import openai, anthropic, pytest" 2>/dev/null; then
  echo "setup: creating .venv with tests/e2e/requirements.txt"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r tests/e2e/requirements.txt
fi
