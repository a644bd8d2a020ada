"""The core does no I/O: every module under ``durabilis/core/`` imports no
``redis``, ``asyncio`` or ``threading`` (directly or through what it imports).

Each module is imported alone in a fresh interpreter that refuses those
packages; the modules are found on disk, so a new core module is checked
without being listed here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import durabilis

PACKAGE = Path(durabilis.__file__).parent

_PURE = """
import importlib, importlib.abc, sys, types
BANNED = ("redis", "asyncio", "threading")
before = set(sys.modules)
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BANNED:
            raise ImportError("the core imported " + name)
        return None
sys.meta_path.insert(0, Refuse())
# The package's front door imports the shells: load the core on its own.
package = types.ModuleType("durabilis")
package.__path__ = [sys.argv[1]]
sys.modules["durabilis"] = package
importlib.import_module(sys.argv[2])
loaded = {m.partition(".")[0] for m in set(sys.modules) - before}
assert not loaded & set(BANNED), loaded & set(BANNED)
"""


def _core_modules() -> list[str]:
    names = []
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_the_core_modules_are_found_on_disk() -> None:
    found = _core_modules()
    assert "durabilis.core" in found and "durabilis.core.retry.defaults" in found
    assert len(found) >= 25


@pytest.mark.parametrize("module", _core_modules())
def test_a_core_module_imports_no_redis_asyncio_or_threading(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PURE, str(PACKAGE), module],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
