"""What the sync and async stores share: :class:`StoreBase` (a client, a key
space, the scripts; the acknowledgement level and its ``WAIT`` / ``WAITAOF``),
and the bookkeeping of a step (fused replies, waves, ``exc.partial``)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis

from durabilis._acks import PRIMARY, Acks, as_acks
from durabilis._keys import KeySpace
from durabilis._mask import mask_url
from durabilis._scripts import Replies, ScriptCall, ScriptRegistry, fuse, waits
from durabilis._store._errors import map_error
from durabilis.errors import (
    ConfigError,
    CorruptData,
    DurabilisError,
    NotReplicated,
)

WAITAOF_SINCE = (7, 2)
"""The first Redis version with ``WAITAOF`` (``acks="...+fsync"``)."""

WAIT_SINCE = (7, 0)
"""The first Redis version ``acks="replicas:N"`` runs on: from 7.0 every command
(a read, a script that writes nothing) moves its connection's replication offset
to the server's, so ``WAIT`` after a script sent again that finds its work done
waits for everything the server wrote, the first send's write included. Before
7.0 only the connection's own writes counted, and that ``WAIT`` answered at once
(``tests/sentinel/test_sentinel_acks.py``)."""


def _version(info: Mapping[str, Any]) -> tuple[int, ...]:
    """``(major, minor)`` of an ``INFO server`` reply (the oldest node's, per node)."""
    if "redis_version" not in info and info and all(isinstance(v, Mapping)
                                                    for v in info.values()):
        return min(_version(v) for v in info.values())
    text = str(info.get("redis_version", "0"))
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())

def count_in(replies: list[Any], values: frozenset[bytes]) -> int:
    return sum(1 for r in replies if isinstance(r, bytes) and r in values)


def first_error_or(outcomes: list[Any]) -> list[Any]:
    """The replies of calls all tried; or their first failure raised, its
    ``partial`` telling what each call replied (``?`` and ``None``: failed)."""
    for outcome in outcomes:
        if isinstance(outcome, DurabilisError):
            outcome.partial = told(outcomes)
            raise outcome
    return outcomes


def unloaded(replies: Sequence[Any]) -> list[int]:
    """Which calls of a pipeline were not run because their script was unknown
    (NOSCRIPT: run each again the usual way, which loads it)."""
    return [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]


def raise_first(calls: Sequence[ScriptCall], replies: list[Any]) -> None:
    """Once every call was tried: the first failure (in call order) raised, its
    ``partial`` telling what each call replied; nothing when none failed."""
    first: DurabilisError | None = None
    for i, (call, reply) in enumerate(zip(calls, replies, strict=True)):
        failed = reply
        if isinstance(reply, Exception) and not isinstance(reply, DurabilisError):
            failed = replies[i] = map_error(reply, call)
            failed.__cause__ = reply
        if first is None and isinstance(failed, DurabilisError):
            first = failed
    if first is not None:
        first.partial = told(replies)
        raise first


def told(outcomes: Sequence[Any]) -> Replies:
    """Independent calls' outcomes as :class:`Replies`: a reply ``c``, an error
    ``?`` (its value: the call's DurabilisError, else ``None``)."""
    failed = [isinstance(o, BaseException) for o in outcomes]
    return Replies(
        [(o if isinstance(o, DurabilisError) else None) if f else o
         for f, o in zip(failed, outcomes, strict=True)],
        "".join("?" if f else "c" for f in failed),
    )


def _argv(call: ScriptCall) -> list[Any]:
    return [*call.keys, *call.args]


