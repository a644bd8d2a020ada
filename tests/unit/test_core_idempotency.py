"""Idempotency's core: each ``idem_*`` call built, and each reply decoded, fed
scripted replies (no server)."""

from __future__ import annotations

import pytest

from durabilis import _codec
from durabilis._keys import KeySpace
from durabilis.core.idempotency import (
    Duplicate,
    IdemOps,
    IdempotencyConfig,
    IdempotencyKey,
    New,
)
from durabilis.errors import CorruptData, InvalidKey, KeyReuseMismatch, LeaseLost

KEYS = KeySpace("unit")
T1, T2 = 1_700_000_000_000, 1_700_000_060_000


def ops(**config: object) -> IdemOps:
    return IdemOps(KEYS, IdempotencyConfig(**config))  # type: ignore[arg-type]


def test_a_claim_names_the_key_window_lease_placeholder_fingerprint_and_nonce() -> None:
    o = ops(dedup_window_seconds=60, in_progress_ttl_seconds=2.5)
    key = IdempotencyKey.from_raw("order-1", payload={"n": 1})
    call = o.claim(key, "working", payload=b"p", nonce="n1")
    assert call.name == "idem_claim"
    assert list(call.keys) == [KEYS.idem("order-1")]
    window, lease, packed, fp, payload, nonce = call.args
    assert (window, lease, payload, nonce) == (60_000, 2_500, b"p", "n1")
    assert _codec.unpack(packed, key="k") == "working"
    assert fp == key.fingerprint and fp


def test_a_new_claim_reply_decodes_to_new_with_its_token_and_times() -> None:
    key = IdempotencyKey.from_raw("k1")
    new = ops().decode_claim(key, [b"new", b"tok-1", T1, T2, 0])
    assert isinstance(new, New) and new.is_new
    assert new.token == "tok-1" and not new.taken_over
    assert new.claimed_at is not None and int(new.claimed_at.timestamp() * 1000) == T1
    lean = ops().decode_claim(key, [b"new", b"tok-2", T1, T2, 1], times=False)
    assert isinstance(lean, New) and lean.token == "tok-2" and lean.taken_over


def test_a_duplicate_reply_carries_the_stored_result_and_its_state() -> None:
    key = IdempotencyKey.from_raw("k1")
    reply = [b"dup", b"d", _codec.pack({"ok": 1}, what="r"), T1, T2, b""]
    dup = ops().decode_claim(key, reply)
    assert isinstance(dup, Duplicate) and not dup.is_new
    assert dup.original_result == {"ok": 1} and not dup.in_progress and dup.not_stored is None
    pending = ops().decode_claim(key, [b"dup", b"p", b"", T1, T2, b"too big"])
    assert isinstance(pending, Duplicate) and pending.in_progress
    assert pending.original_result is None and pending.not_stored == "too big"


def test_a_mismatch_reply_raises_key_reuse_and_foreign_data_names_the_key() -> None:
    key = IdempotencyKey.from_raw("k1")
    with pytest.raises(KeyReuseMismatch):
        ops().decode_claim(key, [b"mismatch"])
    with pytest.raises(CorruptData) as info:
        ops().decode_claim(key, [b"corrupt", b"field s is 'zz'"])
    assert KEYS.idem("k1") in str(info.value) and "zz" in str(info.value)
    with pytest.raises(CorruptData):
        ops().decode_claim(key, 42)


def test_a_record_reply_ok_passes_and_lost_raises_lease_lost() -> None:
    key = IdempotencyKey.from_raw("k1")
    o = ops()
    call = o.record(key, {"r": 1}, "tok")
    assert call.name == "idem_record" and call.args[1] == "tok"
    assert o.decode_record(key, [b"ok"]) is None
    with pytest.raises(LeaseLost):
        o.decode_record(key, [b"lost"])


def test_a_check_reply_none_is_no_record_and_an_alias_tombstone_says_how_it_ended() -> None:
    key = IdempotencyKey.from_raw("k1")
    o = ops()
    assert list(o.check(key).args) == [] and list(o.check(key, tombstones=True).args) == ["x"]
    assert o.decode_check(key, [b"none"]) is None
    dup = o.decode_check(key, [b"dup", b"p", b"", T1, T2, 1])
    assert isinstance(dup, Duplicate) and dup.in_progress and dup.lease_expired
    assert o.decode_alias(key, [b"x"]) == "released"
    assert o.decode_alias(key, [b"x", b"1"]) == "touched"


def test_renew_decodes_its_flag_and_release_checks_the_token_first() -> None:
    key = IdempotencyKey.from_raw("k1")
    o = ops()
    assert o.decode_renew(key, [1]) is True and o.decode_renew(key, [0]) is False
    with pytest.raises(CorruptData):
        o.decode_renew(key, [b"x"])
    with pytest.raises(InvalidKey):
        o.release(key, "")
    assert list(o.release(key, None, nonce="n1").args[:2]) == ["", "n1"]


def test_keys_are_validated_before_any_call_is_built() -> None:
    o = ops(max_key_length=8)
    assert o.validate_key("short").value == "short"
    for bad in ("", "x" * 9, "\ud800"):
        with pytest.raises(InvalidKey):
            o.validate_key(bad)
    with pytest.raises(InvalidKey):
        o.validate_key(42)  # type: ignore[arg-type]
