#!/usr/bin/env bash
# Run the whole test suite on a fresh Debian/Ubuntu machine with Python >= 3.10:
# makes .venv, installs durabilis with its test extras, installs redis-server via
# apt when it is missing, then runs ruff, mypy --strict and pytest (which starts
# its own redis-server processes on free loopback ports).
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
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,hiredis]'

echo "== ruff"
.venv/bin/ruff check durabilis tests benchmarks
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
exec .venv/bin/pytest "$@"