class StoreBase:
    def __init__(self, client: Any, *, url: str, namespace: str, is_cluster: bool) -> None:
        self.client = client
        self.url = url
        self.keys = KeySpace(namespace)
        self.is_cluster = is_cluster
        self.scripts = ScriptRegistry(client)
        self._fuse = not is_cluster
        self.socket_timeout: float | None = None  # (connect() sets it: acks_timeout < it)
        self._acks = PRIMARY  # when a write counts as done (WAIT / WAITAOF after it)
        self._acks_checked = False  # the server's version was found to be recent enough

    @property
    def acks(self) -> str:
        """This store's acknowledgement level as given (``"replicas:1"``)."""
        return self._acks.text

    @property
    def acks_level(self) -> Acks:
        """This store's acknowledgement level, parsed."""
        return self._acks

    def _acking(self, acks: str | Acks, timeout: float | None) -> Any:
        level = as_acks(acks, timeout)
        socket = self.socket_timeout
        if level.waits and socket is not None and level.timeout >= socket:
            raise ConfigError("acks_timeout", (
                f"{level.timeout:g} s must be shorter than the connection's socket_timeout "
                f"({socket:g} s): a WAIT longer than it ends as a lost connection"))
        twin = copy.copy(self)  # the same client, scripts and batching
        twin._acks = level
        twin._acks_checked = False
        return twin

    @property
    def _acks_unchecked(self) -> bool:
        return self._acks.waits and not self._acks_checked

    def _acks_unsupported(self, info: Mapping[str, Any]) -> ConfigError | None:
        """The refusal of this store's ``acks`` by a server too old for it (checked
        once, before the first script: nothing is written when it is refused)."""
        version = _version(info)
        shown = info.get("redis_version", "?") if "redis_version" in info else "?"
        if self._acks.fsync and version < WAITAOF_SINCE:
            return ConfigError("acks", (
                f"{self.acks!r} needs WAITAOF (Redis >= 7.2); this server is Redis {shown}: "
                "use acks without '+fsync', and appendfsync always on the server for a "
                "local fsync of every write"))
        if version < WAIT_SINCE:
            return ConfigError("acks", (
                f"{self.acks!r} needs Redis >= 7.0 (before it, WAIT after a step sent "
                f"again could confirm a write no replica has); this server is Redis {shown}"))
        self._acks_checked = True
        return None

    def _waits(self, call: ScriptCall) -> bool:
        """Whether ``call`` is followed by ``WAIT``: its script's ``@acks`` tag
        (see :func:`durabilis._scripts.waits`)."""
        return self._acks.waits and waits(call)

    def _wait(self) -> tuple[Any, ...]:
        level = self._acks
        if level.fsync:
            return ("WAITAOF", 1, level.replicas, level.wait_ms)
        return ("WAIT", level.replicas, level.wait_ms)

    def _acked_next(
        self, call: ScriptCall, command: tuple[Any, ...], reply: Any, acked: Any, tries: int
    ) -> tuple[str, Any]:
        """What an acked send's replies mean (sync and async twins): ``("done",
        reply)``; ``("again", command)``: NOSCRIPT (nothing ran), send it as EVAL;
        ``("reroute", command)``: a redirect or failover reply on Cluster (nothing
        ran), send it again once the slot map is read again. Raises the script's
        error, or NotReplicated."""
        if isinstance(reply, redis.exceptions.NoScriptError):
            return "again", ("EVAL", *self._eval(call))
        if isinstance(reply, _NOT_RUN) and self.is_cluster and tries < 4:
            return "reroute", command
        if isinstance(reply, Exception):
            raise reply
        self._confirmed(acked, call)
        return "done", reply

    def _confirmed(self, acked: Any, call: ScriptCall | None) -> None:
        """Raise NotReplicated when ``WAIT`` counted fewer replicas than asked for
        (``WAITAOF``: or the primary's own fsync did not happen in time)."""
        local, level = 1, self._acks
        if level.fsync and isinstance(acked, (list, tuple)) and len(acked) == 2:
            local, acked = acked
        if not isinstance(acked, int) or acked < level.replicas or local != 1:
            where = f" (script {call.name})" if call is not None else ""
            if local != 1:
                where += ", not fsynced by the primary"
            if isinstance(acked, Exception):
                where += f" [{type(acked).__name__}: {acked}]"
            raise NotReplicated(
                acked if isinstance(acked, int) else 0, level.replicas, level.wait_ms, where
            )

    @property
    def namespace(self) -> str:
        return self.keys.namespace

    def _evalsha(self, call: ScriptCall) -> list[Any]:
        return ["EVALSHA", self.scripts.get(call.name).sha, len(call.keys), *_argv(call)]

    def _eval(self, call: ScriptCall) -> list[Any]:
        return [self.scripts.get(call.name).script, len(call.keys), *_argv(call)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={mask_url(self.url)!r}, namespace={self.namespace!r})"

    @property
    def fuses(self) -> bool:
        """Whether the scripts of a step run as ONE atomic script (standalone Redis).

        On Cluster the pillars' keys live in different slots: the scripts of a
        step run one after another, and other clients run in between. (The
        fault simulator turns fusing off on a standalone server to drive that
        code path.)
        """
        return self._fuse


