"""Checkpoints: the delivery manifest that lets a long task resume from its last phase.

A checkpoint is a snapshot of a task's state after one phase. There is one
*current* checkpoint per (task, agent, phase); a new save of the same phase
replaces it, and the replaced record stays readable by id (until its own TTL)
so lineage stays walkable. ``restore`` returns the newest live one.

Every state change is ONE Lua script over keys sharing the ``{ckpt}`` hash tag,
so the namespace-wide ``max_checkpoints`` cap (evicting the oldest live
checkpoint of any task) is atomic, on Redis Cluster too. Nothing expired,
cleared or evicted ever comes back: index entries are trusted only while the
``live`` index says so, and are dropped lazily by the scripts.

``max_lineage_per_task`` bounds the records one task keeps (current and
replaced): the save that would exceed it deletes the task's oldest replaced
records (superseded saves) in the same script, spliced out of the lineage:
every child of a deleted record (found in the children index) gets its parent,
so no lineage ends at a trimmed record, and only records that every lineage
through them can do without (a newer save of their phase below them on each
branch: forks and rewinds included) are deleted, so a resume never runs a
completed phase again. Every lineage walk (``history``, loading a
:class:`TaskRun`) reads, per task it crosses, that task's current checkpoints
plus at most ``MAX_LINEAGE_PER_TASK`` (the largest cap allowed) other records.

Round trips: ``save``/``fork``/``rewind``, ``get_by_id``, ``count`` are one
(``save`` takes a second one, rarely, when the cap must evict a checkpoint, or
the lineage cap delete a record, it did not expect: see ``ckpt_save.lua``);
``restore`` two; ``clear_task`` two per 256 records of the task; ``history`` and
loading a :class:`TaskRun` two plus one per ancestor that is not a current
checkpoint of the task (and one per fork source entered).

Events (logger ``"durabilis"``, docs/production.md): ``durability_checkpoint_saved``
(info: every save, fork and rewind; ``mode`` says which), ``durability_checkpoint_conflict``
(info: a save lost to a concurrent writer), ``durability_checkpoint_evicted``
(debug: the cap evicted checkpoints) and ``durability_checkpoint_lineage_trimmed``
(debug: the lineage cap deleted replaced records of the task).
"""

from __future__ import annotations

import math
import random
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from urllib.parse import unquote

from durabilis import _codec
from durabilis._keys import KeySpace, escape_part
from durabilis._limits import MAX_LINEAGE_PER_TASK, MAX_STORED_TTL_SECONDS, check_limits
from durabilis._log import get_logger
from durabilis._scripts import ScriptCall
from durabilis._steps import IO, Plan, Run, Sleep, adrive, drive, is_async_callable
from durabilis._store import AsyncStore, Store
from durabilis._validate import positive_number as _positive_number
from durabilis.errors import (
    CheckpointConflict,
    CheckpointNotFound,
    ConfigError,
    CorruptData,
    DurabilisError,
    InvalidKey,
    InvalidTtl,
    StorageUnavailable,
)

__all__ = [
    "NO_CHECKPOINT",
    "AsyncCheckpointManager",
    "AsyncTaskRun",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointManager",
    "TaskRun",
]

_log = get_logger()

_HINT = 8
"""Eviction candidates each save brings back for the next one (see ``ckpt_save.lua``)."""
_LINEAGE_HINT_TASKS = 1024
"""Tasks whose lineage-cap candidates one manager remembers (the most recent ones)."""
_MAX_ROUNDS = 32
_SAVE_RESEND_SECONDS = 30.0
"""How long a phase's save is sent again after a lost reply (its ``fn`` ran)."""
_SAVE_BACKOFF = (0.05, 1.0)  # first and longest pause between those tries
_CLEAR_BATCH = 256
_MAX_CLEAR_ROUNDS = 10_000
_MAX_PART_BYTES = 1024
_MAX_TTL_SECONDS = MAX_STORED_TTL_SECONDS


