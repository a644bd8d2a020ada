"""The DLQ's public types and settings: moved to :mod:`durabilis.core.dlq.types`
(re-exported here).

Kept so that imports of this module keep working; new code imports the core.
"""

from __future__ import annotations

from durabilis.core.dlq.types import *  # noqa: F403  (every public name, as before the move)
