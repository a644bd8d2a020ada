"""Which idempotency keys share a Redis Cluster slot (client-side CRC16, no server)."""

from __future__ import annotations

from collections import defaultdict

from redis.crc import key_slot

from durabilis._keys import KeySpace


def slot_of(key: str) -> int:
    """The slot of a full Redis key (hash tags honoured)."""
    return int(key_slot(key.encode()))


def crowded_slot(namespace: str, prefix: str, candidates: int = 200_000) -> list[str]:
    """Idempotency keys ``<prefix>-<n>`` that all live in one slot (about 20 of them).

    Among ``candidates`` names, the slot that got the most: the first is the
    "hot" key, the others its slot siblings.
    """
    keys = KeySpace(namespace)
    buckets: dict[int, list[str]] = defaultdict(list)
    for n in range(candidates):
        name = f"{prefix}-{n}"
        buckets[slot_of(keys.idem(name))].append(name)
    return max(buckets.values(), key=len)


def one_slot(keys: list[str]) -> bool:
    """Every key in the same slot (what a script needs on Cluster: no CROSSSLOT)."""
    return len({slot_of(k) for k in keys}) <= 1
