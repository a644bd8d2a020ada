"""Every script call keeps its keys in ONE Cluster slot (no CROSSSLOT), checked without Redis.

Later pillars add their ``_XxxOps`` builders to ``CALLS``; the Cluster pass of
the integration suites shows the same thing on a real cluster.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from durabilis._keys import KeySpace
from durabilis._scripts import ScriptCall
from durabilis.idempotency import IdempotencyConfig, IdempotencyKey, _IdemOps
from tests.support.slots import one_slot

KEYS = KeySpace("slot-test")
IDEM = _IdemOps(KEYS, IdempotencyConfig())
HOSTILE_KEYS = ["plain", "{tag}", "a}b{c", "%7B", "ns:idem:{x}", "é" * 40, "x" * 256]

CALLS: dict[str, Callable[[str], ScriptCall]] = {
    "idem_claim": lambda k: IDEM.claim(IdempotencyKey.from_raw(k), {"p": 1}),
    "idem_record": lambda k: IDEM.record(IdempotencyKey.from_raw(k), "r", "1"),
    "idem_release": lambda k: IDEM.release(IdempotencyKey.from_raw(k), "1"),
    "idem_check": lambda k: IDEM.check(IdempotencyKey.from_raw(k)),
}


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_every_key_of_a_script_call_is_in_one_cluster_slot(name: str, key: str) -> None:
    call = CALLS[name](key)
    assert call.name == name
    assert one_slot([str(k) for k in call.keys])


def test_a_caller_supplied_brace_cannot_move_a_record_to_another_key_or_slot() -> None:
    # Braces are escaped, so "{tag}" is its own record, not one tagged "tag".
    assert KEYS.idem("{tag}") != KEYS.idem("tag")
    assert KEYS.idem("{tag}").count("{") == 1


def test_each_birth_bucket_tag_hashes_to_its_own_slot() -> None:
    """Solved, not searched: a claim and its birth entry share one Cluster slot."""
    import redis.crc

    from durabilis._keys import CLUSTER_SLOTS, bucket_tag, hash_slot

    for slot in range(CLUSTER_SLOTS):
        tag = bucket_tag(slot, CLUSTER_SLOTS)
        assert "{" not in tag and "}" not in tag
        key = KEYS.inflight_bucket(tag)
        assert hash_slot(key) == slot == redis.crc.key_slot(key.encode())
    assert bucket_tag(3, 16) == "b3"


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_the_claim_fused_with_its_birth_entry_keeps_one_slot(key: str) -> None:
    from durabilis._keys import CLUSTER_SLOTS, bucket_tag, hash_slot
    from durabilis._scripts import fuse

    ik = IdempotencyKey.from_raw(key)
    bucket = KEYS.inflight_bucket(bucket_tag(hash_slot(KEYS.idem(ik.value)), CLUSTER_SLOTS))
    birth = ScriptCall("layer_note", [bucket, bucket], ["add", 1000, 1, f"{key}|n"])
    assert one_slot(fuse([birth, IDEM.claim(ik, None)], [False, True]).keys)


@pytest.mark.parametrize(
    "key",
    [*HOSTILE_KEYS, "", "{}", "{}x", "x{}{y}", "{a}{b}", "{{a}}", "a{b", "}{", "{é}", "\ud800{x}"],
)
def test_hash_slot_is_redis_py_s_key_slot_without_importing_it(key: str) -> None:
    """The key space computes slots itself (the core imports no redis): the
    cluster spec's rule (the first ``{...}`` with something inside), as redis-py's."""
    import redis.crc

    from durabilis._keys import hash_slot

    assert hash_slot(key) == redis.crc.key_slot(key.encode("utf-8", "surrogatepass"))
