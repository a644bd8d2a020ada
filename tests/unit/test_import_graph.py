"""The import graph's floors: the config package sits below the layer.

Each check runs in a fresh interpreter, with ``durabilis`` loaded as a bare
package (its front door imports the layer itself, so importing through it
would prove nothing): then one module is imported, and the modules it pulled
in are inspected.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import durabilis

PACKAGE = Path(durabilis.__file__).parent

_LOADED = """
import importlib, sys, types
package = types.ModuleType("durabilis")
package.__path__ = [sys.argv[1]]
sys.modules["durabilis"] = package
importlib.import_module(sys.argv[2])
print("\\n".join(sorted(m for m in sys.modules if m.startswith("durabilis."))))
"""


def loaded_by(module: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, str(PACKAGE), module],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return set(done.stdout.split())


def test_importing_the_config_package_imports_nothing_of_the_layer() -> None:
    loaded = loaded_by("durabilis.config")
    assert "durabilis.config._loading" in loaded  # (the check ran)
    assert not {m for m in loaded if m == "durabilis.layer" or m.startswith("durabilis.layer.")}


def test_the_layer_hands_out_the_config_packages_durability_config() -> None:
    from durabilis.config._layer import DurabilityConfig
    from durabilis.layer import DurabilityConfig as FromLayer

    assert FromLayer is DurabilityConfig
    assert durabilis.DurabilityConfig is DurabilityConfig
