"""Lost replies, injected below the plans: a step that ran in Redis (or did
not) and whose caller never read the reply (a timeout, a blip).

The fault is in the client's transport, not in Redis: the real script runs
against the real server, or is not sent at all.
"""

from __future__ import annotations

from typing import Any

import durabilis


def lose_replies(
    store: durabilis.Store, script: str, *, landed: bool, times: int
) -> list[int]:
    """The next ``times`` steps whose first call runs ``script`` (after a
    parking's guard, ``idem_check`` mode ``"g"`` or ``"G"``) lose their reply, after it
    ran in Redis when ``landed``. Returns ``[how many are left]`` (``[0]``:
    every one was lost)."""
    real = store.run_step
    left = [times]

    def run_step(calls: Any, gates: Any = None, waves: Any = None) -> Any:
        guarded = calls[0].name == "idem_check" and calls[0].args[:1] in (["g"], ["G"])
        first = calls[1] if guarded else calls[0]
        if left[0] and first.name == script:
            left[0] -= 1
            if landed:
                real(calls, gates, waves)
            raise durabilis.StorageUnavailable("the reply was lost")
        return real(calls, gates, waves)

    store.run_step = run_step  # type: ignore[method-assign]
    return left
