"""durabilis: durable critical writes for a fleet of gateway processes.

Idempotency, retry, circuit breaking, checkpoints and a dead-letter queue,
with their shared state in Redis so that every replica sees one view.
"""

from __future__ import annotations

from durabilis._store import AsyncStore, Store, connect, connect_async
from durabilis.checkpoint import (
    NO_CHECKPOINT,
    AsyncCheckpointManager,
    AsyncTaskRun,
    Checkpoint,
    CheckpointConfig,
    CheckpointManager,
    TaskRun,
)
from durabilis.errors import (
    CheckpointConflict,
    CheckpointNotFound,
    CircuitOpen,
    ConfigError,
    CorruptData,
    DependencyNotFound,
    DurabilisError,
    InvalidKey,
    InvalidPayload,
    InvalidTtl,
    KeyReuseMismatch,
    LeaseLost,
    OperationError,
    OperationInProgress,
    PayloadTooLarge,
    RetryExhausted,
    StorageUnavailable,
    UnsupportedUrl,
)
from durabilis.idempotency import (
    AsyncIdempotencyGuard,
    CheckResult,
    Duplicate,
    IdempotencyConfig,
    IdempotencyGuard,
    IdempotencyKey,
    New,
)
from durabilis.retry import (
    AsyncRetryEngine,
    RetryBudget,
    RetryEngine,
    RetryOutcome,
    RetryPolicy,
    error_code,
    register_error_code,
    retry,
)

__version__ = "0.1.0"

__all__ = [
    "NO_CHECKPOINT",
    "AsyncCheckpointManager",
    "AsyncIdempotencyGuard",
    "AsyncRetryEngine",
    "AsyncStore",
    "AsyncTaskRun",
    "CheckResult",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointConflict",
    "CheckpointManager",
    "CheckpointNotFound",
    "CircuitOpen",
    "ConfigError",
    "CorruptData",
    "DependencyNotFound",
    "Duplicate",
    "DurabilisError",
    "IdempotencyConfig",
    "IdempotencyGuard",
    "IdempotencyKey",
    "InvalidKey",
    "InvalidPayload",
    "InvalidTtl",
    "KeyReuseMismatch",
    "LeaseLost",
    "New",
    "OperationError",
    "OperationInProgress",
    "PayloadTooLarge",
    "RetryBudget",
    "RetryEngine",
    "RetryExhausted",
    "RetryOutcome",
    "RetryPolicy",
    "StorageUnavailable",
    "Store",
    "TaskRun",
    "UnsupportedUrl",
    "__version__",
    "connect",
    "connect_async",
    "error_code",
    "register_error_code",
    "retry",
]
