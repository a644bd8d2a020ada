"""Records, their encodings and the replies' decoding helpers: moved to
:mod:`durabilis.core.dlq.records` (re-exported here).

Kept so that imports of this module keep working; new code imports the core.
"""

from __future__ import annotations

from durabilis.core.dlq.records import *  # noqa: F403  (every public name, as before the move)
