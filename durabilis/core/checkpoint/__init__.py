"""Checkpoints' I/O-free core: types, script calls and decoders, and plans.

The public shells (``durabilis.checkpoint``) drive these plans; see
:mod:`durabilis.core.checkpoint.plans`.
"""

from __future__ import annotations

from durabilis.core.checkpoint.ops import CheckpointCalls, Walk
from durabilis.core.checkpoint.plans import CheckpointOps, RunPlan
from durabilis.core.checkpoint.types import *  # noqa: F403
from durabilis.core.checkpoint.types import __all__ as _TYPES

__all__ = [*_TYPES, "CheckpointCalls", "CheckpointOps", "RunPlan", "Walk"]  # noqa: PLE0604
