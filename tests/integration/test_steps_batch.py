"""The ``Batch`` step: independent calls at once (``Store.run_many``), driven by
``drive`` and ``adrive`` against a real server. One call failing (a key holding
foreign data) stops none of the others; the plan is told of the failure."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

import durabilis
from durabilis._keys import KeySpace
from durabilis._scripts import ScriptCall
from durabilis._steps import adrive, drive
from durabilis.core.steps import Batch, Plan
from durabilis.errors import DurabilisError, NotReplicated
from durabilis.testing import isolated_namespace

# Cluster too: there the calls go to their nodes at once (Store._wave), and the
# error raised after them tells what each replied (Store.run_many).
pytestmark = pytest.mark.topologies("cluster")


def _add(keys: KeySpace, member: str) -> ScriptCall:
    """An in-flight index entry added (``layer_note``), observable afterwards."""
    return ScriptCall(
        "layer_note", [keys.layer("inflight"), keys.layer("stats")], ["add", 60_000, 1, member],
    )


def _plan(foreign: KeySpace, fine: KeySpace, seen: list[Any]) -> Plan[None]:
    try:
        seen.append((yield Batch([_add(foreign, "m-foreign"), _add(fine, "m-fine")])))
    except DurabilisError as exc:
        seen.append(exc)
    seen.append((yield Batch([_add(fine, "m-again")])))


def _planted(raw: redis.Redis) -> tuple[KeySpace, KeySpace]:
    foreign, fine = KeySpace(isolated_namespace()), KeySpace(isolated_namespace())
    raw.set(foreign.layer("inflight"), "not an index")  # foreign data: WRONGTYPE
    return foreign, fine


def _check(raw: redis.Redis, foreign: KeySpace, fine: KeySpace, seen: list[Any]) -> None:
    failed, again = seen
    assert isinstance(failed, DurabilisError)  # the plan is told ...
    # ... with what each call replied: the one that failed unknown (its own error
    # as its value: the first failure is the one raised), the other's reply
    assert failed.partial is not None and failed.partial.status == "?c"
    assert failed.partial[0] is failed and failed.partial[1] == 1
    members = {m.decode() for m in raw.zrange(fine.layer("inflight"), 0, -1)}
    assert members == {"m-fine", "m-again"}  # ... the other call ran all the same
    assert isinstance(again, list) and len(again) == 1
    assert raw.get(foreign.layer("inflight")) == b"not an index"  # left as it was


def test_a_batch_s_failing_call_stops_none_of_the_others(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    foreign, fine = _planted(raw)
    seen: list[Any] = []
    drive(_plan(foreign, fine, seen), store)
    _check(raw, foreign, fine, seen)


def test_a_batch_s_failing_call_stops_none_of_the_others_async(
    redis_url: str, namespace: str, raw: redis.Redis
) -> None:
    foreign, fine = _planted(raw)
    seen: list[Any] = []

    async def main() -> None:
        astore = durabilis.aio.connect(redis_url, namespace=namespace)
        try:
            await adrive(_plan(foreign, fine, seen), astore)
        finally:
            await astore.close()

    asyncio.run(main())
    _check(raw, foreign, fine, seen)


@pytest.mark.standalone_only  # one pipeline then one WAIT: the standalone path of run_many
def test_an_unconfirmed_batch_tells_the_plan_every_call_ran(
    store: durabilis.Store, raw: redis.Redis
) -> None:
    """``acks="replicas:1"`` with no replica: the calls ran on the primary, the
    confirmation failed. The ``NotReplicated`` raised says so (``partial``: every
    call ``c``), so the keep-alive still puts back the entries it renewed."""
    fine = KeySpace(isolated_namespace())
    acked = store.with_acks("replicas:1", timeout=0.05)
    seen: list[Any] = []

    def plan() -> Plan[None]:
        try:
            yield Batch([_add(fine, "m-1"), _add(fine, "m-2")])
        except DurabilisError as exc:
            seen.append(exc)

    drive(plan(), acked)
    [failed] = seen
    assert isinstance(failed, NotReplicated)
    assert failed.partial is not None and failed.partial.status == "cc"
    assert list(failed.partial) == [1, 1]
    assert {m.decode() for m in raw.zrange(fine.layer("inflight"), 0, -1)} == {"m-1", "m-2"}