class _NoCheckpoint:
    """The type of :data:`NO_CHECKPOINT`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_CHECKPOINT"


NO_CHECKPOINT: Final = _NoCheckpoint()
"""Pass as ``expected_checkpoint_id`` to require that the task has no live checkpoint yet."""

Expected = str | _NoCheckpoint | None


# --- ids -----------------------------------------------------------------------


class _IdClock:
    """UUIDv7-layout ids (32 hex chars): 48-bit ms, then random bits.

    They sort by creation within one process (a tie in the same millisecond
    adds a random step to the previous id) and roughly across a fleet (client
    clocks). Order that matters ("latest", eviction) comes from a server-side
    sequence, never from the ids.
    """

    __slots__ = ("_last", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def next(self) -> str:
        with self._lock:
            value = ((time.time_ns() // 1_000_000) << 74) | secrets.randbits(74)
            if value <= self._last:
                value = self._last + 1 + secrets.randbits(32)
            self._last = value
        ms, rand = value >> 74, value & ((1 << 74) - 1)
        uuid = (
            ((ms & 0xFFFF_FFFF_FFFF) << 80)
            | (0x7 << 76)
            | ((rand >> 62) << 64)
            | (0b10 << 62)
            | (rand & ((1 << 62) - 1))
        )
        return f"{uuid:032x}"


_ids = _IdClock()


def new_checkpoint_id() -> str:
    """A fresh checkpoint id (32 hex chars, UUIDv7 layout, sorts by creation)."""
    return _ids.next()


# --- public data ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """Settings of the checkpoint pillar (the seed's defaults).

    Attributes:
        default_ttl_seconds: TTL of a checkpoint saved without ``ttl_seconds``,
            and of every fork/rewind copy.
        max_checkpoints: Most live current checkpoints in the namespace (all
            tasks); a save beyond it evicts the oldest ones. Replaced records
            kept for lineage are not counted here (see ``max_lineage_per_task``).
        max_state_bytes: Largest msgpack-encoded state; larger raises
            :class:`~durabilis.PayloadTooLarge` before any Redis call.
        max_lineage_per_task: Most records one task keeps, current and replaced
            (lineage) together: a save beyond it deletes the task's oldest
            replaced records in the same script (at most 32 per save),
            relinking their children to their parent, so lineages and resumes
            stay whole; a record a fork or rewind branch still needs is kept
            (docs/checkpoint.md, the branch rule). Current checkpoints are
            never deleted by it. Lineage walks do not depend on it: they
            read up to ``MAX_LINEAGE_PER_TASK`` other records per task, so
            replicas with different caps resume the same.
    """

    default_ttl_seconds: float = 86400
    max_checkpoints: int = 10_000
    max_state_bytes: int = 1024 * 1024
    max_lineage_per_task: int = 100

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ``ConfigError`` naming the first invalid field."""
        _positive_number("default_ttl_seconds", self.default_ttl_seconds)
        if self.default_ttl_seconds * 1000 < 1:
            raise ConfigError("default_ttl_seconds", "must be at least 0.001 (1 ms)")
        if self.default_ttl_seconds > _MAX_TTL_SECONDS:
            raise ConfigError("default_ttl_seconds", f"must be at most {_MAX_TTL_SECONDS}")
        _positive_number("max_checkpoints", self.max_checkpoints, integer=True)
        _positive_number("max_state_bytes", self.max_state_bytes, integer=True)
        _positive_number("max_lineage_per_task", self.max_lineage_per_task, integer=True)
        check_limits(self)  # every maximum: durabilis._limits


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One snapshot of a task's progress.

    Attributes:
        checkpoint_id: Unique id (32 hex chars).
        task_id: The task it belongs to.
        agent_id: The agent that saved it.
        phase: The phase it completes.
        state: The saved state, as decoded from msgpack (round-trips exactly: docs/layer.md).
        created_at: When it was saved (Redis server clock, UTC).
        expires_at: When it expires (UTC).
        parent_checkpoint_id: What it builds on: for a save, the task's latest
            checkpoint at the time; for a fork or rewind, its source; ``None``
            for the first checkpoint of a task.
    """

    checkpoint_id: str
    task_id: str
    agent_id: str
    phase: str
    state: Any
    created_at: datetime
    expires_at: datetime
    parent_checkpoint_id: str | None = None


@dataclass(frozen=True, slots=True)
class _Entry:
    """A live current checkpoint as listed by the task's index."""

    agent_id: str
    phase: str
    checkpoint_id: str
    sequence: int


# --- pure operations: build calls, decode replies (no I/O) ----------------------


def _part(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidKey(str(value), f"{name} must be a non-empty string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidKey(value, f"{name} is not valid UTF-8 text") from exc
    if size > _MAX_PART_BYTES:
        raise InvalidKey(value, f"{name} is {size} bytes, over the limit of {_MAX_PART_BYTES}")
    return value


def _text(value: Any, key: str, field: str) -> str:
    return _codec.as_text(value, key=key, field=field)


def _corrupt(reply: Any, fallback_key: str) -> CorruptData:
    try:
        return CorruptData(_text(reply[1], fallback_key, "key"), _text(reply[2], "?", "detail"))
    except (TypeError, IndexError, CorruptData):
        return CorruptData(fallback_key, f"unexpected script reply {reply!r}")


def _tag(reply: Any, key: str) -> str:
    try:
        if isinstance(reply, int):
            return "int"
        return _text(reply[0], key, "reply")
    except (TypeError, IndexError, KeyError) as exc:
        raise CorruptData(key, f"unexpected script reply {reply!r}") from exc


class _CheckpointOps:
    """Builds each script call and decodes its reply; shared by both twins.

    The composed layer pipelines :meth:`save` with other pillars' scripts and
    decodes with :meth:`decode_save` (which may hand back a call to run again).
    """

    __slots__ = ("_hint", "_lineage", "config", "keys")

    def __init__(self, keys: KeySpace, config: CheckpointConfig) -> None:
        self.keys = keys
        self.config = config
        self._hint: tuple[str, ...] = ()
        # task -> the replaced ids its next save's lineage cap will delete
        self._lineage: dict[str, tuple[str, ...]] = {}

    # -- keys --

    def rec(self, checkpoint_id: str) -> str:
        return self.keys.ckpt("rec", checkpoint_id)

    def current_index(self, task_id: str) -> str:
        return self.keys.ckpt("task", task_id)

    def replaced_index(self, task_id: str) -> str:
        return self.keys.ckpt("task", task_id, "replaced")

    @property
    def live(self) -> str:
        return self.keys.ckpt("live")

    @property
    def order(self) -> str:
        return self.keys.ckpt("order")

    @property
    def seq(self) -> str:
        return self.keys.ckpt("seq")

    @property
    def children(self) -> str:
        return self.keys.ckpt("kids")

    @property
    def children_expiry(self) -> str:
        return self.keys.ckpt("kids", "exp")

    # -- input --

    def ttl_ms(self, ttl_seconds: float | None) -> int:
        if ttl_seconds is None:
            return max(1, round(self.config.default_ttl_seconds * 1000))
        if (
            isinstance(ttl_seconds, bool)
            or not isinstance(ttl_seconds, (int, float))
            or not math.isfinite(ttl_seconds)
            or ttl_seconds <= 0
        ):
            raise InvalidTtl(ttl_seconds)
        if ttl_seconds > _MAX_TTL_SECONDS:
            raise ConfigError(
                "ttl_seconds", f"must be at most {_MAX_TTL_SECONDS}, got {ttl_seconds}"
            )
        return max(1, round(ttl_seconds * 1000))

    @staticmethod
    def expected_args(expected: Expected) -> list[str]:
        if expected is None:
            return ["0", ""]
        if isinstance(expected, _NoCheckpoint):
            return ["1", ""]
        return ["1", _part("expected_checkpoint_id", expected)]

    # -- save / fork / rewind (ckpt_save) --

    def save(
        self,
        task_id: str,
        agent_id: str,
        phase: str,
        state: Any,
        ttl_seconds: float | None = None,
        *,
        expected: Expected = None,
    ) -> ScriptCall:
        """The ``ckpt_save`` call of a save (validates everything first)."""
        _part("task_id", task_id)
        _part("agent_id", agent_id)
        _part("phase", phase)
        packed = _codec.pack(state, what="checkpoint state", limit=self.config.max_state_bytes)
        return self._save_call(
            mode="save", task_id=task_id, agent_id=agent_id, phase=phase, packed=packed,
            ttl_ms=self.ttl_ms(ttl_seconds), expected=expected, source_id="",
        )

    def fork(self, checkpoint_id: str, new_task_id: str, expected: Expected = None) -> ScriptCall:
        """The ``ckpt_save`` call copying ``checkpoint_id`` into ``new_task_id``."""
        _part("checkpoint_id", checkpoint_id)
        _part("new_task_id", new_task_id)
        return self._save_call(
            mode="fork", task_id=new_task_id, agent_id="", phase="", packed=b"",
            ttl_ms=self.ttl_ms(None), expected=expected, source_id=checkpoint_id,
        )

    def rewind(self, task_id: str, checkpoint_id: str, expected: Expected = None) -> ScriptCall:
        """The ``ckpt_save`` call making a copy of ``checkpoint_id`` current in its task."""
        _part("task_id", task_id)
        _part("checkpoint_id", checkpoint_id)
        return self._save_call(
            mode="rewind", task_id=task_id, agent_id="", phase="", packed=b"",
            ttl_ms=self.ttl_ms(None), expected=expected, source_id=checkpoint_id,
        )

    def _save_call(
        self,
        *,
        mode: str,
        task_id: str,
        agent_id: str,
        phase: str,
        packed: bytes,
        ttl_ms: int,
        expected: Expected,
        source_id: str,
    ) -> ScriptCall:
        cid = new_checkpoint_id()
        keys = [
            self.rec(cid),
            self.current_index(task_id),
            self.replaced_index(task_id),
            self.live,
            self.order,
            self.seq,
            self.rec(source_id) if source_id else self.rec(cid),
            self.children,
            self.children_expiry,
        ]
        caps = f"{self.config.max_checkpoints}|{self.config.max_lineage_per_task}"
        args: list[str | bytes | int] = [
            cid, task_id, agent_id, phase, packed, ttl_ms, caps,
            *self.expected_args(expected), mode, source_id, _HINT,
        ]
        candidates = (*self._hint, *self._lineage.get(task_id, ()))
        return self._with(ScriptCall("ckpt_save", keys, args), cid, candidates)

    def _with(self, call: ScriptCall, cid: str, candidates: Sequence[str]) -> ScriptCall:
        """``call`` with the new id ``cid`` and its ``candidates``: eviction
        candidates (``<id>:<task>``: the record and its task's index) and
        lineage-cap candidates (bare ids, which never hold ``:``: the record)."""
        keys = [self.rec(cid), *call.keys[1:9]]
        for member in candidates:
            victim_id, sep, victim_task = member.partition(":")
            keys.append(self.rec(victim_id))
            if sep:
                keys.append(self.current_index(victim_task))
        args = [cid, *call.args[1:12], *candidates]
        return ScriptCall(call.name, keys, args)

    def _remember_lineage(self, task_id: str, ids: Sequence[str]) -> None:
        """Keep ``ids`` as the lineage candidates of ``task_id``'s next save."""
        self._lineage.pop(task_id, None)
        if not ids:
            return
        while len(self._lineage) >= _LINEAGE_HINT_TASKS:
            try:
                self._lineage.pop(next(iter(self._lineage)), None)
            except (StopIteration, RuntimeError):  # emptied or changed by another thread
                break
        self._lineage[task_id] = tuple(ids)

    def _lineage_ids(self, reply: Any, index: int, rkey: str) -> list[str]:
        """The ids listed at ``reply[index]`` (absent: none)."""
        if len(reply) <= index:
            return []
        return [_text(x, rkey, "lineage id") for x in reply[index]]

    def decode_save(self, call: ScriptCall, reply: Any) -> Checkpoint | ScriptCall:
        """Decode a ``ckpt_save`` reply.

        Returns:
            The new :class:`Checkpoint`, or a call to run (alone) and decode
            again: nothing was written because the eviction candidates were
            stale or the fresh id was taken.

        Raises:
            CheckpointConflict: ``expected_checkpoint_id`` was not the task's latest.
            CheckpointNotFound: The fork/rewind source is not live (or, for a
                rewind, belongs to another task).
            CorruptData: Foreign data at one of the keys.
        """
        rkey = str(call.keys[0])
        cid, task_id, mode = str(call.args[0]), str(call.args[1]), str(call.args[9])
        tag = _tag(reply, rkey)
        if tag == "ok":
            hint = [_text(x, rkey, "hint") for x in reply[8]]
            self._hint = tuple(hint)
            self._remember_lineage(task_id, self._lineage_ids(reply, 10, rkey))
            trimmed = self._lineage_ids(reply, 11, rkey)
            if trimmed:
                _log.debug(
                    "durability_checkpoint_lineage_trimmed",
                    namespace=self.keys.namespace, task_id=task_id, checkpoint_ids=trimmed,
                )
            evicted = [_text(x, rkey, "evicted").partition(":")[0] for x in reply[9]]
            if evicted:
                _log.debug(
                    "durability_checkpoint_evicted",
                    namespace=self.keys.namespace,
                    checkpoint_ids=evicted,
                )
            packed: Any = call.args[4] if mode == "save" else reply[7]
            parent = _text(reply[4], rkey, "parent")
            created_ms = _codec.as_int(reply[2], key=rkey, field="c")
            expires_ms = _codec.as_int(reply[3], key=rkey, field="e")
            cp = Checkpoint(
                checkpoint_id=cid,
                task_id=task_id,
                agent_id=_text(reply[5], rkey, "agent"),
                phase=_text(reply[6], rkey, "phase"),
                state=_codec.unpack(bytes(packed), key=rkey),
                created_at=_codec.as_datetime(reply[2], key=rkey, field="c"),
                expires_at=_codec.as_datetime(reply[3], key=rkey, field="e"),
                parent_checkpoint_id=parent or None,
            )
            _log.info(
                "durability_checkpoint_saved",
                checkpoint_id=cid, task_id=task_id, agent_id=cp.agent_id, phase=cp.phase,
                ttl_seconds=(expires_ms - created_ms) / 1000.0,
                parent_checkpoint_id=cp.parent_checkpoint_id, mode=mode,
            )
            return cp
        if tag == "conflict":
            actual = _text(reply[1], rkey, "actual") or None
            expected = str(call.args[8]) or None
            _log.info(
                "durability_checkpoint_conflict", task_id=task_id, expected=expected, actual=actual
            )
            raise CheckpointConflict(task_id, expected, actual)
        if tag == "notfound":
            source = str(call.args[10])
            where = f" in task {task_id!r}" if mode == "rewind" else ""
            raise CheckpointNotFound(f"no live checkpoint {source!r}{where}")
        if tag == "miss":
            candidates = [_text(x, rkey, "candidate") for x in reply[1]]
            self._hint = tuple(candidates)
            lineage = self._lineage_ids(reply, 2, rkey)
            self._remember_lineage(task_id, lineage)
            return self._with(call, cid, [*candidates, *lineage])
        if tag == "exists":
            return self._with(call, new_checkpoint_id(), [str(a) for a in call.args[12:]])
        raise _corrupt(reply, rkey)

    # -- reads (ckpt_find, ckpt_get) --

    def find(self, task_id: str, agent_id: str | None = None) -> ScriptCall:
        """The ``ckpt_find`` call listing live current checkpoints of a task (or one agent)."""
        _part("task_id", task_id)
        prefix = "" if agent_id is None else escape_part(_part("agent_id", agent_id)) + ":"
        return ScriptCall(
            "ckpt_find", [self.current_index(task_id), self.live, self.order], [prefix, task_id]
        )

    def decode_find(self, call: ScriptCall, reply: Any) -> list[_Entry]:
        rkey = str(call.keys[0])
        if _tag(reply, rkey) != "ok":
            raise _corrupt(reply, rkey)
        flat = reply[1]
        entries = []
        for i in range(0, len(flat), 3):
            field = _text(flat[i], rkey, "field")
            escaped_agent, sep, phase = field.partition(":")
            if not sep or not escaped_agent or not phase:
                raise CorruptData(rkey, f"index field {field!r} is not '<agent>:<phase>'")
            entries.append(
                _Entry(
                    agent_id=unquote(escaped_agent),
                    phase=phase,
                    checkpoint_id=_text(flat[i + 1], rkey, "id"),
                    sequence=_codec.as_int(
                        _text(flat[i + 2], rkey, "sequence"), key=rkey, field="sequence"
                    ),
                )
            )
        return entries

    @staticmethod
    def pick(entries: Sequence[_Entry], agent_id: str, phase: str | None) -> str | None:
        """The id ``restore`` wants: the phase's current one, or the agent's newest."""
        mine = [
            e for e in entries if e.agent_id == agent_id and (phase is None or e.phase == phase)
        ]
        if not mine:
            return None
        return max(mine, key=lambda e: e.sequence).checkpoint_id

    def get(self, checkpoint_id: str, task_id: str = "") -> ScriptCall:
        """The ``ckpt_get`` call reading one record by id.

        With ``task_id`` (a current checkpoint of that task), a record found
        gone is also dropped from the live indexes.
        """
        _part("checkpoint_id", checkpoint_id)
        return ScriptCall(
            "ckpt_get",
            [self.rec(checkpoint_id), self.live, self.order],
            [checkpoint_id, task_id],
        )

    def decode_get(self, checkpoint_id: str, reply: Any) -> Checkpoint | None:
        rkey = self.rec(checkpoint_id)
        tag = _tag(reply, rkey)
        if tag == "none":
            return None
        if tag != "ok":
            raise _corrupt(reply, rkey)
        parent = _text(reply[7], rkey, "pa")
        return Checkpoint(
            checkpoint_id=checkpoint_id,
            task_id=_text(reply[1], rkey, "t"),
            agent_id=_text(reply[2], rkey, "a"),
            phase=_text(reply[3], rkey, "p"),
            state=_codec.unpack(bytes(reply[4]), key=rkey),
            created_at=_codec.as_datetime(reply[5], key=rkey, field="c"),
            expires_at=_codec.as_datetime(reply[6], key=rkey, field="e"),
            parent_checkpoint_id=parent or None,
        )

    def not_found(self, task_id: str, agent_id: str, phase: str | None) -> CheckpointNotFound:
        what = f"phase {phase!r}" if phase is not None else "any phase"
        return CheckpointNotFound(
            f"no live checkpoint for task {task_id!r}, agent {agent_id!r}, {what}"
        )

    def walk(
        self,
        agent_id: str,
        entries: Sequence[_Entry],
        replies: Sequence[Any],
        limit: int | None,
        fetches: int | None = None,
    ) -> _Walk:
        """A lineage walk from the agent's newest current checkpoint.

        ``replies`` are the ``ckpt_get`` replies for ``entries``, in order;
        ``fetches``: how many more records the walk may ask for (``None``: any).
        """
        known: dict[str, Checkpoint] = {}
        for entry, reply in zip(entries, replies, strict=True):
            cp = self.decode_get(entry.checkpoint_id, reply)
            if cp is not None:
                known[entry.checkpoint_id] = cp
        mine = [e for e in entries if e.agent_id == agent_id and e.checkpoint_id in known]
        start = max(mine, key=lambda e: e.sequence).checkpoint_id if mine else None
        return _Walk(start, known, limit, fetches)

    def save_plan(self, call: ScriptCall) -> Plan[Checkpoint]:
        """Send a save until it lands (stale eviction hints make it send itself again)."""
        for _ in range(_MAX_ROUNDS):
            out = self.decode_save(call, (yield call))
            if isinstance(out, Checkpoint):
                return out
            call = out
        raise DurabilisError("checkpoint save kept racing other writers' evictions; try again")

    def kept_save_plan(self, call: ScriptCall) -> Plan[Checkpoint]:
        """A task run's save of a phase whose ``fn`` ran: shielded (a
        cancellation waits for it), and sent again, with backoff, for
        ``_SAVE_RESEND_SECONDS`` after a lost reply. The same id is sent again,
        so a try that landed is recognised (``exists``, or a conflict naming
        it) and read back, never taken for another writer's. One deleted
        before the resend (a cap, ``clear_task``) is saved again: a save made
        then (docs/checkpoint.md)."""
        unsure: set[str] = set()  # ids of tries whose reply was lost
        check: str | None = None  # an id that landed: read it back
        until: float | None = None
        delay = _SAVE_BACKOFF[0]
        rounds = 0
        while True:
            cid = str(call.args[0])
            try:
                reply = (yield IO([self.get(check) if check else call], shield=True))[0]
            except StorageUnavailable as exc:  # (a script's own error is not sent again)
                now = time.monotonic()
                until = now + _SAVE_RESEND_SECONDS if until is None else until
                if now >= until:
                    raise
                unsure.add(cid)
                _log.warning("durability_checkpoint_save_retry", checkpoint_id=cid,
                             error=f"{type(exc).__name__}: {exc}", delay_seconds=round(delay, 3))
                yield Sleep(delay * (0.5 + random.random() / 2), shield=True)
                delay = min(delay * 2, _SAVE_BACKOFF[1])
                continue
            if check:
                saved = self.decode_get(check, reply)
                if saved is None:
                    raise DurabilisError(f"checkpoint {check!r} was saved, and gone before "
                                         "its lost reply could be read back")
                _log.info("durability_checkpoint_saved", checkpoint_id=check,
                          task_id=saved.task_id, agent_id=saved.agent_id, phase=saved.phase,
                          parent_checkpoint_id=saved.parent_checkpoint_id, mode="save",
                          read_back=True)
                return saved
            tag = _tag(reply, str(call.keys[0]))
            if cid in unsure and (tag == "exists" or (
                    tag == "conflict" and _text(reply[1], str(call.keys[0]), "actual") == cid)):
                check = cid  # an earlier try of this very save landed
                continue
            out = self.decode_save(call, reply)
            if isinstance(out, Checkpoint):
                return out
            rounds += 1
            if rounds >= _MAX_ROUNDS:
                raise DurabilisError(
                    "checkpoint save kept racing other writers' evictions; try again")
            call = out

    def lineage_limit(self, limit: int | None) -> int | None:
        """How many records a lineage walk follows: ``limit`` (``None``: the
        whole lineage, within the read bound of :meth:`walk_plan`)."""
        return None if limit is None else max(0, limit)

    def lineage_entries(
        self, agent_id: str, entries: Sequence[_Entry], limit: int | None
    ) -> list[_Entry]:
        """The current entries a walk from the agent's newest checkpoint reads up front.

        Only entries no newer than the agent's newest can be on its lineage (a
        parent is always older), and the walk follows at most ``limit``
        records: the newest ``limit`` of those, newest first.
        """
        mine = [e.sequence for e in entries if e.agent_id == agent_id]
        if not mine or (limit is not None and limit <= 0):
            return []
        top = max(mine)
        older = sorted((e for e in entries if e.sequence <= top), key=lambda e: -e.sequence)
        return older if limit is None else older[:limit]

    def walk_plan(
        self, task_id: str, agent_id: str, limit: int | None
    ) -> Plan[tuple[list[_Entry], _Walk]]:
        """Locate the task's checkpoints, then follow the agent's lineage.

        Follows at most ``limit`` records (``None``: the whole lineage): the
        task's current ones up front (one round trip), then its ancestors one
        round trip each. The read bound never depends on this manager's own
        ``max_lineage_per_task`` (a task may have been written under a larger
        one, and a fork's lineage holds its source's records too): per task
        the walk enters, it reads at most that task's current checkpoints plus
        ``MAX_LINEAGE_PER_TASK`` (the largest cap allowed) other records, and
        entering another task (a fork source) costs one more round trip that
        counts the source's current checkpoints, so they never use up the
        fork's reads.
        """
        find = self.find(task_id)
        _part("agent_id", agent_id)
        entries = self.decode_find(find, (yield find))
        bound = self.lineage_limit(limit)
        ahead = self.lineage_entries(agent_id, entries, bound)
        gets = [self.get(e.checkpoint_id, task_id) for e in ahead]
        replies = list((yield IO(gets))) if gets else []
        walk = self.walk(agent_id, ahead, replies, bound)
        reads = {task_id: MAX_LINEAGE_PER_TASK}  # per task: records it may still read
        while (cid := walk.need()) is not None:
            cp = self.decode_get(cid, (yield self.get(cid)))
            if cp is not None:
                left = reads.get(cp.task_id)
                if left is None:  # a fork source: its current ones are not the fork's reads
                    other = self.find(cp.task_id)
                    left = MAX_LINEAGE_PER_TASK + len(self.decode_find(other, (yield other)))
                reads[cp.task_id] = left - 1
                if left <= 0:
                    cp = None  # the read bound: the walk ends here
            walk.feed(cid, cp)
        return entries, walk

    def current(self, entries: Sequence[_Entry], replies: Sequence[Any]) -> list[Checkpoint]:
        """The records of ``entries`` (their ``ckpt_get`` replies, in order), newest first.

        Records found gone meanwhile are left out.
        """
        found: list[tuple[int, Checkpoint]] = []
        for entry, reply in zip(entries, replies, strict=True):
            cp = self.decode_get(entry.checkpoint_id, reply)
            if cp is not None:
                found.append((entry.sequence, cp))
        found.sort(key=lambda item: item[0], reverse=True)
        return [cp for _, cp in found]

    # -- count, clear --

    def count(self) -> ScriptCall:
        return ScriptCall("ckpt_count", [self.live, self.order], [])

    def decode_count(self, reply: Any) -> int:
        if isinstance(reply, int):
            return reply
        raise _corrupt(reply, self.live)

    def clear(self, task_id: str, ids: Sequence[str]) -> ScriptCall:
        """One ``ckpt_clear`` pass deleting ``ids`` (those that belong to the task)."""
        _part("task_id", task_id)
        keys = [
            self.current_index(task_id),
            self.replaced_index(task_id),
            self.live,
            self.order,
            self.children,
            self.children_expiry,
            *(self.rec(i) for i in ids),
        ]
        return ScriptCall("ckpt_clear", keys, [*ids, _CLEAR_BATCH, task_id])

    def decode_clear(self, call: ScriptCall, reply: Any) -> tuple[int, list[str]]:
        """``(current checkpoints removed, ids still to delete)``."""
        rkey = str(call.keys[0])
        if _tag(reply, rkey) != "ok":
            raise _corrupt(reply, rkey)
        return int(reply[1]), [_text(x, rkey, "id") for x in reply[2]]


class _Walk:
    """Follows ``parent_checkpoint_id`` from a start, asking for records it lacks.

    Pure: the shells loop ``while (cid := walk.need()): walk.feed(cid, fetched)``.
    The walk ends at the first ancestor that is gone (expired, evicted,
    cleared), at ``limit`` records, after ``fetches`` records asked for, or on
    a cycle (corrupt data).
    """

    __slots__ = ("_fetches", "_known", "_limit", "_next", "chain")

    def __init__(
        self,
        start: str | None,
        known: dict[str, Checkpoint],
        limit: int | None,
        fetches: int | None = None,
    ) -> None:
        self.chain: list[Checkpoint] = []
        self._known = known
        self._limit = limit
        self._fetches = fetches
        self._next = start
        self._advance()

    def need(self) -> str | None:
        """The id of the next record to fetch, or ``None`` when the walk is over."""
        if self._next is not None and self._fetches is not None and self._fetches <= 0:
            self._next = None
        return self._next

    def feed(self, checkpoint_id: str, checkpoint: Checkpoint | None) -> None:
        """Hand over the record asked for by :meth:`need` (``None``: it is gone)."""
        if self._fetches is not None:
            self._fetches -= 1
        if checkpoint is None:
            self._next = None
            return
        self._known[checkpoint_id] = checkpoint
        self._advance()

    def _advance(self) -> None:
        seen = {cp.checkpoint_id for cp in self.chain}
        while self._next is not None:
            if self._limit is not None and len(self.chain) >= self._limit:
                self._next = None
                return
            if self._next in seen:
                self._next = None
                return
            cp = self._known.get(self._next)
            if cp is None:
                return
            self.chain.append(cp)
            seen.add(cp.checkpoint_id)
            self._next = cp.parent_checkpoint_id


def _call(fn: Callable[[], Any]) -> Any:
    return fn()


async def _call_async(fn: Callable[[], Awaitable[Any]]) -> Any:
    return await fn()


class _RunPlan:
    """The bookkeeping of one :class:`TaskRun`, shared by both twins (no I/O)."""

    __slots__ = (
        "agent_id", "completed", "exclusive", "expected", "loaded", "ops", "task_id", "ttl_seconds",
    )

    def __init__(
        self,
        ops: _CheckpointOps,
        task_id: str,
        agent_id: str,
        ttl_seconds: float | None,
        exclusive: bool,
    ) -> None:
        _part("task_id", task_id)
        _part("agent_id", agent_id)
        if ttl_seconds is not None:
            ops.ttl_ms(ttl_seconds)
        self.ops = ops
        self.task_id = task_id
        self.agent_id = agent_id
        self.ttl_seconds = ttl_seconds
        self.exclusive = exclusive
        self.completed: dict[str, Checkpoint] = {}
        self.expected: Expected = None
        self.loaded = False

    def load(self, entries: Sequence[_Entry], walk: _Walk) -> None:
        """Completed phases: the agent's records on the lineage of its newest checkpoint.

        Walking the lineage (rather than listing current checkpoints) makes a
        ``rewind`` to an earlier phase re-run the phases after it.
        """
        self.completed = {}
        for cp in walk.chain:
            if cp.agent_id == self.agent_id and cp.phase not in self.completed:
                self.completed[cp.phase] = cp
        if self.exclusive:
            newest = max(entries, key=lambda e: e.sequence) if entries else None
            self.expected = newest.checkpoint_id if newest else NO_CHECKPOINT
        self.loaded = True

    def save_call(self, phase: str, state: Any) -> ScriptCall:
        return self.ops.save(
            self.task_id, self.agent_id, phase, state, self.ttl_seconds, expected=self.expected
        )

    def load_plan(self) -> Plan[None]:
        entries, walk = yield from self.ops.walk_plan(self.task_id, self.agent_id, None)
        self.load(entries, walk)

    def phase_plan(self, name: str, fn: Callable[[], Any]) -> Plan[Any]:
        """One phase: skipped when done, else run, then checkpointed (raises what fn raised).

        The phase name is checked before ``fn`` runs; the state can only be
        checked after (a state that cannot be saved raises, and the phase runs
        again on resume).
        """
        _part("phase", name)
        if not self.loaded:
            yield from self.load_plan()
        done = self.completed.get(name)
        if done is not None:
            return done.state
        ok, state = yield Run(_call_async if is_async_callable(fn) else _call, fn)
        if not ok:
            raise state
        checkpoint = yield from self.ops.kept_save_plan(self.save_call(name, state))
        return self.saved(checkpoint)

    def saved(self, checkpoint: Checkpoint) -> Any:
        self.completed[checkpoint.phase] = checkpoint
        if self.exclusive:
            self.expected = checkpoint.checkpoint_id
        return checkpoint.state


# --- the twins: thin I/O shells ---------------------------------------------------


class CheckpointManager:
    """Saves and restores checkpoints shared by every process using the store.

    Args:
        store: From :func:`durabilis.connect`.
        config: Settings; the seed's defaults when omitted.
    """

    def __init__(self, store: Store, config: CheckpointConfig | None = None) -> None:
        self.store = store
        self.config = config or CheckpointConfig()
        self._ops = _CheckpointOps(store.keys, self.config)

    def _save(self, call: ScriptCall) -> Checkpoint:
        return drive(self._ops.save_plan(call), self.store)

    def save(
        self,
        task_id: str,
        agent_id: str,
        phase: str,
        state: Any,
        ttl_seconds: float | None = None,
        *,
        expected_checkpoint_id: Expected = None,
    ) -> Checkpoint:
        """Save ``state`` as the current checkpoint of (task, agent, phase).

        Args:
            task_id: The task.
            agent_id: The agent saving it.
            phase: The phase it completes; replaces that phase's current checkpoint.
            state: Any msgpack-encodable value.
            ttl_seconds: Lifetime; ``None`` means ``config.default_ttl_seconds``.
            expected_checkpoint_id: What this save builds on: the id the task's
                latest checkpoint must still be (or :data:`NO_CHECKPOINT`: none
                yet). ``None``: no check, last writer wins (the seed).

        Returns:
            The new checkpoint; its parent is the task's latest at the time.

        Raises:
            InvalidTtl: ``ttl_seconds`` is zero or negative (before any I/O).
            InvalidKey: Empty or over-long ids. PayloadTooLarge / InvalidPayload:
                the state (before any I/O).
            CheckpointConflict: The task's latest is not ``expected_checkpoint_id``.
            CorruptData: Foreign data at a key. StorageUnavailable: Redis down.
        """
        return self._save(
            self._ops.save(
                task_id, agent_id, phase, state, ttl_seconds, expected=expected_checkpoint_id
            )
        )

    def restore(self, task_id: str, agent_id: str, phase: str | None = None) -> Checkpoint:
        """The agent's current checkpoint of ``phase``, or its newest of any phase.

        Raises:
            CheckpointNotFound: No live checkpoint matches.
        """
        find = self._ops.find(task_id, agent_id)
        if phase is not None:
            _part("phase", phase)
        for _ in range(_MAX_ROUNDS):
            cid = self._ops.pick(self._ops.decode_find(find, self.store.run(find)), agent_id, phase)
            if cid is None:
                break
            cp = self._ops.decode_get(cid, self.store.run(self._ops.get(cid, task_id)))
            if cp is not None:
                return cp
        raise self._ops.not_found(task_id, agent_id, phase)

    def get_by_id(self, checkpoint_id: str) -> Checkpoint:
        """A checkpoint by id: current, or replaced but not yet expired.

        Raises:
            CheckpointNotFound: Unknown, expired, evicted or cleared.
        """
        cp = self._ops.decode_get(checkpoint_id, self.store.run(self._ops.get(checkpoint_id)))
        if cp is None:
            raise CheckpointNotFound(f"no live checkpoint {checkpoint_id!r}")
        return cp

    def fork(
        self, checkpoint_id: str, new_task_id: str, *, expected_checkpoint_id: Expected = None
    ) -> Checkpoint:
        """Copy a checkpoint (agent, phase, state) into ``new_task_id``, where it is current.

        The copy has a new id, ``parent_checkpoint_id=checkpoint_id`` and the
        default TTL.

        Raises:
            CheckpointNotFound: The source is not live.
            CheckpointConflict: As :meth:`save`, for ``new_task_id``.
        """
        return self._save(self._ops.fork(checkpoint_id, new_task_id, expected_checkpoint_id))

    def rewind(
        self, task_id: str, checkpoint_id: str, *, expected_checkpoint_id: Expected = None
    ) -> Checkpoint:
        """Make a copy of an earlier checkpoint of the task its newest (see :meth:`fork`).

        Raises:
            CheckpointNotFound: The checkpoint is not live or belongs to another task.
        """
        return self._save(self._ops.rewind(task_id, checkpoint_id, expected_checkpoint_id))

    def clear_task(self, task_id: str) -> int:
        """Delete every checkpoint of the task (current and replaced).

        Returns:
            How many live current checkpoints were removed.
        """
        removed, ids = 0, list[str]()
        for _ in range(_MAX_CLEAR_ROUNDS):
            call = self._ops.clear(task_id, ids)
            n, ids = self._ops.decode_clear(call, self.store.run(call))
            removed += n
            if not ids:
                return removed
        raise DurabilisError(f"clear_task({task_id!r}) kept racing concurrent saves")

    def count(self) -> int:
        """How many current checkpoints are live in the namespace."""
        return self._ops.decode_count(self.store.run(self._ops.count()))

    def _walk(self, task_id: str, agent_id: str, limit: int | None) -> tuple[list[_Entry], _Walk]:
        return drive(self._ops.walk_plan(task_id, agent_id, limit), self.store)

    def history(self, task_id: str, agent_id: str, *, limit: int | None = None) -> list[Checkpoint]:
        """The lineage of the agent's newest checkpoint, newest first.

        Follows ``parent_checkpoint_id`` through replaced records, other
        agents' saves of the task and fork sources; ends at the first ancestor
        that is gone (expired, evicted, cleared). Empty when the agent has no
        live checkpoint in the task.

        Args:
            limit: At most this many records. Without it, the walk reads,
                per task it crosses, that task's current checkpoints plus at
                most ``MAX_LINEAGE_PER_TASK`` other records.
        """
        return self._walk(task_id, agent_id, limit)[1].chain

    def list_current(self, task_id: str, agent_id: str | None = None) -> list[Checkpoint]:
        """The task's live current checkpoints (one per agent and phase), newest first.

        Two round trips (locate, then read the records). Nothing is changed
        except that index entries of expired checkpoints are dropped on the way.

        Args:
            task_id: The task.
            agent_id: Only this agent's checkpoints; every agent's when ``None``.

        Raises:
            InvalidKey: An empty or over-long id (before any I/O).
            CorruptData: Foreign data at a key. StorageUnavailable: Redis down.
        """
        find = self._ops.find(task_id, agent_id)
        entries = self._ops.decode_find(find, self.store.run(find))
        gets = [self._ops.get(e.checkpoint_id, task_id) for e in entries]
        return self._ops.current(entries, self.store.run_many(gets) if gets else [])

    def task(
        self,
        task_id: str,
        agent_id: str,
        *,
        ttl_seconds: float | None = None,
        exclusive: bool = True,
    ) -> TaskRun:
        """A resumable run of a task: ``with manager.task(t, a) as run: run.phase(...)``.

        Args:
            ttl_seconds: TTL of each phase's checkpoint (default TTL when ``None``).
            exclusive: Each save states what it builds on, so a second process
                running the same task gets :class:`~durabilis.CheckpointConflict`
                instead of interleaving its saves.
        """
        return TaskRun(self, _RunPlan(self._ops, task_id, agent_id, ttl_seconds, exclusive))


class TaskRun:
    """One run of a task that skips the phases a previous run completed.

    Get one from :meth:`CheckpointManager.task`.
    """

    def __init__(self, manager: CheckpointManager, plan: _RunPlan) -> None:
        self._manager = manager
        self._plan = plan

    def load(self) -> TaskRun:
        """Read which phases are completed (done by ``with`` and by the first ``phase``).

        Reads the task's current checkpoints plus the other records of the
        lineage (at most ``MAX_LINEAGE_PER_TASK`` per task it crosses).
        """
        drive(self._plan.load_plan(), self._manager.store)
        return self

    def __enter__(self) -> TaskRun:
        return self.load()

    def __exit__(self, *exc: object) -> None:
        return None

    @property
    def completed(self) -> dict[str, Checkpoint]:
        """The completed phases' checkpoints by phase name."""
        return dict(self._plan.completed)

    def phase(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` and checkpoint its result as phase ``name``, unless already done.

        Returns:
            The phase's state as saved (decoded from msgpack, on both paths, so
            a resumed run sees exactly what a fresh one did).

        Raises:
            CheckpointConflict: Another run of the task saved meanwhile (exclusive runs).
        """
        return drive(self._plan.phase_plan(name, fn), self._manager.store)


class AsyncCheckpointManager:
    """The asyncio twin of :class:`CheckpointManager` (same methods, awaited)."""

    def __init__(self, store: AsyncStore, config: CheckpointConfig | None = None) -> None:
        self.store = store
        self.config = config or CheckpointConfig()
        self._ops = _CheckpointOps(store.keys, self.config)

    async def _save(self, call: ScriptCall) -> Checkpoint:
        return await adrive(self._ops.save_plan(call), self.store)

    async def save(
        self,
        task_id: str,
        agent_id: str,
        phase: str,
        state: Any,
        ttl_seconds: float | None = None,
        *,
        expected_checkpoint_id: Expected = None,
    ) -> Checkpoint:
        """See :meth:`CheckpointManager.save`."""
        return await self._save(
            self._ops.save(
                task_id, agent_id, phase, state, ttl_seconds, expected=expected_checkpoint_id
            )
        )

    async def restore(self, task_id: str, agent_id: str, phase: str | None = None) -> Checkpoint:
        """See :meth:`CheckpointManager.restore`."""
        find = self._ops.find(task_id, agent_id)
        if phase is not None:
            _part("phase", phase)
        for _ in range(_MAX_ROUNDS):
            entries = self._ops.decode_find(find, await self.store.run(find))
            cid = self._ops.pick(entries, agent_id, phase)
            if cid is None:
                break
            cp = self._ops.decode_get(cid, await self.store.run(self._ops.get(cid, task_id)))
            if cp is not None:
                return cp
        raise self._ops.not_found(task_id, agent_id, phase)

    async def get_by_id(self, checkpoint_id: str) -> Checkpoint:
        """See :meth:`CheckpointManager.get_by_id`."""
        reply = await self.store.run(self._ops.get(checkpoint_id))
        cp = self._ops.decode_get(checkpoint_id, reply)
        if cp is None:
            raise CheckpointNotFound(f"no live checkpoint {checkpoint_id!r}")
        return cp

    async def fork(
        self, checkpoint_id: str, new_task_id: str, *, expected_checkpoint_id: Expected = None
    ) -> Checkpoint:
        """See :meth:`CheckpointManager.fork`."""
        return await self._save(
            self._ops.fork(checkpoint_id, new_task_id, expected_checkpoint_id)
        )

    async def rewind(
        self, task_id: str, checkpoint_id: str, *, expected_checkpoint_id: Expected = None
    ) -> Checkpoint:
        """See :meth:`CheckpointManager.rewind`."""
        return await self._save(self._ops.rewind(task_id, checkpoint_id, expected_checkpoint_id))

    async def clear_task(self, task_id: str) -> int:
        """See :meth:`CheckpointManager.clear_task`."""
        removed, ids = 0, list[str]()
        for _ in range(_MAX_CLEAR_ROUNDS):
            call = self._ops.clear(task_id, ids)
            n, ids = self._ops.decode_clear(call, await self.store.run(call))
            removed += n
            if not ids:
                return removed
        raise DurabilisError(f"clear_task({task_id!r}) kept racing concurrent saves")

    async def count(self) -> int:
        """See :meth:`CheckpointManager.count`."""
        return self._ops.decode_count(await self.store.run(self._ops.count()))

    async def _walk(
        self, task_id: str, agent_id: str, limit: int | None
    ) -> tuple[list[_Entry], _Walk]:
        return await adrive(self._ops.walk_plan(task_id, agent_id, limit), self.store)

    async def history(
        self, task_id: str, agent_id: str, *, limit: int | None = None
    ) -> list[Checkpoint]:
        """See :meth:`CheckpointManager.history`."""
        return (await self._walk(task_id, agent_id, limit))[1].chain

    async def list_current(self, task_id: str, agent_id: str | None = None) -> list[Checkpoint]:
        """See :meth:`CheckpointManager.list_current`."""
        find = self._ops.find(task_id, agent_id)
        entries = self._ops.decode_find(find, await self.store.run(find))
        gets = [self._ops.get(e.checkpoint_id, task_id) for e in entries]
        return self._ops.current(entries, await self.store.run_many(gets) if gets else [])

    def task(
        self,
        task_id: str,
        agent_id: str,
        *,
        ttl_seconds: float | None = None,
        exclusive: bool = True,
    ) -> AsyncTaskRun:
        """See :meth:`CheckpointManager.task`: ``async with manager.task(t, a) as run:``."""
        return AsyncTaskRun(self, _RunPlan(self._ops, task_id, agent_id, ttl_seconds, exclusive))


class AsyncTaskRun:
    """The asyncio twin of :class:`TaskRun`; ``fn`` may be sync or async."""

    def __init__(self, manager: AsyncCheckpointManager, plan: _RunPlan) -> None:
        self._manager = manager
        self._plan = plan

    async def load(self) -> AsyncTaskRun:
        """See :meth:`TaskRun.load`."""
        await adrive(self._plan.load_plan(), self._manager.store)
        return self

    async def __aenter__(self) -> AsyncTaskRun:
        return await self.load()

    async def __aexit__(self, *exc: object) -> None:
        return None

    @property
    def completed(self) -> dict[str, Checkpoint]:
        """See :attr:`TaskRun.completed`."""
        return dict(self._plan.completed)

    async def phase(self, name: str, fn: Callable[[], Any]) -> Any:
        """See :meth:`TaskRun.phase`: an ``async def`` ``fn`` is awaited on the loop, a
        plain one runs in a worker thread (an awaitable it returns is awaited)."""
        return await adrive(self._plan.phase_plan(name, fn), self._manager.store)
