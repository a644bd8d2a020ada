"""Planting foreign data where durabilis keeps its own, for any pillar.

A hostile test first lets the pillar write its real keys (so it knows which
keys exist and what types they have), then plants garbage with
:func:`plant_at_every_key` — every Redis type, or random bytes in every field
of a hash — calls the public API, and checks with :func:`untouched_or_valid`
that each key is either left exactly as planted or is once again a valid
record of the pillar (nothing half-written, nothing without its TTL).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

KINDS = ("string", "list", "set", "zset", "hash", "stream")
"""Every Redis data type a key can hold (ReJSON and modules left out)."""


def keys_of_namespace(raw: Any, namespace: str) -> list[str]:
    """Every key of ``namespace`` (SCAN; every primary on Cluster), sorted."""
    return sorted(k.decode() if isinstance(k, bytes) else k
                  for k in raw.scan_iter(match=f"{namespace}:*", count=1000))


def plant(raw: Any, key: str, kind: str, blob: bytes = b"\x00\xff\xc1garbage") -> None:
    """Replace ``key`` with a value of ``kind`` made of ``blob`` (no TTL: foreign data)."""
    raw.delete(key)
    if kind == "string":
        raw.set(key, blob)
    elif kind == "list":
        raw.rpush(key, blob, blob[:1] or b"x")
    elif kind == "set":
        raw.sadd(key, blob, b"other")
    elif kind == "zset":
        raw.zadd(key, {blob: 1.5, b"other": -2})
    elif kind == "hash":
        raw.hset(key, mapping={blob or b"f": blob, b"s": blob})
    elif kind == "stream":
        raw.xadd(key, {b"f": blob})
    else:
        raise ValueError(f"unknown Redis type {kind!r}")


def scramble_fields(raw: Any, key: str, values: Callable[[str], bytes]) -> dict[str, bytes]:
    """Overwrite every field of the hash at ``key`` with ``values(field)``; return them."""
    fields = [f.decode() if isinstance(f, bytes) else f for f in raw.hkeys(key)]
    planted = {f: values(f) for f in fields}
    if planted:
        raw.hset(key, mapping=planted)
    return planted


def plant_at_every_key(raw: Any, keys: Iterable[str], kind: str, blob: bytes) -> None:
    """:func:`plant` at each of ``keys``."""
    for key in keys:
        plant(raw, key, kind, blob)


def snapshot(raw: Any, keys: Iterable[str]) -> dict[str, bytes | None]:
    """``DUMP`` of each key: a byte-exact picture (value and type) to compare later."""
    return {key: raw.dump(key) for key in keys}


def untouched_or_valid(
    raw: Any,
    before: dict[str, bytes | None],
    is_valid: Callable[[Any, str], bool],
) -> list[str]:
    """The keys of ``before`` that changed AND are not valid pillar records now.

    A key that disappeared counts as valid (a pillar may delete what it owns).
    """
    bad = []
    for key, dumped in before.items():
        now = raw.dump(key)
        if now == dumped or now is None:
            continue
        if not is_valid(raw, key):
            bad.append(key)
    return bad


# --- any pillar: the shape of its keys, and calls that may only raise DurabilisError -----


def shape_of(raw: Any, keys: Iterable[str]) -> dict[str, tuple[str, bool]]:
    """``key -> (Redis type, has a TTL)`` as the pillar left them (before any garbage)."""
    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    return {key: (text(raw.type(key)), raw.pttl(key) > 0) for key in keys}


def as_the_pillar_wrote_it(shape: dict[str, tuple[str, bool]]) -> Callable[[Any, str], bool]:
    """Validity for :func:`untouched_or_valid`: the key's original type, and a TTL if it had one.

    A key a call rewrote after garbage was planted must be the pillar's again,
    never garbage that lost its TTL or a half-written value of another type.
    """
    def valid(raw: Any, key: str) -> bool:
        kind, had_ttl = shape[key]
        now = raw.type(key)
        now = now.decode() if isinstance(now, bytes) else str(now)
        return now == kind and (raw.pttl(key) > 0 or not had_ttl)

    return valid


def no_ttl_lost(raw: Any, shape: dict[str, tuple[str, bool]]) -> list[str]:
    """Keys that had a TTL and now live forever (a pillar key must never lose its TTL)."""
    return [key for key, (_, had_ttl) in shape.items() if had_ttl and raw.pttl(key) == -1]


def outcomes(calls: Iterable[Callable[[], Any]], allowed: type[BaseException]) -> list[Any]:
    """Run every call; an ``allowed`` error is returned as the outcome, anything else escapes."""
    seen: list[Any] = []
    for call in calls:
        try:
            seen.append(call())
        except allowed as exc:
            seen.append(exc)
    return seen
