"""Lua scripts shipped as package data, registered per client.

The ``.lua`` files live in ``durabilis/lua/`` (package data, read through
``importlib.resources``: the same from a wheel, an editable install or a
source checkout). Shared routines live once in ``durabilis/lua/lib/`` and are
pasted in at load time where a script has a line ``--@include lib/<name>.lua``
(see :func:`expand`); the SHA that EVALSHA sends is the expanded text's.
Each script's header declares its replica contract with a line ``@acks: ...``
(see :class:`AcksTag`): whether ``acks="replicas:N"`` follows it with ``WAIT``.
Each client gets redis-py ``Script`` objects, which run EVALSHA and reload
the source on NOSCRIPT (after ``SCRIPT FLUSH``, a restart or a failover):
durabilis never hand-rolls that.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durabilis.errors import DurabilisError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

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


class ScriptSourceError(DurabilisError, RuntimeError):
    """The shipped Lua does not load: a missing or bad include, a cycle of
    includes, includes nested too deep, or a script without its ``@acks`` tag.
    A packaging or development error, raised when the scripts are first read."""


MAX_INCLUDE_DEPTH = 3
"""How deep includes may nest (a script's own include is depth 1)."""

_INCLUDE = re.compile(r"^--@include[ \t]+(\S+)[ \t]*$")
_INCLUDE_PATH = re.compile(r"^lib/[a-z0-9_]+\.lua$")


def _package_root() -> Traversable:
    return resources.files("durabilis") / "lua"


def _read(root: Traversable, relative: str) -> str | None:
    node = root
    for part in relative.split("/"):
        node = node / part
    return node.read_text(encoding="utf-8") if node.is_file() else None


def expand(root: Traversable, name: str, text: str) -> str:
    """``text`` (the script ``name``) with every include line replaced by the
    included file's (expanded) text, read below ``root``.

    An include is a whole line ``--@include lib/<name>.lua``, at the top level
    of the script (not inside a block: what it defines are locals); the file's
    text stands in its place, so the expanded script runs exactly what a copy
    of the routine in that place would. A file is pasted once per script, at
    its first include (a routine that needs another includes it itself).

    Raises:
        ScriptSourceError: An include names no file (or a path outside
            ``lib/``), includes form a cycle, or nest deeper than
            :data:`MAX_INCLUDE_DEPTH`.
    """
    return _expand(root, name, text, (name,), set())


def _expand(
    root: Traversable, name: str, text: str, chain: tuple[str, ...], pasted: set[str]
) -> str:
    out: list[str] = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        match = _INCLUDE.match(line.rstrip("\r\n"))
        if match is None:
            if line.lstrip().startswith("--@include"):
                raise ScriptSourceError(
                    f"{name}:{number}: an include is a line '--@include lib/<name>.lua', "
                    f"not {line.strip()!r}")
            out.append(line)
            continue
        target = match.group(1)
        where = f"{name}:{number}"
        if _INCLUDE_PATH.match(target) is None:
            raise ScriptSourceError(
                f"{where}: includes name a file lib/<name>.lua, not {target!r}")
        if target in chain:
            cycle = " -> ".join((*chain[chain.index(target):], target))
            raise ScriptSourceError(f"{where}: include cycle {cycle}")
        if len(chain) > MAX_INCLUDE_DEPTH:
            raise ScriptSourceError(
                f"{where}: includes nest deeper than {MAX_INCLUDE_DEPTH} "
                f"({' -> '.join((*chain, target))})")
        included = _read(root, target)
        if included is None:
            raise ScriptSourceError(f"{where}: unknown include {target!r}")
        if target in pasted:
            continue
        pasted.add(target)
        body = _expand(root, target, included, (*chain, target), pasted)
        out.append(body if body.endswith("\n") else body + "\n")
    return "".join(out)


@dataclass(frozen=True, slots=True)
class AcksTag:
    """A script's replica contract, its header line ``@acks: ...``.

    ``@acks: replicas``: under ``acks="replicas:N"`` the script is followed by
    ``WAIT`` (its writes count once N replicas confirm them). ``@acks: none``:
    it is not (a read, or a write whose loss in a failover is safe: the header
    says why). ``@acks: replicas, none when ARGV[i] in a|b``: ``none`` for the
    calls whose ``ARGV[i]`` is one of those values, ``replicas`` for the others.
    A fused step waits when one of its scripts is tagged plainly ``replicas``.
    """

    waits: bool
    arg: int = 0  # 1-based ARGV index of the exception (0: none)
    unless: frozenset[str] = frozenset()

    def __str__(self) -> str:
        """The tag as a header writes it (``replicas``, ``none``, ...)."""
        first = "replicas" if self.waits else "none"
        if not self.arg:
            return first
        other = "none" if self.waits else "replicas"
        return f"{first}, {other} when ARGV[{self.arg}] in {'|'.join(sorted(self.unless))}"

    def waits_for(self, args: Sequence[Arg]) -> bool:
        """Whether a call with these ARGV is followed by ``WAIT``."""
        if self.arg and len(args) >= self.arg:
            value = args[self.arg - 1]
            text = value.decode() if isinstance(value, bytes) else str(value)
            if text in self.unless:
                return not self.waits
        return self.waits


# The tag's value ends at the line's end or at a "(" opening the reason.
_ACKS_LINE = re.compile(r"^@acks:[ \t]*([^(\n]*?)[ \t]*(?:\(.*)?$", re.M)
_ACKS_VALUE = re.compile(
    r"^(replicas|none)"
    r"(?:, (replicas|none) when ARGV\[([1-9][0-9]?)\] in ([a-z_]+(?:\|[a-z_]+)*))?$")


def acks_tag(name: str, text: str) -> AcksTag:
    """The ``@acks`` tag of the script ``name`` (its header: the first ``--[[ ]]``).

    Raises:
        ScriptSourceError: The header has no tag, more than one, or a bad one.
    """
    header = text.split("]]", 1)[0] if text.startswith("--[[") else ""
    found = _ACKS_LINE.findall(header)
    if len(found) != 1:
        raise ScriptSourceError(
            f"{name}: its header must carry one line '@acks: replicas' or '@acks: none' "
            f"(found {len(found)})")
    match = _ACKS_VALUE.match(found[0])
    if match is None:
        raise ScriptSourceError(
            f"{name}: '@acks: {found[0]}' is not 'replicas', 'none' or "
            "'<replicas|none>, <none|replicas> when ARGV[i] in a|b'")
    default, other, arg, values = match.groups()
    if other is None:
        return AcksTag(default == "replicas")
    if other == default:
        raise ScriptSourceError(f"{name}: '@acks: {found[0]}' names one contract twice")
    return AcksTag(default == "replicas", int(arg), frozenset(values.split("|")))


@dataclass(frozen=True, slots=True)
class Scripts:
    """Every script of one directory: expanded source and replica contract by name."""

    sources: dict[str, str]
    acks: dict[str, AcksTag]


def load(root: Traversable) -> Scripts:
    """Read, expand and check every ``*.lua`` directly in ``root``.

    Raises:
        ScriptSourceError: No script, or one that does not load (see
            :func:`expand`, :func:`acks_tag`).
    """
    if not root.is_dir():
        raise ScriptSourceError("durabilis is installed without its lua/ scripts")
    texts: dict[str, str] = {}
    for node in sorted(root.iterdir(), key=lambda n: n.name):
        if node.is_file() and node.name.endswith(".lua"):
            name = node.name[:-len(".lua")]
            texts[name] = expand(root, name, node.read_text(encoding="utf-8"))
    if not texts:
        raise ScriptSourceError(f"no .lua scripts found in {root}")
    return Scripts(texts, {name: acks_tag(name, text) for name, text in texts.items()})


@functools.cache
def _shipped() -> Scripts:
    return load(_package_root())


def _file_sources() -> dict[str, str]:
    return _shipped().sources


def acks_tags() -> dict[str, AcksTag]:
    """Every shipped script's replica contract (its ``@acks`` tag) by name."""
    return _shipped().acks


@functools.cache
def _fused_waits(names: tuple[str, ...]) -> bool:
    tags = acks_tags()
    return any(tags[n].waits and not tags[n].arg for n in names)


def waits(call: ScriptCall) -> bool:
    """Whether ``acks="replicas:N"`` follows ``call`` with ``WAIT`` (its scripts'
    ``@acks`` tags; a fused step: when one of its scripts is plainly ``replicas``)."""
    name = call.name
    if name.startswith(FUSED_PREFIX):
        return _fused_waits(tuple(name[len(FUSED_PREFIX):].split("+")))
    tag = acks_tags().get(name)
    if tag is None:
        raise ScriptSourceError(f"unknown durabilis script {name!r}")
    return tag.waits_for(call.args)


# A script marks the point after its checks and before its first write by
# calling ``ready()``. Run alone, that is a no-op (this prelude); as a body of
# a fused step it suspends the body until every body of the step has passed
# its checks (see ``fused_source``).
_PRELUDE = "local function ready() end\n"


@functools.cache
def sources() -> dict[str, str]:
    """Every script's source by name, as registered (with the ``ready()`` prelude).

    Raises:
        ScriptSourceError: The shipped scripts do not load (see :func:`load`).
    """
    return {name: _PRELUDE + text for name, text in _file_sources().items()}


def lua_directory() -> Path:
    """Where the scripts were loaded from (for ``durabilis doctor``)."""
    root = _package_root()
    if not root.is_dir():
        raise ScriptSourceError("durabilis is installed without its lua/ scripts")
    return Path(str(root))


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
    names: list[str] = []
    for i, c in enumerate(calls):
        counts += (len(c.keys), len(c.args), "1" if gated and gated[i] else "0")
        keys += c.keys
        args += c.args
        names.append(c.name)
    counts += args
    return ScriptCall(FUSED_PREFIX + "+".join(names), keys, counts)


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
    """Registers each script once on one client (sync or async), at its first use
    (the shipped sources are read when the first registry is made).

    Args:
        client: The redis-py client.
        clock_key: Test hook (``durabilis.testing.offset_server_clock``): every
            script reads the server clock plus the offset stored at this key.
    """

    __slots__ = ("_client", "_clock_key", "_fused", "_scripts")

    def __init__(self, client: Any, clock_key: str | None = None) -> None:
        self._client = client
        self._clock_key = clock_key
        self._scripts: dict[str, Any] = {}
        self._fused: dict[tuple[str, ...], Any] = {}  # names -> the fused script
        # The shipped sources read now (once per process), not at a store's first
        # script: reading package data takes importlib's module locks, and a
        # signal handler raising inside the sync driver's open claim step, while
        # one was held, left it held: every thread then hung on its next import.
        sources()

    def fused(self, names: tuple[str, ...]) -> Any:
        """The script :func:`fuse` names for calls of these scripts (as :meth:`get`)."""
        script = self._fused.get(names)
        if script is None:
            script = self._fused[names] = self.get(FUSED_PREFIX + "+".join(names))
        return script

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