_NOT_RUN = (
    redis.exceptions.AskError,  # also MovedError
    redis.exceptions.NoScriptError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ReadOnlyError,
)
"""Error replies that mean the script did not run (sent again the usual way)."""

Gates = Mapping[int, Callable[[Any], bool]]
"""Per call index, a test of its reply: ``True`` means the call refused."""


def fused_command(scripts: Any, calls: Sequence[ScriptCall], gates: Any) -> list[Any]:
    """The ``EVALSHA`` that ``run(fuse(calls, gated))`` sends (``gates``: the
    step's), built without the fused call: the fused script found once per
    names tuple (:meth:`ScriptRegistry.fused`)."""
    keys: list[Any] = []
    argv: list[Any] = [len(calls)]
    args: list[Any] = []
    for i, call in enumerate(calls):
        argv += (len(call.keys), len(call.args), "1" if gates and i in gates else "0")
        keys += call.keys
        args += call.args
    sha = scripts.fused(tuple([call.name for call in calls])).sha
    return ["EVALSHA", sha, len(keys), *keys, *argv, *args]


def fused_call(calls: Sequence[ScriptCall], gates: Any) -> ScriptCall:
    """The fused call of a step (made only when needed: a script to load, an error to name)."""
    return fuse(calls, [bool(gates and i in gates) for i in range(len(calls))])


def fused_replies(reply: Any, n: int) -> Replies:
    try:
        status = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if len(status) == n and len(reply) == n + 1:
            return Replies(reply[1:], status)
    except (TypeError, IndexError, AttributeError, UnicodeDecodeError):
        pass
    raise CorruptData("?", f"unexpected reply of a fused step: {reply!r}"[:300])


def failed_step(exc: DurabilisError, replies: list[Any], n: int) -> None:
    """Note on ``exc`` what the step did before it failed (``exc.partial``)."""
    done = len(replies)
    rest = n - done - 1
    exc.partial = Replies([*replies, None, *([None] * rest)], "c" * done + "?" + "n" * rest)


Waves = Sequence[int]
"""Per call of an unfused step, its wave: the calls of one wave are sent at once
(Cluster: concurrently, to their nodes), and a wave is sent only once every
call of the waves before it has answered."""


def wave_groups(n: int, waves: Waves | None) -> list[list[int]]:
    """The call indices of a step, wave by wave (``None``: one call per wave)."""
    if waves is None:
        return [[i] for i in range(n)]
    if len(waves) != n:
        raise ValueError(f"{len(waves)} waves for {n} calls")
    return [[i for i in range(n) if waves[i] == w] for w in sorted(set(waves))]


class Stepping:
    """The bookkeeping of an unfused step, shared by the sync and async stores:
    what each call did, and whether the step goes on after a wave."""

    __slots__ = ("error", "gates", "replies", "status")

    def __init__(self, n: int, gates: Gates | None) -> None:
        self.replies: list[Any] = [None] * n
        self.status = ["n"] * n
        self.gates = gates
        self.error: DurabilisError | None = None

    def took(self, indices: Sequence[int], outcomes: Sequence[Any]) -> bool:
        """Note one wave's outcomes (a reply, or the DurabilisError its call
        raised); whether the step goes on (no failure, no gated refusal)."""
        refused = False
        for i, out in zip(indices, outcomes, strict=True):
            if isinstance(out, DurabilisError):
                self.status[i] = "?"
                if self.error is None:
                    self.error = out
                continue
            self.replies[i] = out
            if self.gates and i in self.gates and self.gates[i](out):
                self.status[i] = "r"
                refused = True
            else:
                self.status[i] = "c"
        return not refused and self.error is None

    def done(self) -> Replies:
        replies = Replies(self.replies, "".join(self.status))
        if self.error is not None:
            self.error.partial = replies
            raise self.error
        return replies

def sentinels_of(client: Any) -> list[Any]:
    """The clients of the sentinels behind a Sentinel-managed ``client`` (none else)."""
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    return list(getattr(manager, "sentinels", []))
