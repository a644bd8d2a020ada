"""Checkpoint plans: every operation as a generator of steps (no I/O).

:class:`CheckpointOps` adds to the call builders and decoders of
:class:`~durabilis.core.checkpoint.ops.CheckpointCalls` the plans of each
public operation; the managers drive them (``drive`` / ``adrive``).
:class:`RunPlan` is the bookkeeping of one task run.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from durabilis._limits import MAX_LINEAGE_PER_TASK
from durabilis._scripts import ScriptCall
from durabilis.core.checkpoint.ops import CheckpointCalls, Walk, reply_tag, reply_text
from durabilis.core.checkpoint.types import (
    MAX_CLEAR_ROUNDS,
    MAX_ROUNDS,
    NO_CHECKPOINT,
    SAVE_BACKOFF,
    SAVE_RESEND_SECONDS,
    Checkpoint,
    CheckpointEntry,
    Expected,
    part,
)
from durabilis.core.steps import IO, Plan, Run, Sleep, is_async_callable
from durabilis.errors import CheckpointNotFound, DurabilisError, StorageUnavailable


class CheckpointOps(CheckpointCalls):
    """The call builders and decoders, and the plan of every operation.

    The composed layer pipelines :meth:`save` with other pillars' scripts and
    decodes with :meth:`decode_save`; the managers drive the ``*_plan``s.
    """

    __slots__ = ()

    def save_plan(self, call: ScriptCall) -> Plan[Checkpoint]:
        """Send a save until it lands (stale eviction hints make it send itself again)."""
        for _ in range(MAX_ROUNDS):
            out = self.decode_save(call, (yield call))
            if isinstance(out, Checkpoint):
                return out
            call = out
        raise DurabilisError("checkpoint save kept racing other writers' evictions; try again")

    def kept_save_plan(self, call: ScriptCall) -> Plan[Checkpoint]:
        """A task run's save of a phase whose ``fn`` ran: shielded (a
        cancellation waits for it), and sent again, with backoff, for
        ``SAVE_RESEND_SECONDS`` after a lost reply. The same id is sent again,
        so a try that landed is recognised (``exists``, or a conflict naming
        it) and read back, never taken for another writer's. One deleted
        before the resend (a cap, ``clear_task``) is saved again: a save made
        then (docs/checkpoint.md)."""
        unsure: set[str] = set()  # ids of tries whose reply was lost
        check: str | None = None  # an id that landed: read it back
        until: float | None = None
        delay = SAVE_BACKOFF[0]
        rounds = 0
        while True:
            cid = str(call.args[0])
            try:
                reply = (yield IO([self.get(check) if check else call], shield=True))[0]
            except StorageUnavailable as exc:  # (a script's own error is not sent again)
                now = self._clock()
                until = now + SAVE_RESEND_SECONDS if until is None else until
                if now >= until:
                    raise
                unsure.add(cid)
                self._log.warning("durability_checkpoint_save_retry", checkpoint_id=cid,
                             error=f"{type(exc).__name__}: {exc}", delay_seconds=round(delay, 3))
                yield Sleep(delay * (0.5 + random.random() / 2), shield=True)
                delay = min(delay * 2, SAVE_BACKOFF[1])
                continue
            if check:
                saved = self.decode_get(check, reply)
                if saved is None:
                    raise DurabilisError(f"checkpoint {check!r} was saved, and gone before "
                                         "its lost reply could be read back")
                self._log.info("durability_checkpoint_saved", checkpoint_id=check,
                          task_id=saved.task_id, agent_id=saved.agent_id, phase=saved.phase,
                          parent_checkpoint_id=saved.parent_checkpoint_id, mode="save",
                          read_back=True)
                return saved
            tag = reply_tag(reply, str(call.keys[0]))
            if cid in unsure and (tag == "exists" or (
                    tag == "conflict"
                    and reply_text(reply[1], str(call.keys[0]), "actual") == cid)):
                check = cid  # an earlier try of this very save landed
                continue
            out = self.decode_save(call, reply)
            if isinstance(out, Checkpoint):
                return out
            rounds += 1
            if rounds >= MAX_ROUNDS:
                raise DurabilisError(
                    "checkpoint save kept racing other writers' evictions; try again")
            call = out

    def walk_plan(
        self, task_id: str, agent_id: str, limit: int | None
    ) -> Plan[tuple[list[CheckpointEntry], Walk]]:
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
        part("agent_id", agent_id)
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

    def restore_plan(self, task_id: str, agent_id: str, phase: str | None) -> Plan[Checkpoint]:
        """The agent's current checkpoint of ``phase``, or its newest of any phase.

        Raises:
            CheckpointNotFound: No live checkpoint matches.
        """
        find = self.find(task_id, agent_id)
        if phase is not None:
            part("phase", phase)
        for _ in range(MAX_ROUNDS):
            cid = self.pick(self.decode_find(find, (yield find)), agent_id, phase)
            if cid is None:
                break
            cp = self.decode_get(cid, (yield self.get(cid, task_id)))
            if cp is not None:
                return cp
        raise self.not_found(task_id, agent_id, phase)

    def get_by_id_plan(self, checkpoint_id: str) -> Plan[Checkpoint]:
        """A checkpoint by id. Raises ``CheckpointNotFound``."""
        cp = self.decode_get(checkpoint_id, (yield self.get(checkpoint_id)))
        if cp is None:
            raise CheckpointNotFound(f"no live checkpoint {checkpoint_id!r}")
        return cp

    def clear_plan(self, task_id: str) -> Plan[int]:
        """Delete every checkpoint of the task; returns the current ones removed."""
        removed, ids = 0, list[str]()
        for _ in range(MAX_CLEAR_ROUNDS):
            call = self.clear(task_id, ids)
            n, ids = self.decode_clear(call, (yield call))
            removed += n
            if not ids:
                return removed
        raise DurabilisError(f"clear_task({task_id!r}) kept racing concurrent saves")

    def count_plan(self) -> Plan[int]:
        """How many current checkpoints are live in the namespace."""
        return self.decode_count((yield self.count()))

    def history_plan(
        self, task_id: str, agent_id: str, limit: int | None
    ) -> Plan[list[Checkpoint]]:
        """The lineage of the agent's newest checkpoint, newest first."""
        return (yield from self.walk_plan(task_id, agent_id, limit))[1].chain


def _call(fn: Callable[[], Any]) -> Any:
    return fn()


async def _call_async(fn: Callable[[], Awaitable[Any]]) -> Any:
    return await fn()


class RunPlan:
    """The bookkeeping of one :class:`TaskRun`, shared by both twins (no I/O)."""

    __slots__ = (
        "agent_id", "completed", "exclusive", "expected", "loaded", "ops", "task_id", "ttl_seconds",
    )

    def __init__(
        self,
        ops: CheckpointOps,
        task_id: str,
        agent_id: str,
        ttl_seconds: float | None,
        exclusive: bool,
    ) -> None:
        part("task_id", task_id)
        part("agent_id", agent_id)
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

    def load(self, entries: Sequence[CheckpointEntry], walk: Walk) -> None:
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
        part("phase", name)
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
