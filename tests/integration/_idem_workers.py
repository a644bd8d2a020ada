"""Worker processes for the cross-process idempotency tests (spawned, importable)."""

from __future__ import annotations

from typing import Any

import durabilis


def claim_rounds(url: str, namespace: str, rounds: int, barrier: Any, out: Any, me: int) -> None:
    """Each round: wait for every process, then claim that round's fresh key at once."""
    store = durabilis.connect(url, namespace=namespace)
    guard = durabilis.idempotency.IdempotencyGuard(store)
    wins = []
    for r in range(rounds):
        barrier.wait(timeout=30)
        result = guard.check_and_record(f"race-round-{r}", placeholder=me)
        wins.append(1 if isinstance(result, durabilis.idempotency.New) else 0)
    store.close()
    out.put((me, wins))
