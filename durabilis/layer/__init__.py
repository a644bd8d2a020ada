"""The composed layer: one durable operation through all five pillars.

``layer.execute(agent_id, operation_type, payload, fn)``:

1. checks everything checkable (key parts, the payload in every encoding that
   may store it), then claims the idempotency key (the claim keeps the payload
   for crash recovery) and asks the dependency's breaker, in ONE step; a
   completed duplicate returns the stored result without calling ``fn``;
2. runs ``fn(ctx)`` under the operation type's retry policy, asking the
   breaker before and reporting to it after every attempt;
3. on success records the result, reports to the breaker and (with
   ``task_id``/``phase``) saves the checkpoint, in ONE step that is sent again
   until it is recorded (while the claim's lease lasts);
4. when retries run out (or the breaker opens mid-way) parks the operation in
   the DLQ, releases the claim so a replay can run, and raises
   :class:`~durabilis.RetryExhausted`; a non-retryable error releases the claim
   and is raised as is.

The logic is written once, as plans of steps (:mod:`durabilis.core.layer`); the
sync and async layers (``_api.py``, ``_aio.py``, over ``_shell.py``) only
drive them (``durabilis._steps``). On standalone Redis each
step is one atomic Lua script: the happy path is exactly two round trips.
``docs/layer.md`` states the guarantee.
"""

from __future__ import annotations

from durabilis.layer._aio import AsyncDurabilityLayer
from durabilis.layer._api import DurabilityLayer
from durabilis.layer._config import (
    CIRCUIT_OPEN,
    DEFAULT_DEPENDENCIES,
    WORKER_LOST,
    DurabilityConfig,
    LayerStats,
    OperationContext,
    current_operation,
)

__all__ = [
    "CIRCUIT_OPEN",
    "DEFAULT_DEPENDENCIES",
    "WORKER_LOST",
    "AsyncDurabilityLayer",
    "DurabilityConfig",
    "DurabilityLayer",
    "LayerStats",
    "OperationContext",
    "current_operation",
]
