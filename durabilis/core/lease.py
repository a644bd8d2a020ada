"""The periodic chores' lease (``layer_lease``): its call and its reply (no I/O).

One replica at a time runs a fleet chore each period (orphan recovery, the
DLQ's expiry cleanup): the first to ask gets the lease, the others skip until
it expires. Callers build the lease's key with ``durabilis._keys`` (e.g.
``store.keys.layer("lease", "recover_orphans")``) and send the call.
"""

from __future__ import annotations

from typing import Any

from durabilis._scripts import ScriptCall

__all__ = ["lease_taken", "period_lease"]


def period_lease(key: str, holder: str, seconds: float) -> ScriptCall:
    """The ``layer_lease`` call that takes the lease at ``key`` for one period.

    Args:
        key: The lease's hash (built by ``durabilis._keys``).
        holder: Who asks (a replica id), kept for operators.
        seconds: The period; the lease lasts that long (at least 1 ms).

    Returns:
        The script call; decode its reply with :func:`lease_taken`.
    """
    return ScriptCall("layer_lease", [key], [holder, max(1, int(seconds * 1000))])


def lease_taken(reply: Any) -> bool:
    """Whether a ``layer_lease`` reply says the lease was taken (1), not held by another (0)."""
    return bool(int(reply or 0))
