"""Lua scripts shipped as package data, registered per client.

The ``.lua`` files live in ``lua/`` at the top of the repository and are
shipped inside the wheel as ``durabilis/lua/`` (see ``pyproject.toml``).
Each client gets redis-py ``Script`` objects, which run EVALSHA and reload
the source on NOSCRIPT (after ``SCRIPT FLUSH``, a restart or a failover):
durabilis never hand-rolls that.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

KeyArg = str | bytes
Arg = str | bytes | int | float


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One script invocation, built by pure code, run by a store.

    Attributes:
        name: The script's file name without ``.lua`` (``"idem_claim"``).
        keys: Every key the script touches (one hash tag).
        args: The ARGV values.
    """

    name: str
    keys: Sequence[KeyArg]
    args: Sequence[Arg]


def _lua_dir() -> Path | None:
    packaged = resources.files("durabilis") / "lua"
    if packaged.is_dir():
        return Path(str(packaged))
    # Running from a source checkout (editable install): the top-level lua/.
    source = Path(__file__).resolve().parent.parent / "lua"
    return source if source.is_dir() else None


@functools.cache
def sources() -> dict[str, str]:
    """Every script's source by name. Raises ``RuntimeError`` if none ship."""
    directory = _lua_dir()
    if directory is None:
        raise RuntimeError("durabilis is installed without its lua/ scripts")
    found = {p.stem: p.read_text(encoding="utf-8") for p in sorted(directory.glob("*.lua"))}
    if not found:
        raise RuntimeError(f"no .lua scripts found in {directory}")
    return found


def lua_directory() -> Path:
    """Where the scripts were loaded from (for ``durabilis doctor``)."""
    directory = _lua_dir()
    if directory is None:
        raise RuntimeError("durabilis is installed without its lua/ scripts")
    return directory


class ScriptRegistry:
    """Lazily registers each script once on one client (sync or async)."""

    __slots__ = ("_client", "_scripts")

    def __init__(self, client: Any) -> None:
        self._client = client
        self._scripts: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            try:
                source = sources()[name]
            except KeyError:
                raise RuntimeError(f"unknown durabilis script {name!r}") from None
            script = self._client.register_script(source)
            self._scripts[name] = script
        return script
