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

The pure part (types, script calls, decoders and plans) is
:mod:`durabilis.core.checkpoint`; the classes here are its I/O shells: each
method builds a plan, drives it (``drive`` / ``adrive``) and returns what the
plan decoded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from durabilis._keys import KeySpace
from durabilis._log import get_logger
from durabilis._steps import adrive, drive
from durabilis._store import AsyncStore, Store

# (the old private names stay importable from here: the simulator and tests use them)
from durabilis.core.checkpoint.ops import Walk as _Walk  # noqa: F401
from durabilis.core.checkpoint.plans import CheckpointOps, RunPlan
from durabilis.core.checkpoint.plans import RunPlan as _RunPlan  # noqa: F401
from durabilis.core.checkpoint.types import (
    NO_CHECKPOINT,
    Checkpoint,
    CheckpointConfig,
    Expected,
    IdClock,
)
from durabilis.core.checkpoint.types import CheckpointEntry as _Entry  # noqa: F401
from durabilis.core.checkpoint.types import NoCheckpoint as _NoCheckpoint  # noqa: F401

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

_ids = IdClock(threading.Lock())


def new_checkpoint_id() -> str:
    """A fresh checkpoint id (32 hex chars, UUIDv7 layout, sorts by creation)."""
    return _ids.next()


def _fresh_id() -> str:
    return new_checkpoint_id()  # looked up at each call (a test may replace it)


class _CheckpointOps(CheckpointOps):
    """The core's ops with this process's id clock and logger."""

    __slots__ = ()

    def __init__(self, keys: KeySpace, config: CheckpointConfig) -> None:
        super().__init__(keys, config, new_id=_fresh_id, log=_log)

S = TypeVar("S", Store, AsyncStore)


class _ManagerCore(Generic[S]):
    """What both managers share: the store, the config, the ops (no I/O)."""

    def __init__(self, store: S, config: CheckpointConfig | None = None) -> None:
        self.store: S = store
        self.config = config or CheckpointConfig()
        self._ops = _CheckpointOps(store.keys, self.config)

    @property
    def ops(self) -> _CheckpointOps:
        """The manager's script-call builders, decoders and plans (no I/O): what
        the durability layer composes into its plans."""
        return self._ops


