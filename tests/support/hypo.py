"""Hypothesis settings and strategies for the hostile suites.

Each example talks to a real Redis, so examples are few (``max_examples``) and
derandomized (the same inputs every CI run); ``DURABILIS_HYPOTHESIS=thorough``
runs many more, randomly, for a local bug hunt.
"""

from __future__ import annotations

import math
import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

THOROUGH = os.environ.get("DURABILIS_HYPOTHESIS") == "thorough"


def hostile(max_examples: int = 40) -> settings:
    """Settings for one hostile property test."""
    return settings(
        max_examples=max_examples * 12 if THOROUGH else max_examples,
        deadline=None,
        derandomize=not THOROUGH,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# Any code point, lone surrogates included (not valid Unicode: must be refused cleanly).
any_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=300)

msgpack_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=50)
    | st.binary(max_size=50)
)

msgpack_values = st.recursive(
    msgpack_scalars,
    lambda inner: st.lists(inner, max_size=5)
    | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=10) | st.integers(min_value=-(2**63), max_value=2**64 - 1)
                      | st.binary(max_size=5), inner,
                      max_size=5),
    max_leaves=20,
)
"""Every shape msgpack can carry (tuples round-trip as tuples: ext types)."""

unencodable = (
    st.integers(min_value=2**64)
    | st.integers(max_value=-(2**63) - 1)
    | st.builds(object)
    | st.complex_numbers()
    | st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=3)
)
"""Values msgpack cannot encode: must be ``InvalidPayload`` before any Redis call."""


def normalised(value: Any) -> Any:
    """What a value looks like after a msgpack round trip (unchanged: tuples, sets and
    the other ext types round-trip; NaN kept)."""
    if isinstance(value, tuple):
        return tuple(normalised(v) for v in value)
    if isinstance(value, list):
        return [normalised(v) for v in value]
    if isinstance(value, dict):
        return {k: normalised(v) for k, v in value.items()}
    return value


def same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if (isinstance(a, list) and isinstance(b, list)) or (
            isinstance(a, tuple) and isinstance(b, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b) and type(a) is type(b)


hostile_numbers = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, -1, 1e-300, 1e300, float("nan"), float("inf"), -0.0, 2**63, True])
    | st.text(max_size=5)
    | st.none()
)
"""What a config field may be handed: NaN, infinities, huge, negative, wrong types."""

garbage_bytes = (
    st.binary(max_size=24)
    | st.sampled_from([b"", b"inf", b"-inf", b"nan", b"1e400", b"0x10", b"1.5", b"-1",
                       b"99999999999999999999", b"\xc1", b"\x92\x01", b"O", b"H", b"C",
                       b"p", b"d"])
    | st.integers(min_value=-(2**64), max_value=2**64).map(lambda n: str(n).encode())
)
"""Foreign bytes for one field of a pillar's hash: numbers out of range, bad msgpack, states."""


def hostile_or(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Half valid values (so end-to-end paths run), half :data:`hostile_numbers`."""
    return valid | hostile_numbers


def pick(data: st.DataObject, items: list[Any]) -> Any:
    """One of ``items`` (sorted first), drawn so that hypothesis sees the same choice
    whatever ``items`` holds this run (keys carry random ids: ``sampled_from`` on them
    would change its constraints between runs and fail as flaky)."""
    ordered = sorted(items)
    return ordered[data.draw(st.integers(min_value=0, max_value=999)) % len(ordered)]


def plant_drawn_garbage(raw: Any, data: st.DataObject, key: str, kind: str, blob: bytes) -> None:
    """Write ``blob`` into ONE place of ``key`` chosen by hypothesis, by the key's type.

    hash: a field the pillar wrote; zset: a known member with a drawn score, or
    a foreign member; stream: an entry like the last one with one field replaced;
    string/set/list: the value / a member / an element. Keeps the key's TTL.
    """
    if kind == "hash":
        raw.hset(key, pick(data, [f.decode() for f in raw.hkeys(key)]), blob)
    elif kind == "zset":
        members = raw.zrange(key, 0, -1)
        score = data.draw(st.floats(allow_nan=False))
        known = members and data.draw(st.booleans())
        raw.zadd(key, {pick(data, members) if known else blob: score})
    elif kind == "stream":
        entries = raw.xrange(key)
        fields = dict(entries[-1][1]) if entries else {}
        raw.xadd(key, {**fields, pick(data, list(fields) or [b"x"]): blob})
    elif kind == "string":
        raw.set(key, blob, keepttl=True)
    elif kind == "set":
        raw.sadd(key, blob)
    else:
        raw.rpush(key, blob)
