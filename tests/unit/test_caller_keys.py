"""A caller's key as the layer stores it, read back without Redis: its parts,
its record's name and the glob an operator's SCAN uses (issue 32)."""

from __future__ import annotations

import fnmatch

import pytest

from durabilis._keys import KeySpace
from durabilis.idempotency import IdempotencyKey


@pytest.mark.parametrize(
    ("agent", "key"),
    [("gw-1", "order-o-1"), ("gw:2", "a:b"), ("50%", "x%3Ay"), ("t{1}", "{k}*?[x]\\")],
)
def test_a_stored_caller_key_gives_back_its_agent_and_the_key_as_given(
    agent: str, key: str
) -> None:
    stored = IdempotencyKey.caller(agent, key, None)
    assert stored.caller_key == key
    assert IdempotencyKey.split_caller(stored.value) == (agent, key)
    keys = KeySpace("ns")
    name = keys.idem(stored.value)
    assert keys.idem_key_of(name) == stored.value


def test_content_keys_and_other_names_are_not_caller_keys() -> None:
    content = IdempotencyKey.new("%raw", "op", b"x")
    assert not content.is_caller_key and content.caller_key is None
    assert IdempotencyKey.split_caller(content.value) is None
    for value in ("%raw:", "%raw:agent", "%raw::key", "%raw:agent:"):
        assert IdempotencyKey(value).caller_key is None
        assert IdempotencyKey.split_caller(value) is None
    keys = KeySpace("ns")
    assert keys.idem_key_of("ns:cb:{x}") is None
    assert keys.idem_key_of("other:idem:{x}") is None
    assert fnmatch.fnmatchcase(keys.idem("%raw:gw-1:k"), keys.idem_pattern_around("%raw:", ":k"))
