"""The DLQ's other script calls and the decoding of their replies: moved to
:mod:`durabilis.core.dlq.calls` (re-exported here).

Kept so that imports of this module keep working; new code imports the core.
"""

from __future__ import annotations

from durabilis.core.dlq.calls import *  # noqa: F403  (every public name, as before the move)
