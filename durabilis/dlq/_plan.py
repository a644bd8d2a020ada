"""The plan vocabulary of replays: moved to :mod:`durabilis.core.dlq.plan`
(re-exported here).

Kept so that imports of this module keep working; new code imports the core.
"""

from __future__ import annotations

from durabilis.core.dlq.plan import (
    ANSWERED,
    CONFIG_ERROR_QUIET_SECONDS,
    FINISHED,
    Handle,
    Plan,
    ReplayDeclined,
    TypeChanged,
    handler_plan,
)

__all__ = [
    "ANSWERED",
    "CONFIG_ERROR_QUIET_SECONDS",
    "FINISHED",
    "Handle",
    "Plan",
    "ReplayDeclined",
    "TypeChanged",
    "handler_plan",
]
