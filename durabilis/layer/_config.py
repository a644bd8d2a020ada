"""The layer's settings and the values it hands out (no I/O, no plans)."""

from __future__ import annotations

from durabilis._steps import CURRENT
from durabilis.config._layer import (  # re-exported: the config is below the layer
    DEFAULT_DEPENDENCIES,
    RECOVERY_WARN_SECONDS,
    DurabilityConfig,
)
from durabilis.core.layer.types import (  # re-exported: the core's values
    CIRCUIT_OPEN,
    WORKER_LOST,
    LayerStats,
    OperationContext,
)

__all__ = [
    "CIRCUIT_OPEN",
    "DEFAULT_DEPENDENCIES",
    "RECOVERY_WARN_SECONDS",
    "WORKER_LOST",
    "DurabilityConfig",
    "LayerStats",
    "OperationContext",
    "current_operation",
]


def current_operation() -> OperationContext | None:
    """The context of the durable operation running now (inside ``fn`` and
    ``@layer.durable`` functions, also in the worker thread of a plain
    function run by the asyncio layer)."""
    current: OperationContext | None = CURRENT.get()
    return current
