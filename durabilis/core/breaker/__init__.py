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
from durabilis.core.breaker.types import *  # noqa: F403
from durabilis.core.breaker.types import __all__ as _TYPES

__all__ = [  # noqa: PLE0604
    *_TYPES,
    "DEFAULT_CACHED_ADMISSION_SECONDS",
    "MAX_CACHED_ADMISSION_SECONDS",
    "BreakerBook",
    "BreakerEntry",
    "BreakerOps",
    "admission",
    "check_probe_id",
    "outcome_code",
]
