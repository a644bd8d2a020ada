"""Checkpoints' I/O-free core: types, script calls and decoders, and plans.

The public shells (``durabilis.checkpoint``) drive these plans; see
:mod:`durabilis.core.checkpoint.plans`.
"""

from __future__ import annotations

from durabilis.core.checkpoint.ops import CheckpointCalls, Walk
from durabilis.core.checkpoint.plans import CheckpointOps, RunPlan
from durabilis.core.checkpoint.types import (
    NO_CHECKPOINT,
    Checkpoint,
    CheckpointConfig,
    CheckpointEntry,
    Expected,
    IdClock,
    NoCheckpoint,
    part,
)

__all__ = [
    "NO_CHECKPOINT",
    "Checkpoint",
    "CheckpointCalls",
    "CheckpointConfig",
    "CheckpointEntry",
    "CheckpointOps",
    "Expected",
    "IdClock",
    "NoCheckpoint",
    "RunPlan",
    "Walk",
    "part",
]
