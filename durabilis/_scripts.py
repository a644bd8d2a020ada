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
def _file_sources() -> dict[str, str]:
    directory = _lua_dir()
    if directory is None:
        raise RuntimeError("durabilis is installed without its lua/ scripts")
    found = {p.stem: p.read_text(encoding="utf-8") for p in sorted(directory.glob("*.lua"))}
    if not found:
        raise RuntimeError(f"no .lua scripts found in {directory}")
    return found


# A script marks the point after its checks and before its first write by
# calling ``ready()``. Run alone, that is a no-op (this prelude); as a body of
# a fused step it suspends the body until every body of the step has passed
# its checks (see ``fused_source``).
_PRELUDE = "local function ready() end\n"


@functools.cache
def sources() -> dict[str, str]:
    """Every script's source by name, as registered (with the ``ready()`` prelude).

    Raises:
        RuntimeError: No script ships with the package.
    """
    return {name: _PRELUDE + text for name, text in _file_sources().items()}


def lua_directory() -> Path:
    """Where the scripts were loaded from (for ``durabilis doctor``)."""
    directory = _lua_dir()
    if directory is None:
        raise RuntimeError("durabilis is installed without its lua/ scripts")
    return directory


FUSED_PREFIX = "fused:"

# Two phases make a fused step all-or-nothing. Phase 1 runs every body up to
# its ready() (checks only, no writes). If a GATED body returned before
# ready(), it refused: no body is resumed, nothing is written. Otherwise phase
# 2 resumes every body, in order, to its end. Redis refuses a write for OOM
# only as a script's first write, so a refusal there also leaves nothing.
# Reply: {status, reply_1, ..., reply_n}, status one letter per body:
#   c  committed (ran past ready() to its end)
#   r  returned before ready(): wrote nothing (a refusal, or a read-only answer)
#   n  not run: suspended at ready() when the step was aborted, wrote nothing
_FUSED_DRIVER = """
local n = tonumber(ARGV[1])
local ki, ai = 0, 1 + 3 * n
local cos, out, st = {}, {}, {}
local abort = false
local function gate_keeper()
  local passed = false
  return function() if not passed then passed = true; coroutine.yield() end end
end
for i = 1, n do
  local nk, na, gate = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), ARGV[3 * i + 1]
  local k, a = {}, {}
  for j = 1, nk do k[j] = KEYS[ki + j] end
  for j = 1, na do a[j] = ARGV[ai + j] end
  ki, ai = ki + nk, ai + na
  local co = coroutine.create(__subs[i])
  local ok, reply = coroutine.resume(co, k, a, gate_keeper())
  if not ok then error(reply, 0) end
  if coroutine.status(co) == "dead" then
    if reply == nil then reply = false end
    out[i], st[i] = reply, "r"
    if gate == "1" then abort = true end
  else
    cos[i], out[i], st[i] = co, false, "n"
  end
end
if not abort then
  for i = 1, n do
    local co = cos[i]
    if co then
      local ok, reply = coroutine.resume(co)
      if not ok then error(reply, 0) end
      if reply == nil then reply = false end
      out[i], st[i] = reply, "c"
    end
  end
end
return {table.concat(st), unpack(out, 1, n)}
"""


@functools.cache
def fused_source(names: tuple[str, ...]) -> str:
    """One script running the named scripts as ONE all-or-nothing step.

    Each script's unchanged source becomes the body of a function whose
    parameters shadow ``KEYS``, ``ARGV`` and ``ready``, so a fused step runs
    exactly the code the separate scripts run (no second copy of any logic)
    in ONE round trip. Every body passes its checks before any body writes;
    a gated body that refuses aborts the whole step (see ``_FUSED_DRIVER``).
    """
    table = _file_sources()
    # One step, one instant: the bodies share the step's first TIME reading
    # (a command each saved; a step is atomic, so no body can tell).
    parts = [
        "local __subs = {}",
        "local __clock",
        "local function __step_time()",
        f"  if not __clock then __clock = {_TIME} end",
        "  return __clock",
        "end",
    ]
    for i, name in enumerate(names, start=1):
        body = table[name].replace(_TIME, "__step_time()")
        parts.append(f"__subs[{i}] = function(KEYS, ARGV, ready)\n{body}\nend")
    parts.append(_FUSED_DRIVER)
    return "\n".join(parts)


