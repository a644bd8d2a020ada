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


_FUSED_PREFIX = "fused:"

_FUSED_DRIVER = """
local n = tonumber(ARGV[1])
local ki, ai = 0, 1 + 2 * n
local out = {}
for i = 1, n do
  local nk, na = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local k, a = {}, {}
  for j = 1, nk do k[j] = KEYS[ki + j] end
  for j = 1, na do a[j] = ARGV[ai + j] end
  ki, ai = ki + nk, ai + na
  local reply = __subs[i](k, a)
  if reply == nil then reply = false end
  out[i] = reply
end
return out
"""


@functools.cache
def fused_source(names: tuple[str, ...]) -> str:
    """One script running the named scripts in order, each with its own KEYS/ARGV.

    Each script's unchanged source becomes the body of a function whose
    parameters shadow ``KEYS`` and ``ARGV``, so a fused step runs exactly the
    code the separate scripts run (no second copy of any logic), atomically,
    in ONE round trip. Returns the table of the scripts' replies.
    """
    table = sources()
    parts = ["local __subs = {}"]
    for i, name in enumerate(names, start=1):
        parts.append(f"__subs[{i}] = function(KEYS, ARGV)\n{table[name]}\nend")
    parts.append(_FUSED_DRIVER)
    return "\n".join(parts)


def fuse(calls: Sequence[ScriptCall]) -> ScriptCall:
    """The single call running ``calls`` in order (see :func:`fused_source`).

    Only for keys that may share one script: standalone Redis, or keys of one
    Cluster slot.
    """
    keys: list[KeyArg] = []
    counts: list[Arg] = [len(calls)]
    args: list[Arg] = []
    for c in calls:
        counts += [len(c.keys), len(c.args)]
        keys.extend(c.keys)
        args.extend(c.args)
    name = _FUSED_PREFIX + "+".join(c.name for c in calls)
    return ScriptCall(name, keys, counts + args)


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
                if name.startswith(_FUSED_PREFIX):
                    source = fused_source(tuple(name[len(_FUSED_PREFIX):].split("+")))
                else:
                    source = sources()[name]
            except KeyError:
                raise RuntimeError(f"unknown durabilis script {name!r}") from None
            script = self._client.register_script(source)
            self._scripts[name] = script
        return script
