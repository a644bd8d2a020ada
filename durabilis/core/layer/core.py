"""The layer's plans as one class: each concern's module stacked (see the package)."""

from __future__ import annotations

from durabilis.core.layer.recovery import _Recovery
from durabilis.core.layer.replay import _Replays


class _LayerCore(_Replays, _Recovery):
    """The whole logic of the layer, as plans of steps. No I/O here.

    Attributes:
        clock: Monotonic seconds (the simulator replaces it with its own).
    """
