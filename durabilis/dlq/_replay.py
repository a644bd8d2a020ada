"""The replay plans: the shell's :class:`DlqOps` over the core's
:class:`durabilis.core.dlq.replay.ReplayPlans`, handing it the package's
logger (the plans themselves moved to :mod:`durabilis.core.dlq.replay`; their
pacer and tally are re-exported here under their former names).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from durabilis._log import get_logger
from durabilis.core.dlq.replay import RESEND_SECONDS, Pacer, ReplayPlans, Tally
from durabilis.core.dlq.types import DlqConfig
from durabilis.core.steps import Log

if TYPE_CHECKING:
    from durabilis._keys import KeySpace

__all__ = ["DlqOps", "_Pacer", "_Tally"]

_Pacer = Pacer
_Tally = Tally
_RESEND_SECONDS = RESEND_SECONDS
"""How long a replay's claim or note is sent again after a lost reply (read
at each use: tests shorten it here)."""

_log = get_logger()


class DlqOps(ReplayPlans):
    """Builds each script call and decodes its reply; shared by both twins."""

    __slots__ = ()

    def __init__(
        self, keys: KeySpace, config: DlqConfig, owner: str, *, log: Log | None = None
    ) -> None:
        # The core logs nowhere by itself: the package's logger, unless told.
        super().__init__(keys, config, owner, log=_log if log is None else log)

    @property
    def resend_seconds(self) -> float:
        return _RESEND_SECONDS
