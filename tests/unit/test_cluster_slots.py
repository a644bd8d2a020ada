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
