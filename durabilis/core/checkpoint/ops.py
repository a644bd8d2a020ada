"""Checkpoint script calls and reply decoders (no I/O).

:class:`CheckpointCalls` builds each script call (which script, KEYS, ARGV)
and decodes its reply; the plans that send them are in
:mod:`durabilis.core.checkpoint.plans`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from durabilis import _codec
from durabilis._scripts import ScriptCall
from durabilis.core.checkpoint.types import (
    CLEAR_BATCH,
    HINT,
    LINEAGE_HINT_TASKS,
    MAX_TTL_SECONDS,
    Checkpoint,
    CheckpointConfig,
    CheckpointEntry,
    Expected,
    IdClock,
    NoCheckpoint,
    part,
)
from durabilis.core.keyparts import escape_part
from durabilis.core.steps import Log, SilentLog
from durabilis.errors import (
    CheckpointConflict,
    CheckpointNotFound,
    ConfigError,
    CorruptData,
    InvalidTtl,
)

if TYPE_CHECKING:
    from durabilis._keys import KeySpace


def reply_text(value: Any, key: str, field: str) -> str:
    return _codec.as_text(value, key=key, field=field)


def corrupt_reply(reply: Any, fallback_key: str) -> CorruptData:
    try:
        return CorruptData(
            reply_text(reply[1], fallback_key, "key"), reply_text(reply[2], "?", "detail")
        )
    except (TypeError, IndexError, CorruptData):
        return CorruptData(fallback_key, f"unexpected script reply {reply!r}")


def reply_tag(reply: Any, key: str) -> str:
    try:
        if isinstance(reply, int):
            return "int"
        return reply_text(reply[0], key, "reply")
    except (TypeError, IndexError, KeyError) as exc:
        raise CorruptData(key, f"unexpected script reply {reply!r}") from exc


class Walk:
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


class CheckpointCalls:
    """Builds each script call and decodes its reply; shared by both twins.

    The composed layer pipelines :meth:`save` with other pillars' scripts and
    decodes with :meth:`decode_save` (which may hand back a call to run again).
    """

    __slots__ = ("_clock", "_hint", "_lineage", "_log", "_new_id", "config", "keys")

    def __init__(
        self,
        keys: KeySpace,
        config: CheckpointConfig,
        *,
        new_id: Callable[[], str] | None = None,
        log: Log | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``new_id``: fresh checkpoint ids (the shell's thread-safe id clock);
        ``log``: where saves, conflicts and evictions are logged; ``clock``:
        monotonic seconds."""
        self._new_id = new_id if new_id is not None else IdClock().next
        self._log: Log = log if log is not None else SilentLog()
        self._clock = clock
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
        if ttl_seconds > MAX_TTL_SECONDS:
            raise ConfigError(
                "ttl_seconds", f"must be at most {MAX_TTL_SECONDS}, got {ttl_seconds}"
            )
        return max(1, round(ttl_seconds * 1000))

    @staticmethod
    def expected_args(expected: Expected) -> list[str]:
        if expected is None:
            return ["0", ""]
        if isinstance(expected, NoCheckpoint):
            return ["1", ""]
        return ["1", part("expected_checkpoint_id", expected)]

    # -- save / fork / rewind (ckpt_save) --

    def save(
        self, task_id: str, agent_id: str, phase: str, state: Any,
        ttl_seconds: float | None = None, *, expected: Expected = None,
    ) -> ScriptCall:
        """The ``ckpt_save`` call of a save (validates everything first)."""
        part("task_id", task_id)
        part("agent_id", agent_id)
        part("phase", phase)
        packed = _codec.pack(state, what="checkpoint state", limit=self.config.max_state_bytes)
        return self._save_call(
            mode="save", task_id=task_id, agent_id=agent_id, phase=phase, packed=packed,
            ttl_ms=self.ttl_ms(ttl_seconds), expected=expected, source_id="",
        )

    def fork(self, checkpoint_id: str, new_task_id: str, expected: Expected = None) -> ScriptCall:
        """The ``ckpt_save`` call copying ``checkpoint_id`` into ``new_task_id``."""
        part("checkpoint_id", checkpoint_id)
        part("new_task_id", new_task_id)
        return self._save_call(
            mode="fork", task_id=new_task_id, agent_id="", phase="", packed=b"",
            ttl_ms=self.ttl_ms(None), expected=expected, source_id=checkpoint_id,
        )

    def rewind(self, task_id: str, checkpoint_id: str, expected: Expected = None) -> ScriptCall:
        """The ``ckpt_save`` call making a copy of ``checkpoint_id`` current in its task."""
        part("task_id", task_id)
        part("checkpoint_id", checkpoint_id)
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
        cid = self._new_id()
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
            *self.expected_args(expected), mode, source_id, HINT,
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
        while len(self._lineage) >= LINEAGE_HINT_TASKS:
            try:
                self._lineage.pop(next(iter(self._lineage)), None)
            except (StopIteration, RuntimeError):  # emptied or changed by another thread
                break
        self._lineage[task_id] = tuple(ids)

    def _lineage_ids(self, reply: Any, index: int, rkey: str) -> list[str]:
        """The ids listed at ``reply[index]`` (absent: none)."""
        if len(reply) <= index:
            return []
        return [reply_text(x, rkey, "lineage id") for x in reply[index]]

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
        tag = reply_tag(reply, rkey)
        if tag == "ok":
            hint = [reply_text(x, rkey, "hint") for x in reply[8]]
            self._hint = tuple(hint)
            self._remember_lineage(task_id, self._lineage_ids(reply, 10, rkey))
            trimmed = self._lineage_ids(reply, 11, rkey)
            if trimmed:
                self._log.debug(
                    "durability_checkpoint_lineage_trimmed",
                    namespace=self.keys.namespace, task_id=task_id, checkpoint_ids=trimmed,
                )
            evicted = [reply_text(x, rkey, "evicted").partition(":")[0] for x in reply[9]]
            if evicted:
                self._log.debug(
                    "durability_checkpoint_evicted",
                    namespace=self.keys.namespace,
                    checkpoint_ids=evicted,
                )
            packed: Any = call.args[4] if mode == "save" else reply[7]
            parent = reply_text(reply[4], rkey, "parent")
            created_ms = _codec.as_int(reply[2], key=rkey, field="c")
            expires_ms = _codec.as_int(reply[3], key=rkey, field="e")
            cp = Checkpoint(
                checkpoint_id=cid,
                task_id=task_id,
                agent_id=reply_text(reply[5], rkey, "agent"),
                phase=reply_text(reply[6], rkey, "phase"),
                state=_codec.unpack(bytes(packed), key=rkey),
                created_at=_codec.as_datetime(reply[2], key=rkey, field="c"),
                expires_at=_codec.as_datetime(reply[3], key=rkey, field="e"),
                parent_checkpoint_id=parent or None,
            )
            self._log.info(
                "durability_checkpoint_saved",
                checkpoint_id=cid, task_id=task_id, agent_id=cp.agent_id, phase=cp.phase,
                ttl_seconds=(expires_ms - created_ms) / 1000.0,
                parent_checkpoint_id=cp.parent_checkpoint_id, mode=mode,
            )
            return cp
        if tag == "conflict":
            actual = reply_text(reply[1], rkey, "actual") or None
            expected = str(call.args[8]) or None
            self._log.info(
                "durability_checkpoint_conflict", task_id=task_id, expected=expected, actual=actual
            )
            raise CheckpointConflict(task_id, expected, actual)
        if tag == "notfound":
            source = str(call.args[10])
            where = f" in task {task_id!r}" if mode == "rewind" else ""
            raise CheckpointNotFound(f"no live checkpoint {source!r}{where}")
        if tag == "miss":
            candidates = [reply_text(x, rkey, "candidate") for x in reply[1]]
            self._hint = tuple(candidates)
            lineage = self._lineage_ids(reply, 2, rkey)
            self._remember_lineage(task_id, lineage)
            return self._with(call, cid, [*candidates, *lineage])
        if tag == "exists":
            return self._with(call, self._new_id(), [str(a) for a in call.args[12:]])
        raise corrupt_reply(reply, rkey)

    # -- reads (ckpt_find, ckpt_get) --

    def find(self, task_id: str, agent_id: str | None = None, limit: int | None = None
             ) -> ScriptCall:
        """The ``ckpt_find`` call listing live current checkpoints of a task (or one
        agent); with ``limit``, a bounded read of at most that many (its reply's
        third item says whether there may be more: :meth:`find_more`)."""
        part("task_id", task_id)
        prefix = "" if agent_id is None else escape_part(part("agent_id", agent_id)) + ":"
        args: list[Any] = [prefix, task_id]
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ConfigError("limit", f"must be an integer >= 1 or None, got {limit!r}")
            args.append(limit)
        return ScriptCall(
            "ckpt_find", [self.current_index(task_id), self.live, self.order], args
        )

    @staticmethod
    def find_more(reply: Any) -> bool:
        """Whether a bounded ``ckpt_find`` (with a limit) left entries unread."""
        return isinstance(reply, list) and len(reply) > 2 and int(reply[2]) == 1

    def decode_find(self, call: ScriptCall, reply: Any) -> list[CheckpointEntry]:
        rkey = str(call.keys[0])
        if reply_tag(reply, rkey) != "ok":
            raise corrupt_reply(reply, rkey)
        flat = reply[1]
        entries = []
        for i in range(0, len(flat), 3):
            field = reply_text(flat[i], rkey, "field")
            escaped_agent, sep, phase = field.partition(":")
            if not sep or not escaped_agent or not phase:
                raise CorruptData(rkey, f"index field {field!r} is not '<agent>:<phase>'")
            entries.append(
                CheckpointEntry(
                    agent_id=unquote(escaped_agent),
                    phase=phase,
                    checkpoint_id=reply_text(flat[i + 1], rkey, "id"),
                    sequence=_codec.as_int(
                        reply_text(flat[i + 2], rkey, "sequence"), key=rkey, field="sequence"
                    ),
                )
            )
        return entries

    def located(
        self, find: ScriptCall, task_id: str, reply: Any
    ) -> tuple[list[CheckpointEntry], list[ScriptCall]]:
        """The entries a ``ckpt_find`` reply lists, and the ``ckpt_get`` calls
        reading their records (``list_current``: one pipeline)."""
        entries = self.decode_find(find, reply)
        return entries, [self.get(e.checkpoint_id, task_id) for e in entries]

    @staticmethod
    def pick(entries: Sequence[CheckpointEntry], agent_id: str, phase: str | None) -> str | None:
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
        part("checkpoint_id", checkpoint_id)
        return ScriptCall(
            "ckpt_get",
            [self.rec(checkpoint_id), self.live, self.order],
            [checkpoint_id, task_id],
        )

    def decode_get(self, checkpoint_id: str, reply: Any) -> Checkpoint | None:
        rkey = self.rec(checkpoint_id)
        tag = reply_tag(reply, rkey)
        if tag == "none":
            return None
        if tag != "ok":
            raise corrupt_reply(reply, rkey)
        parent = reply_text(reply[7], rkey, "pa")
        return Checkpoint(
            checkpoint_id=checkpoint_id,
            task_id=reply_text(reply[1], rkey, "t"),
            agent_id=reply_text(reply[2], rkey, "a"),
            phase=reply_text(reply[3], rkey, "p"),
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
        entries: Sequence[CheckpointEntry],
        replies: Sequence[Any],
        limit: int | None,
        fetches: int | None = None,
    ) -> Walk:
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
        return Walk(start, known, limit, fetches)

    def lineage_limit(self, limit: int | None) -> int | None:
        """How many records a lineage walk follows: ``limit`` (``None``: the
        whole lineage, within the read bound of :meth:`walk_plan`)."""
        return None if limit is None else max(0, limit)

    def lineage_entries(
        self, agent_id: str, entries: Sequence[CheckpointEntry], limit: int | None
    ) -> list[CheckpointEntry]:
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

    def current(
        self, entries: Sequence[CheckpointEntry], replies: Sequence[Any]
    ) -> list[Checkpoint]:
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
        raise corrupt_reply(reply, self.live)

    def clear(self, task_id: str, ids: Sequence[str]) -> ScriptCall:
        """One ``ckpt_clear`` pass deleting ``ids`` (those that belong to the task)."""
        part("task_id", task_id)
        keys = [
            self.current_index(task_id),
            self.replaced_index(task_id),
            self.live,
            self.order,
            self.children,
            self.children_expiry,
            *(self.rec(i) for i in ids),
        ]
        return ScriptCall("ckpt_clear", keys, [*ids, CLEAR_BATCH, task_id])

    def decode_clear(self, call: ScriptCall, reply: Any) -> tuple[int, list[str]]:
        """``(current checkpoints removed, ids still to delete)``."""
        rkey = str(call.keys[0])
        if reply_tag(reply, rkey) != "ok":
            raise corrupt_reply(reply, rkey)
        return int(reply[1]), [reply_text(x, rkey, "id") for x in reply[2]]
