#!/usr/bin/env bash
# Run the whole test suite on a fresh Debian/Ubuntu machine with Python >= 3.11:
# makes .venv, installs durabilis with its test extras (`.[test,hiredis]`: what the
# tests import, no benchmark peer), installs redis-server and chromium via apt when
# they are missing, then runs ruff, mypy --strict and these passes (docs/testing.md:
# which test runs where, and why):
#   1. standalone: every suite (unit, integration, faults, hostile, the fault
#      simulator, the web console's browser tests in a real Chromium) against
#      redis-server processes the tests start on free loopback ports;
#   2. Redis Cluster: the tests whose behaviour can differ on Cluster (marked
#      `topologies("cluster", ...)`: the layer's unfused steps, waves and
#      compensation, every pillar's scripts, hash tags, the hostile suites, the
#      CLI and doctor...) against a local cluster of 3 primaries + 3 replicas,
#      plus the cluster faults of tests/cluster/ (resharding, failovers, acks);
#   3. Redis Sentinel: the tests marked `topologies(..., "sentinel")` (discovery,
#      acks with replicas, the layer end to end, the connect paths) through a
#      redis+sentinel:// URL (a primary, 2 replicas, 3 Sentinels), plus the
#      failovers of tests/sentinel/;
#   4. the benchmark smoke test, in .venv-bench (`.[bench,hiredis]`: the peers it
#      measures, installed in the background while the passes above run).
# Each pass runs on pytest-xdist workers (DURABILIS_TEST_WORKERS, default: the
# number of cores, at least 2; each worker starts its own servers, cluster and
# Sentinels), `--dist loadgroup` (tests marked `serial` run one after another on
# one worker), and prints its wall time and its 15 slowest tests.
# With arguments, runs `pytest "$@"` once instead (add --backend=... and -n yourself).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
PIP=(-m pip install -q --disable-pip-version-check)

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "redis-server not found: installing it with apt" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
  # The Debian package starts a system service; the suite never uses it.
  ($SUDO service redis-server stop >/dev/null 2>&1 || true)
fi

# The console's browser tests (tests/browser/) drive Debian's chromium through
# Playwright (`executable_path`, no `playwright install` download).
if ! command -v chromium >/dev/null 2>&1; then
  echo "chromium not found: installing it with apt" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

declare -a TIMES=()
FAILED=0
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# step NAME CMD...: runs CMD, prints and keeps its wall time; a failure is kept
# (the later passes still run: one CI run shows every failing pass), except that
# pytest's exit 5 (no test collected: a broken selection) is a failure too.
step() {
  local name="$1" start rc secs
  shift
  echo "== $name"
  start=$(now)
  set +e
  "$@"
  rc=$?
  set -e
  secs=$(elapsed "$start")
  if [ "$rc" -eq 5 ]; then
    echo "== $name: NO TEST COLLECTED (pytest exit 5): the selection is broken" >&2
  fi
  if [ "$rc" -ne 0 ]; then
    FAILED=1
    TIMES+=("$(printf '%-62s %7ss  FAILED (exit %s)' "$name" "$secs" "$rc")")
  else
    TIMES+=("$(printf '%-62s %7ss' "$name" "$secs")")
  fi
  echo "== $name: ${secs}s (exit $rc)"
}

TOTAL_START=$(now)

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
step "install .[test,hiredis]" .venv/bin/python "${PIP[@]}" -e '.[test,hiredis]'

if [ "$#" -gt 0 ]; then
  echo "== ruff"
  .venv/bin/ruff check durabilis tests benchmarks
  echo "== mypy --strict"
  .venv/bin/mypy
  exec .venv/bin/pytest "$@"
fi

# The benchmark peers (powertools, boto3, matplotlib, ...) go to a venv of their
# own, in the background: no test but the benchmark smoke test imports them.
BENCH_LOG=$(mktemp)
(
  set -e
  [ -x .venv-bench/bin/python ] || "$PYTHON" -m venv .venv-bench
  .venv-bench/bin/python "${PIP[@]}" --no-compile -e '.[bench,hiredis]' \
    'pytest>=8' 'pytest-timeout>=2.2'
) >"$BENCH_LOG" 2>&1 &
BENCH_INSTALL=$!

step "ruff" .venv/bin/ruff check durabilis tests benchmarks
step "mypy --strict" .venv/bin/mypy

WORKERS="${DURABILIS_TEST_WORKERS:-$(nproc 2>/dev/null || echo 2)}"
[ "$WORKERS" -ge 2 ] || WORKERS=2
PYTEST=(.venv/bin/pytest -n "$WORKERS" --dist loadgroup --durations=15)

step "pytest: standalone Redis" \
  "${PYTEST[@]}" --ignore=tests/integration/test_benchmarks_smoke.py
step "pytest: Redis Cluster (3 primaries + 3 replicas)" \
  "${PYTEST[@]}" --backend=cluster tests/integration tests/faults tests/hostile tests/cluster
step "pytest: Redis Sentinel (a primary, 2 replicas, 3 Sentinels)" \
  "${PYTEST[@]}" --backend=sentinel tests/integration tests/sentinel

echo "== install .[bench,hiredis] in .venv-bench (started in the background)"
if wait "$BENCH_INSTALL"; then
  # The peers must be there: the smoke test fails if one is missing, not "skipped".
  step "pytest: benchmark smoke (with the peers)" env DURABILIS_BENCH_PEERS=required \
    .venv-bench/bin/pytest --durations=5 tests/integration/test_benchmarks_smoke.py
else
  cat "$BENCH_LOG" >&2
  FAILED=1
  TIMES+=("$(printf '%-62s %8s  FAILED' "install .[bench,hiredis] (.venv-bench)" "")")
fi
rm -f "$BENCH_LOG"

echo "== wall times"
printf '%s\n' "${TIMES[@]}"
printf '%-62s %7ss\n' "total" "$(elapsed "$TOTAL_START")"
exit "$FAILED"
