"""The asyncio face of durabilis: the same names as the sync ones, awaited.

As ``limits.aio`` mirrors ``limits``, this module gives the async classes the
names of their sync twins, so async code reads like the sync examples::

    import durabilis
    from durabilis import aio

    store = aio.connect()                       # an AsyncStore; connects lazily
    layer = aio.DurabilityLayer(store, durabilis.DurabilityConfig())
    result = await layer.execute("agent-1", "wiki_write", payload, save_page)

Only what does I/O differs between the two faces. Configs, keys, errors,
:class:`~durabilis.OperationContext` and the records the pillars return are
shared: import them from :mod:`durabilis` or their own modules. Each class here
also keeps its ``Async…`` name in its own module (``durabilis.layer.
AsyncDurabilityLayer``, ...), for code that uses both faces in one file.
"""

from __future__ import annotations

from durabilis._store import AsyncStore as Store
from durabilis._store import connect_async as connect
from durabilis.breaker import AsyncCircuitBreakerRegistry as CircuitBreakerRegistry
from durabilis.checkpoint import AsyncCheckpointManager as CheckpointManager
from durabilis.checkpoint import AsyncTaskRun as TaskRun
from durabilis.config import AsyncConfigSync as ConfigSync
from durabilis.dlq import AsyncDeadLetterQueue as DeadLetterQueue
from durabilis.idempotency import AsyncIdempotencyGuard as IdempotencyGuard
from durabilis.layer import AsyncDurabilityLayer as DurabilityLayer
from durabilis.retry import AsyncRetryEngine as RetryEngine

__all__ = [
    "CheckpointManager",
    "CircuitBreakerRegistry",
    "ConfigSync",
    "DeadLetterQueue",
    "DurabilityLayer",
    "IdempotencyGuard",
    "RetryEngine",
    "Store",
    "TaskRun",
    "connect",
]
