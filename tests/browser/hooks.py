"""Authorization hooks the browser tests serve the console with
(``durabilis web --actions --authorize tests.browser.hooks:allow``):
``authorize(request, action, target) -> actor name | None``."""

from __future__ import annotations

from typing import Any

ACTOR = "ops-alice"


def allow(request: Any, action: str, target: Any) -> str:
    """Every request may act, as ``ops-alice``."""
    return ACTOR


def deny(request: Any, action: str, target: Any) -> None:
    """No request may act."""
    return None
