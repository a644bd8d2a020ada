#!/usr/bin/env bash
# Run the whole test suite on a fresh Debian/Ubuntu machine with Python >= 3.10:
# makes .venv, installs durabilis with its test extras, installs redis-server via
# apt when it is missing, then runs ruff, mypy --strict and pytest three times:
#   1. standalone: every suite (unit, integration, faults, hostile) against
#      redis-server processes the tests start on free loopback ports;
#   2. Redis Cluster: the suites below against a local cluster of 3 primaries +
#      3 replicas the tests build from redis-server processes (--backend=cluster),
#      plus the cluster faults of tests/cluster/ (resharding, failovers, acks);
#   3. Redis Sentinel: the integration suite through a redis+sentinel:// URL (a
#      local primary, 2 replicas, 3 Sentinels: --backend=sentinel), plus the
#      failovers of tests/sentinel/ (acks, doctor).
# With arguments, runs `pytest "$@"` once instead (add --backend=... yourself).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "redis-server not found: installing it with apt" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
  # The Debian package starts a system service; the suite never uses it.
  ($SUDO service redis-server stop >/dev/null 2>&1 || true)
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# bench: the peers, so the benchmark smoke test measures them too
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,hiredis,bench]'

echo "== ruff"
.venv/bin/ruff check durabilis tests benchmarks
echo "== mypy --strict"
.venv/bin/mypy

if [ "$#" -gt 0 ]; then
  exec .venv/bin/pytest "$@"
fi

# The suites that run on Redis Cluster too: every test of these that uses the
# redis_url / store / raw fixtures (the integration suites of every pillar, the
# layer, config, CLI...; the others, and those marked standalone_only, are
# deselected there), plus the cluster faults of tests/cluster/.
CLUSTER_SUITES=(
  tests/integration
  tests/faults
  tests/hostile
  tests/cluster
)

echo "== pytest: standalone Redis"
.venv/bin/pytest
echo "== pytest: Redis Cluster (3 primaries + 3 replicas)"
.venv/bin/pytest --backend=cluster "${CLUSTER_SUITES[@]}"
echo "== pytest: Redis Sentinel (a primary, 2 replicas, 3 Sentinels)"
.venv/bin/pytest --backend=sentinel tests/integration tests/sentinel
