"""The circuit breaker's I/O-free core: types, script calls and decoders, book and plans.

The public shells (``durabilis.breaker``) drive these plans; see
:mod:`durabilis.core.breaker.plans`.
"""

from __future__ import annotations

from durabilis.core.breaker.ops import (
    BreakerEntry,
    BreakerOps,
    admission,
    check_probe_id,
    outcome_code,
)
from durabilis.core.breaker.plans import (
    DEFAULT_CACHED_ADMISSION_SECONDS,
    MAX_CACHED_ADMISSION_SECONDS,
    BreakerBook,
)
from durabilis.core.breaker.types import (
    DEFAULT_BREAKER_CONFIGS,
    BreakerInfo,
    BreakerState,
    CircuitBreakerConfig,
    Permit,
    StateTransition,
    TransitionCallback,
    default_breaker_configs,
    default_replica_id,
)

__all__ = [
    "DEFAULT_BREAKER_CONFIGS",
    "DEFAULT_CACHED_ADMISSION_SECONDS",
    "MAX_CACHED_ADMISSION_SECONDS",
    "BreakerBook",
    "BreakerEntry",
    "BreakerInfo",
    "BreakerOps",
    "BreakerState",
    "CircuitBreakerConfig",
    "Permit",
    "StateTransition",
    "TransitionCallback",
    "admission",
    "check_probe_id",
    "default_breaker_configs",
    "default_replica_id",
    "outcome_code",
]
