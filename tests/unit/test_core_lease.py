"""The periodic chores' lease call, built and decoded without a server."""

from __future__ import annotations

from durabilis._keys import KeySpace
from durabilis.core.lease import lease_taken, period_lease


def test_the_lease_call_names_its_key_holder_and_period_in_milliseconds() -> None:
    key = KeySpace("unit").layer("lease", "recover_orphans")
    call = period_lease(key, "host:1", 2.5)
    assert call.name == "layer_lease"
    assert list(call.keys) == [key] and list(call.args) == ["host:1", 2500]


def test_a_period_under_a_millisecond_still_leases_for_one() -> None:
    assert list(period_lease("k", "h", 0.0001).args) == ["h", 1]


def test_a_reply_of_one_is_the_lease_taken_and_zero_or_nil_another_holder() -> None:
    assert lease_taken(1) and lease_taken(b"1")
    assert not lease_taken(0) and not lease_taken(None)
