"""Config field checks shared by the pillars' configs (errors name the field)."""

from __future__ import annotations

import math
from typing import Any

from durabilis.errors import ConfigError


def positive_number(name: str, value: Any, *, integer: bool = False) -> None:
    """Accept a finite number > 0 (an ``int`` when ``integer``); bools are refused.

    Raises:
        ConfigError: Naming ``name``.
    """
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and integer:
        ok = isinstance(value, int)
    if not ok or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive finite number"
        raise ConfigError(name, f"must be {kind}, got {value!r}")
