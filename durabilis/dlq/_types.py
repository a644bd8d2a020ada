"""The DLQ's public types and settings: moved to :mod:`durabilis.core.dlq.types`
(re-exported here).

Kept so that imports of this module keep working; new code imports the core.
"""

from __future__ import annotations

from durabilis.core.dlq.types import (
    MAX_TTL_SECONDS,
    CleanupReport,
    DlqConfig,
    DlqListing,
    DlqRecord,
    DlqScan,
    DlqStats,
    DlqStatus,
    ReplayOutcome,
    ReplayResult,
    ReplaySummary,
    RequeueResult,
    check_number,
)

__all__ = [
    "MAX_TTL_SECONDS",
    "CleanupReport",
    "DlqConfig",
    "DlqListing",
    "DlqRecord",
    "DlqScan",
    "DlqStats",
    "DlqStatus",
    "ReplayOutcome",
    "ReplayResult",
    "ReplaySummary",
    "RequeueResult",
    "check_number",
]