def fuse(calls: Sequence[ScriptCall], gated: Sequence[bool] | None = None) -> ScriptCall:
    """The single call running ``calls`` as one step (see :func:`fused_source`).

    Only for keys that may share one script: standalone Redis, or keys of one
    Cluster slot. ``gated[i]``: a refusal by ``calls[i]`` aborts the step.
    """
    keys: list[KeyArg] = []
    counts: list[Arg] = [len(calls)]
    args: list[Arg] = []
    for i, c in enumerate(calls):
        counts += [len(c.keys), len(c.args), "1" if gated and gated[i] else "0"]
        keys.extend(c.keys)
        args.extend(c.args)
    name = FUSED_PREFIX + "+".join(c.name for c in calls)
    return ScriptCall(name, keys, counts + args)


def unfuse(call: ScriptCall) -> list[ScriptCall]:
    """The calls :func:`fuse` made ``call`` of (``[call]`` for a call not fused)."""
    if not call.name.startswith(FUSED_PREFIX):
        return [call]
    names = call.name[len(FUSED_PREFIX):].split("+")
    n = int(call.args[0])
    counts = call.args[1:1 + 3 * n]
    args, keys = list(call.args[1 + 3 * n:]), list(call.keys)
    out = []
    for i, name in enumerate(names):
        nk, na = int(counts[3 * i]), int(counts[3 * i + 1])
        out.append(ScriptCall(name, keys[:nk], args[:na]))
        keys, args = keys[nk:], args[na:]
    return out


class Replies(list[Any]):
    """The replies of one step's calls, in call order, with what each call did.

    ``status[i]``: ``c`` committed, ``r`` returned without writing (a refusal
    or a read-only answer), ``n`` not run (nothing written), ``?`` unknown (the
    step failed while this call was in flight: it may or may not have run).
    """

    __slots__ = ("status",)

    def __init__(self, replies: Sequence[Any], status: str) -> None:
        super().__init__(replies)
        self.status = status

    def ran(self, i: int) -> bool:
        """Whether call ``i`` may have written something (committed or unknown)."""
        return self.status[i] in "c?"


_TIME = 'redis.call("TIME")'


def with_clock_offset(source: str, clock_key: str) -> str:
    """``source`` reading the server clock plus the offset (microseconds, a
    string) stored at ``clock_key``: the simulator's test hook (standalone
    Redis only: the key is not declared in KEYS)."""
    key = clock_key.replace("\\", "\\\\").replace('"', '\\"')
    shim = (
        "local function __durabilis_time()\n"
        '  local t = redis.call("TIME")\n'
        f"  local off = tonumber(redis.call('GET', \"{key}\") or '0') or 0\n"
        "  local us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + off\n"
        "  local sec = math.floor(us / 1000000)\n"
        '  return {string.format("%d", sec), string.format("%d", us - sec * 1000000)}\n'
        "end\n"
    )
    return shim + source.replace(_TIME, "__durabilis_time()")


class ScriptRegistry:
    """Lazily registers each script once on one client (sync or async).

    Args:
        client: The redis-py client.
        clock_key: Test hook (``durabilis.testing.offset_server_clock``): every
            script reads the server clock plus the offset stored at this key.
    """

    __slots__ = ("_client", "_clock_key", "_scripts")

    def __init__(self, client: Any, clock_key: str | None = None) -> None:
        self._client = client
        self._clock_key = clock_key
        self._scripts: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            try:
                if name.startswith(FUSED_PREFIX):
                    source = fused_source(tuple(name[len(FUSED_PREFIX):].split("+")))
                else:
                    source = sources()[name]
            except KeyError:
                raise RuntimeError(f"unknown durabilis script {name!r}") from None
            if self._clock_key is not None:
                source = with_clock_offset(source, self._clock_key)
            script = self._client.register_script(source)
            self._scripts[name] = script
        return script