class CheckpointManager(_ManagerCore[Store]):
    """Saves and restores checkpoints shared by every process using the store.

    Args:
        store: From :func:`durabilis.connect`.
        config: Settings; the seed's defaults when omitted.
    """

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
        call = self._ops.save(
            task_id, agent_id, phase, state, ttl_seconds, expected=expected_checkpoint_id
        )
        return drive(self._ops.save_plan(call), self.store)

    def restore(self, task_id: str, agent_id: str, phase: str | None = None) -> Checkpoint:
        """The agent's current checkpoint of ``phase``, or its newest of any phase.

        Raises:
            CheckpointNotFound: No live checkpoint matches.
        """
        return drive(self._ops.restore_plan(task_id, agent_id, phase), self.store)

    def get_by_id(self, checkpoint_id: str) -> Checkpoint:
        """A checkpoint by id: current, or replaced but not yet expired.

        Raises:
            CheckpointNotFound: Unknown, expired, evicted or cleared.
        """
        return drive(self._ops.get_by_id_plan(checkpoint_id), self.store)

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
        call = self._ops.fork(checkpoint_id, new_task_id, expected_checkpoint_id)
        return drive(self._ops.save_plan(call), self.store)

    def rewind(
        self, task_id: str, checkpoint_id: str, *, expected_checkpoint_id: Expected = None
    ) -> Checkpoint:
        """Make a copy of an earlier checkpoint of the task its newest (see :meth:`fork`).

        Raises:
            CheckpointNotFound: The checkpoint is not live or belongs to another task.
        """
        call = self._ops.rewind(task_id, checkpoint_id, expected_checkpoint_id)
        return drive(self._ops.save_plan(call), self.store)

    def clear_task(self, task_id: str) -> int:
        """Delete every checkpoint of the task (current and replaced).

        Returns:
            How many live current checkpoints were removed.
        """
        return drive(self._ops.clear_plan(task_id), self.store)

    def count(self) -> int:
        """How many current checkpoints are live in the namespace."""
        return drive(self._ops.count_plan(), self.store)

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
        return drive(self._ops.history_plan(task_id, agent_id, limit), self.store)

    def list_current(self, task_id: str, agent_id: str | None = None) -> list[Checkpoint]:
        """The task's live current checkpoints (one per agent and phase), newest first.

        Two round trips (locate, then read the records in one pipeline). Nothing
        is changed except that index entries of expired checkpoints are dropped
        on the way.

        Args:
            task_id: The task.
            agent_id: Only this agent's checkpoints; every agent's when ``None``.

        Raises:
            InvalidKey: An empty or over-long id (before any I/O).
            CorruptData: Foreign data at a key. StorageUnavailable: Redis down.
        """
        find = self._ops.find(task_id, agent_id)
        entries, gets = self._ops.located(find, task_id, self.store.run(find))
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
                running the same task gets :class:`~durabilis.errors.CheckpointConflict`
                instead of interleaving its saves.
        """
        return TaskRun(self, RunPlan(self._ops, task_id, agent_id, ttl_seconds, exclusive))


class TaskRun:
    """One run of a task that skips the phases a previous run completed.

    Get one from :meth:`CheckpointManager.task`.
    """

    def __init__(self, manager: CheckpointManager, plan: RunPlan) -> None:
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


class AsyncCheckpointManager(_ManagerCore[AsyncStore]):
    """The asyncio twin of :class:`CheckpointManager` (same methods, awaited)."""

    async def save(
        self, task_id: str, agent_id: str, phase: str, state: Any,
        ttl_seconds: float | None = None, *, expected_checkpoint_id: Expected = None,
    ) -> Checkpoint:
        """See :meth:`CheckpointManager.save`."""
        call = self._ops.save(
            task_id, agent_id, phase, state, ttl_seconds, expected=expected_checkpoint_id
        )
        return await adrive(self._ops.save_plan(call), self.store)

    async def restore(self, task_id: str, agent_id: str, phase: str | None = None) -> Checkpoint:
        """See :meth:`CheckpointManager.restore`."""
        return await adrive(self._ops.restore_plan(task_id, agent_id, phase), self.store)

    async def get_by_id(self, checkpoint_id: str) -> Checkpoint:
        """See :meth:`CheckpointManager.get_by_id`."""
        return await adrive(self._ops.get_by_id_plan(checkpoint_id), self.store)

    async def fork(
        self, checkpoint_id: str, new_task_id: str, *, expected_checkpoint_id: Expected = None
    ) -> Checkpoint:
        """See :meth:`CheckpointManager.fork`."""
        call = self._ops.fork(checkpoint_id, new_task_id, expected_checkpoint_id)
        return await adrive(self._ops.save_plan(call), self.store)

    async def rewind(
        self, task_id: str, checkpoint_id: str, *, expected_checkpoint_id: Expected = None
    ) -> Checkpoint:
        """See :meth:`CheckpointManager.rewind`."""
        call = self._ops.rewind(task_id, checkpoint_id, expected_checkpoint_id)
        return await adrive(self._ops.save_plan(call), self.store)

    async def clear_task(self, task_id: str) -> int:
        """See :meth:`CheckpointManager.clear_task`."""
        return await adrive(self._ops.clear_plan(task_id), self.store)

    async def count(self) -> int:
        """See :meth:`CheckpointManager.count`."""
        return await adrive(self._ops.count_plan(), self.store)

    async def history(
        self, task_id: str, agent_id: str, *, limit: int | None = None
    ) -> list[Checkpoint]:
        """See :meth:`CheckpointManager.history`."""
        return await adrive(self._ops.history_plan(task_id, agent_id, limit), self.store)

    async def list_current(self, task_id: str, agent_id: str | None = None) -> list[Checkpoint]:
        """See :meth:`CheckpointManager.list_current`."""
        find = self._ops.find(task_id, agent_id)
        entries, gets = self._ops.located(find, task_id, await self.store.run(find))
        return self._ops.current(entries, await self.store.run_many(gets) if gets else [])

    def task(
        self, task_id: str, agent_id: str, *, ttl_seconds: float | None = None,
        exclusive: bool = True,
    ) -> AsyncTaskRun:
        """See :meth:`CheckpointManager.task`: ``async with manager.task(t, a) as run:``."""
        return AsyncTaskRun(self, RunPlan(self._ops, task_id, agent_id, ttl_seconds, exclusive))


class AsyncTaskRun:
    """The asyncio twin of :class:`TaskRun`; ``fn`` may be sync or async."""

    def __init__(self, manager: AsyncCheckpointManager, plan: RunPlan) -> None:
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
