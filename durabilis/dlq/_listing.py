"""Listing, requeue, purge, abandon and cleanup plans: moved to
:mod:`durabilis.core.dlq.listing` (re-exported here).

Kept so that imports of this module keep working; new code imports the core.
"""

from __future__ import annotations

from durabilis.core.dlq.listing import *  # noqa: F403  (every public name, as before the move)
