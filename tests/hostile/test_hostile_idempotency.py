"""Hostile input against the idempotency pillar: it works, or raises a DurabilisError.

Keys of any Unicode and length, values of any msgpack shape (and of none),
oversize values, configs with NaN / negative / huge numbers, and foreign data
planted at the record keys (every Redis type, garbage in every hash field).
Nothing but a ``DurabilisError`` may escape, and Redis is left consistent:
each key is either untouched foreign data or a valid record with its TTL.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import msgpack
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import durabilis
from durabilis import ConfigError, DurabilisError, IdempotencyConfig, IdempotencyKey
from durabilis._keys import KeySpace
from durabilis._limits import MAX_KEY_LENGTH, MAX_LEASE_SECONDS
from durabilis.errors import CorruptData, InvalidKey, InvalidPayload, LeaseLost, PayloadTooLarge
from durabilis.idempotency import (
    MAX_VALUE_BYTES,
    MAX_WINDOW_SECONDS,
    Duplicate,
    IdempotencyGuard,
    New,
)
from tests.support.garbage import (
    KINDS,
    keys_of_namespace,
    plant,
    snapshot,
    untouched_or_valid,
)
from tests.support.hypo import any_text, hostile, msgpack_values, normalised, same, unencodable

pytestmark = pytest.mark.topologies("cluster")

_fresh = itertools.count()


def fresh(prefix: str = "k") -> str:
    """A key no other example of the session used."""
    return f"{prefix}-{next(_fresh)}"


def is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def valid_record(raw: Any, key: str) -> bool:
    """A record as the idempotency scripts write it, with a TTL."""
    if raw.type(key) not in (b"hash", "hash") or raw.pttl(key) <= 0:
        return False
    f = {k.decode(): v for k, v in raw.hgetall(key).items()}
    try:
        int(f["ts"]), int(f["w"])
        if f["s"] == b"p":
            int(f["le"])
            if f.get("ph"):
                msgpack.unpackb(f["ph"], raw=False, strict_map_key=False)
        elif f["s"] == b"d":
            msgpack.unpackb(f["r"], raw=False, strict_map_key=False)
        else:
            return False
    except (KeyError, ValueError, TypeError, msgpack.UnpackException):
        return False
    return "tok" in f


# --- keys -------------------------------------------------------------------------------------


@hostile(60)
@given(text=any_text, max_len=st.integers(min_value=1, max_value=400))
@example(text="\ud800 lone surrogate", max_len=400)
@example(text="{tag}:%3A{{}}\x00\n", max_len=400)
@example(text="é" * 200, max_len=400)
def test_any_unicode_key_of_any_length_works_or_raises_invalid_key_before_any_write(
    store: durabilis.Store, raw: Any, text: str, max_len: int
) -> None:
    guard = IdempotencyGuard(store, IdempotencyConfig(max_key_length=max_len))
    key = f"{next(_fresh)}:{text}"  # fresh per example, any text after the prefix
    size = len(key.encode("utf-8", "surrogatepass"))
    if not is_unicode(key) or size > max_len:
        with pytest.raises(InvalidKey):
            guard.check_and_record(key)
        if is_unicode(key):
            assert raw.exists(store.keys.idem(key)) == 0
        return
    claim = guard.check_and_record(key, placeholder=text)
    assert isinstance(claim, New) and claim.token
    guard.record(key, {"key": key}, token=claim.token)
    done = guard.check(key)
    assert done is not None and not done.in_progress and done.original_result == {"key": key}
    assert raw.pttl(store.keys.idem(key)) > 0


@hostile(60)
@given(agent=any_text, op=any_text, content=msgpack_values | unencodable | any_text)
@example(agent="a", op="b", content="\udfff")
@example(agent="a\ud800", op="b", content="x")
def test_content_keys_from_any_parts_and_content_are_built_or_refused_with_a_typed_error(
    agent: str, op: str, content: Any
) -> None:
    try:
        key = IdempotencyKey.new(agent, op, content)
    except (InvalidKey, InvalidPayload):
        return
    assert is_unicode(key.value) and key.value.count(":") >= 2
    assert key.value.rsplit(":", 1)[1].isalnum() and len(key.value.rsplit(":", 1)[1]) == 32


@hostile(30)
@given(namespace=any_text)
def test_any_namespace_is_accepted_or_a_config_error_naming_it(namespace: str) -> None:
    try:
        KeySpace(namespace)
    except ConfigError as exc:
        assert exc.field == "namespace"


# --- values -----------------------------------------------------------------------------------


@hostile(60)
@given(value=msgpack_values)
@example(value={(1, (2, b"x")): "a tuple as a map key", "nan": float("nan")})
def test_any_msgpack_value_round_trips_as_placeholder_and_as_result(
    store: durabilis.Store, value: Any
) -> None:
    guard = IdempotencyGuard(store)
    key = fresh("value")
    claim = guard.check_and_record(key, placeholder=value)
    assert isinstance(claim, New)
    seen = guard.check_and_record(key)
    assert isinstance(seen, Duplicate) and same(seen.original_result, normalised(value))
    guard.record(key, value, token=claim.token)
    done = guard.check(key)
    assert done is not None and same(done.original_result, normalised(value))


@hostile(40)
@given(value=unencodable)
def test_values_msgpack_cannot_encode_raise_invalid_payload_before_any_write(
    store: durabilis.Store, raw: Any, value: Any
) -> None:
    guard = IdempotencyGuard(store)
    key = fresh("unencodable")
    with pytest.raises(InvalidPayload):
        guard.check_and_record(key, placeholder=value)
    assert raw.exists(store.keys.idem(key)) == 0
    claim = guard.check_and_record(key, placeholder="p")
    assert isinstance(claim, New)
    with pytest.raises(InvalidPayload):
        guard.record(key, [1, {"x": value}], token=claim.token)
    still = guard.check(key)
    assert still is not None and still.in_progress and still.original_result == "p"


@hostile(20)
@given(extra=st.integers(min_value=1, max_value=4096))
def test_oversize_values_raise_payload_too_large_and_leave_the_claim_as_it_was(
    store: durabilis.Store, extra: int
) -> None:
    limit = 256
    guard = IdempotencyGuard(store, IdempotencyConfig(max_value_bytes=limit))
    key = fresh("oversize")
    big = b"x" * (limit + extra)
    with pytest.raises(PayloadTooLarge) as info:
        guard.check_and_record(key, placeholder=big)
    assert info.value.limit == limit and info.value.size > limit
    claim = guard.check_and_record(key, placeholder="small")
    assert isinstance(claim, New)
    with pytest.raises(PayloadTooLarge):
        guard.record(key, big, token=claim.token)
    still = guard.check(key)
    assert still is not None and still.in_progress and still.original_result == "small"


# --- configs ----------------------------------------------------------------------------------

numbers = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, -1, 1e-300, 1e300, float("nan"), float("inf"), -0.0, 2**63, True])
    | st.text(max_size=5)
    | st.none()
)
FIELDS = ("dedup_window_seconds", "max_key_length", "in_progress_ttl_seconds", "max_value_bytes")


@hostile(150)
@given(values=st.fixed_dictionaries({}, optional={f: numbers for f in FIELDS}),
       enabled=st.sampled_from([True, False, 1, "yes", None]))
def test_any_config_is_valid_or_a_config_error_naming_one_of_its_fields(
    values: dict[str, Any], enabled: Any
) -> None:
    try:
        cfg = IdempotencyConfig(enabled=enabled, **values)
    except ConfigError as exc:
        assert exc.field in (*FIELDS, "enabled")
        return
    for name in ("dedup_window_seconds", "in_progress_ttl_seconds"):
        value = getattr(cfg, name)
        assert math.isfinite(value) and 0.001 <= value <= MAX_WINDOW_SECONDS
    assert 1 <= cfg.max_value_bytes <= MAX_VALUE_BYTES and cfg.max_key_length >= 1


@hostile(30)
@given(window=st.floats(min_value=0.001, max_value=MAX_WINDOW_SECONDS),
       lease=st.floats(min_value=0.001, max_value=MAX_LEASE_SECONDS),
       key_len=st.integers(min_value=64, max_value=MAX_KEY_LENGTH))
def test_extreme_valid_configs_work_end_to_end_and_every_record_gets_a_ttl(
    store: durabilis.Store, raw: Any, window: float, lease: float, key_len: int
) -> None:
    cfg = IdempotencyConfig(dedup_window_seconds=window, in_progress_ttl_seconds=lease,
                            max_key_length=key_len)
    guard = IdempotencyGuard(store, cfg)
    key = fresh("extreme")
    claim = guard.check_and_record(key, placeholder="p")
    assert isinstance(claim, New)
    assert raw.pttl(store.keys.idem(key)) != -1  # a TTL (or already gone: 1 ms windows)
    try:
        guard.record(key, "r", token=claim.token)
    except LeaseLost:
        assert min(window, lease) < 1  # the record was already gone: nothing is written
    assert raw.pttl(store.keys.idem(key)) != -1
    if min(window, lease) >= 1:
        done = guard.check(key)
        assert done is not None and done.original_result == "r"


# --- foreign data at the keys -----------------------------------------------------------------


def every_call(guard: IdempotencyGuard, key: str, token: str) -> list[Any]:
    """Every public call on ``key``; each returns a value or raises a DurabilisError."""
    outcomes: list[Any] = []
    for call in (
        lambda: guard.check(key),
        lambda: guard.check_and_record(key, placeholder="mine"),
        lambda: guard.record(key, "result", token=token),
        lambda: guard.release(key, token),
        lambda: guard.record(key, "result"),
        guard.record_count,
    ):
        try:
            outcomes.append(call())
        except DurabilisError as exc:  # anything else escaping fails the test
            outcomes.append(exc)
    return outcomes


@pytest.mark.parametrize("kind", KINDS)
def test_every_redis_type_at_a_record_key_is_corrupt_data_naming_it_and_left_untouched(
    store: durabilis.Store, raw: Any, namespace: str, kind: str
) -> None:
    guard = IdempotencyGuard(store)
    claim = guard.check_and_record("victim")
    assert isinstance(claim, New) and claim.token
    keys = keys_of_namespace(raw, namespace)
    assert keys == [store.keys.idem("victim")]
    plant(raw, keys[0], kind)
    before = snapshot(raw, keys)
    outcomes = every_call(guard, "victim", claim.token)
    corrupt = [o for o in outcomes if isinstance(o, CorruptData)]
    assert len(corrupt) == 4 and all(o.key == keys[0] for o in corrupt)  # check, claim, 2 records
    assert outcomes[3] is False  # release: the token holds nothing there
    assert snapshot(raw, keys) == before


FIELD_NAMES = ("s", "tok", "ts", "le", "w", "ph", "r", "fp", "pl")
garbage_value = (
    st.binary(max_size=24)
    | st.sampled_from([b"", b"p", b"d", b"inf", b"-inf", b"nan", b"1e400", b"0x10", b"1.5",
                       b"-1", b"99999999999999999999", b"\xc1", b"\x92\x01"])
    | st.integers(min_value=-(2**64), max_value=2**64).map(lambda n: str(n).encode())
)


@hostile(80)
@given(done=st.booleans(),
       garbage=st.dictionaries(st.sampled_from(FIELD_NAMES), garbage_value, min_size=1))
def test_garbage_in_any_field_of_a_record_works_or_raises_and_leaves_redis_consistent(
    store: durabilis.Store, raw: Any, done: bool, garbage: dict[str, bytes]
) -> None:
    guard = IdempotencyGuard(store, IdempotencyConfig(in_progress_ttl_seconds=60))
    key = fresh("scrambled")
    claim = guard.check_and_record(key, placeholder="p")
    assert isinstance(claim, New) and claim.token
    if done:
        guard.record(key, "r", token=claim.token)
    rkey = store.keys.idem(key)
    raw.hset(rkey, mapping=garbage)
    before = snapshot(raw, [rkey])
    every_call(guard, key, claim.token)
    assert untouched_or_valid(raw, before, valid_record) == []
