"""durabilis: durable critical writes for a fleet of gateway processes.

Idempotency, retry, circuit breaking, checkpoints and a dead-letter queue,
with their shared state in Redis so that every replica sees one view.

This module is the front door: what an application that runs durable
operations needs (connect, the layer, its configs and keys, the errors it
catches). The asyncio face is :mod:`durabilis.aio`; everything else lives in
its own module (:mod:`durabilis.idempotency`, :mod:`durabilis.retry`,
:mod:`durabilis.breaker`, :mod:`durabilis.checkpoint`, :mod:`durabilis.dlq`,
:mod:`durabilis.errors`, ...). docs/api.md lists them.

The names durabilis 0.1 exported here and that moved still import, for one
release, with a ``DeprecationWarning`` naming their new import.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TYPE_CHECKING, Any

from durabilis._store import Store, connect
from durabilis.breaker import CircuitBreakerConfig
from durabilis.checkpoint import CheckpointConfig
from durabilis.dlq import DlqConfig
from durabilis.errors import (
    CircuitOpen,
    ConfigError,
    DurabilisError,
    OperationError,
    OperationInProgress,
    OutcomeUnrecorded,
    ResultNotStored,
    RetryExhausted,
    StorageUnavailable,
)
from durabilis.idempotency import IdempotencyConfig, IdempotencyKey
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext, current_operation
from durabilis.retry import RetryPolicy

if TYPE_CHECKING:
    # Type checkers still see the moved names (deprecated, see _MOVED), with their
    # types: a typed user of an old import keeps checking until the name is gone.
    # `retry`, the decorator, is not here: `durabilis.retry` is its module.
    from durabilis import aio as aio
    from durabilis._store import AsyncStore as AsyncStore
    from durabilis._store import connect_async as connect_async
    from durabilis.breaker import DEFAULT_BREAKER_CONFIGS as DEFAULT_BREAKER_CONFIGS
    from durabilis.breaker import AsyncCircuitBreakerRegistry as AsyncCircuitBreakerRegistry
    from durabilis.breaker import BreakerInfo as BreakerInfo
    from durabilis.breaker import BreakerState as BreakerState
    from durabilis.breaker import CircuitBreakerRegistry as CircuitBreakerRegistry
    from durabilis.breaker import Permit as Permit
    from durabilis.breaker import StateTransition as StateTransition
    from durabilis.checkpoint import NO_CHECKPOINT as NO_CHECKPOINT
    from durabilis.checkpoint import AsyncCheckpointManager as AsyncCheckpointManager
    from durabilis.checkpoint import AsyncTaskRun as AsyncTaskRun
    from durabilis.checkpoint import Checkpoint as Checkpoint
    from durabilis.checkpoint import CheckpointManager as CheckpointManager
    from durabilis.checkpoint import TaskRun as TaskRun
    from durabilis.config import AsyncConfigSync as AsyncConfigSync
    from durabilis.config import ConfigSync as ConfigSync
    from durabilis.config import FleetConfig as FleetConfig
    from durabilis.config import Reload as Reload
    from durabilis.config import load_config as load_config
    from durabilis.dlq import AsyncDeadLetterQueue as AsyncDeadLetterQueue
    from durabilis.dlq import DeadLetterQueue as DeadLetterQueue
    from durabilis.dlq import DlqListing as DlqListing
    from durabilis.dlq import DlqRecord as DlqRecord
    from durabilis.dlq import DlqStats as DlqStats
    from durabilis.dlq import DlqStatus as DlqStatus
    from durabilis.dlq import ReplayOutcome as ReplayOutcome
    from durabilis.dlq import ReplayResult as ReplayResult
    from durabilis.dlq import ReplaySummary as ReplaySummary
    from durabilis.errors import CheckpointConflict as CheckpointConflict
    from durabilis.errors import CheckpointNotFound as CheckpointNotFound
    from durabilis.errors import ConfigFileError as ConfigFileError
    from durabilis.errors import CorruptData as CorruptData
    from durabilis.errors import DependencyNotFound as DependencyNotFound
    from durabilis.errors import InvalidKey as InvalidKey
    from durabilis.errors import InvalidPayload as InvalidPayload
    from durabilis.errors import InvalidTtl as InvalidTtl
    from durabilis.errors import KeyReuseMismatch as KeyReuseMismatch
    from durabilis.errors import LayerClosed as LayerClosed
    from durabilis.errors import LeaseLost as LeaseLost
    from durabilis.errors import NotReplicated as NotReplicated
    from durabilis.errors import PayloadTooLarge as PayloadTooLarge
    from durabilis.errors import UnsupportedUrl as UnsupportedUrl
    from durabilis.errors import WrongEventLoop as WrongEventLoop
    from durabilis.events import configure_logging as configure_logging
    from durabilis.idempotency import AsyncIdempotencyGuard as AsyncIdempotencyGuard
    from durabilis.idempotency import CheckResult as CheckResult
    from durabilis.idempotency import Duplicate as Duplicate
    from durabilis.idempotency import IdempotencyGuard as IdempotencyGuard
    from durabilis.idempotency import New as New
    from durabilis.layer import AsyncDurabilityLayer as AsyncDurabilityLayer
    from durabilis.layer import LayerStats as LayerStats
    from durabilis.retry import AsyncRetryEngine as AsyncRetryEngine
    from durabilis.retry import RetryBudget as RetryBudget
    from durabilis.retry import RetryEngine as RetryEngine
    from durabilis.retry import RetryOutcome as RetryOutcome
    from durabilis.retry import error_code as error_code
    from durabilis.retry import register_error_code as register_error_code

__version__ = "0.1.0"

__all__ = [
    "CheckpointConfig",
    "CircuitBreakerConfig",
    "CircuitOpen",
    "ConfigError",
    "DlqConfig",
    "DurabilisError",
    "DurabilityConfig",
    "DurabilityLayer",
    "IdempotencyConfig",
    "IdempotencyKey",
    "OperationContext",
    "OperationError",
    "OperationInProgress",
    "OutcomeUnrecorded",
    "ResultNotStored",
    "RetryExhausted",
    "RetryPolicy",
    "StorageUnavailable",
    "Store",
    "__version__",
    "aio",
    "connect",
    "current_operation",
]

# durabilis 0.1's names that left the front door -> (their module, their name there).
# They still import, with a DeprecationWarning, until the next release removes them.
_ASYNC = {
    "connect_async": "connect",
    "AsyncStore": "Store",
    "AsyncDurabilityLayer": "DurabilityLayer",
    "AsyncIdempotencyGuard": "IdempotencyGuard",
    "AsyncRetryEngine": "RetryEngine",
    "AsyncCircuitBreakerRegistry": "CircuitBreakerRegistry",
    "AsyncCheckpointManager": "CheckpointManager",
    "AsyncTaskRun": "TaskRun",
    "AsyncDeadLetterQueue": "DeadLetterQueue",
    "AsyncConfigSync": "ConfigSync",
}
_IN_MODULES = {
    "durabilis.idempotency": ("IdempotencyGuard", "CheckResult", "New", "Duplicate"),
    "durabilis.retry": (
        "RetryEngine", "RetryOutcome", "RetryBudget", "error_code", "register_error_code",
    ),
    "durabilis.breaker": (
        "CircuitBreakerRegistry", "BreakerInfo", "BreakerState", "Permit", "StateTransition",
        "DEFAULT_BREAKER_CONFIGS",
    ),
    "durabilis.checkpoint": ("Checkpoint", "CheckpointManager", "TaskRun", "NO_CHECKPOINT"),
    "durabilis.dlq": (
        "DeadLetterQueue", "DlqRecord", "DlqStatus", "DlqListing", "DlqStats", "ReplayOutcome",
        "ReplayResult", "ReplaySummary",
    ),
    "durabilis.layer": ("LayerStats",),
    "durabilis.config": ("ConfigSync", "FleetConfig", "Reload", "load_config"),
    "durabilis.events": ("configure_logging",),
    "durabilis.errors": (
        "CheckpointConflict", "CheckpointNotFound", "ConfigFileError", "CorruptData",
        "DependencyNotFound", "InvalidKey", "InvalidPayload", "InvalidTtl", "KeyReuseMismatch",
        "LayerClosed", "LeaseLost", "NotReplicated", "PayloadTooLarge", "UnsupportedUrl",
        "WrongEventLoop",
    ),
}
_MOVED: dict[str, tuple[str, str]] = {
    **{old: ("durabilis.aio", new) for old, new in _ASYNC.items()},
    **{name: (module, name) for module, names in _IN_MODULES.items() for name in names},
}

# Submodules `durabilis.<name>` reaches without an import of its own: the async face,
# and the config module 0.1's front door imported (durabilis.config.load_config).
_LAZY_SUBMODULES = ("aio", "config")


def __getattr__(name: str) -> Any:
    """PEP 562: import a lazy submodule on first use; give a moved name with a warning."""
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"durabilis.{name}")
    try:
        module, new = _MOVED[name]
    except KeyError:
        raise AttributeError(f"module 'durabilis' has no attribute {name!r}") from None
    # `from durabilis import X` asks twice: the import system's hasattr() probe
    # (importlib's _handle_fromlist), then the import itself. Warn once, at the
    # second; stacklevel=2 is then the user's line (warnings skips importlib's frames).
    if sys._getframe(1).f_code.co_name != "_handle_fromlist":
        warnings.warn(
            f"durabilis.{name} is deprecated and leaves the front door in the next "
            f"release: use `from {module} import {new}`",
            DeprecationWarning,
            stacklevel=2,
        )
    return getattr(importlib.import_module(module), new)


def __dir__() -> list[str]:
    return sorted(__all__)
