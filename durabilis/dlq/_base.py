"""The DLQ's keys and the checks every call builder makes: moved to
:mod:`durabilis.core.dlq.base` (re-exported here).

Kept so that imports of this module keep working; new code imports the core.
"""

from __future__ import annotations

from durabilis.core.dlq.base import *  # noqa: F403  (every public name, as before the move)
