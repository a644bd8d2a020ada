"""Checkpoint types: config, the values handed out, ids and key-part checks (no I/O)."""

from __future__ import annotations

import secrets
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from durabilis._limits import MAX_STORED_TTL_SECONDS, check_limits
from durabilis._validate import positive_number as _positive_number
from durabilis.errors import ConfigError, InvalidKey

__all__ = [  # what durabilis.core.checkpoint re-exports (one star import)
    "NO_CHECKPOINT",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointEntry",
    "Expected",
    "IdClock",
    "NoCheckpoint",
    "part",
]

HINT = 8
"""Eviction candidates each save brings back for the next one (see ``ckpt_save.lua``)."""
LINEAGE_HINT_TASKS = 1024
"""Tasks whose lineage-cap candidates one manager remembers (the most recent ones)."""
MAX_ROUNDS = 32
SAVE_RESEND_SECONDS = 30.0
"""How long a phase's save is sent again after a lost reply (its ``fn`` ran)."""
SAVE_BACKOFF = (0.05, 1.0)  # first and longest pause between those tries
CLEAR_BATCH = 256
MAX_CLEAR_ROUNDS = 10_000
MAX_PART_BYTES = 1024
MAX_TTL_SECONDS = MAX_STORED_TTL_SECONDS


class NoCheckpoint:
    """The type of :data:`NO_CHECKPOINT`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_CHECKPOINT"


NO_CHECKPOINT: Final = NoCheckpoint()
"""Pass as ``expected_checkpoint_id`` to require that the task has no live checkpoint yet."""

Expected = str | NoCheckpoint | None


# --- ids -----------------------------------------------------------------------


class IdClock:
    """UUIDv7-layout ids (32 hex chars): 48-bit ms, then random bits.

    They sort by creation within one process (a tie in the same millisecond
    adds a random step to the previous id) and roughly across a fleet (client
    clocks). Order that matters ("latest", eviction) comes from a server-side
    sequence, never from the ids.
    """

    __slots__ = ("_last", "_lock")

    def __init__(self, lock: AbstractContextManager[Any] | None = None) -> None:
        """``lock``: makes ids of concurrent threads distinct and ordered (the
        shell hands in a ``threading.Lock``)."""
        self._lock: AbstractContextManager[Any] = lock if lock is not None else nullcontext()
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
            :class:`~durabilis.errors.PayloadTooLarge` before any Redis call.
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
        if self.default_ttl_seconds > MAX_TTL_SECONDS:
            raise ConfigError("default_ttl_seconds", f"must be at most {MAX_TTL_SECONDS}")
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
class CheckpointEntry:
    """A live current checkpoint as listed by the task's index."""

    agent_id: str
    phase: str
    checkpoint_id: str
    sequence: int


def part(name: str, value: Any) -> str:
    """Check one id part (task, agent, phase, checkpoint id); returns it.

    Raises:
        InvalidKey: Not a non-empty str of valid UTF-8 of at most 1024 bytes.
    """
    if not isinstance(value, str) or not value:
        raise InvalidKey(str(value), f"{name} must be a non-empty string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidKey(value, f"{name} is not valid UTF-8 text") from exc
    if size > MAX_PART_BYTES:
        raise InvalidKey(value, f"{name} is {size} bytes, over the limit of {MAX_PART_BYTES}")
    return value


