"""The waves of an unfused step (Redis Cluster; docs/layer.md, "Steps and round trips").

The calls of one wave are all sent, a wave only after the one before it
answered, and after a wave with a gated refusal or a failure no later wave is
sent; ``exc.partial`` says what each call did. On a standalone server the
same code path runs with fusing off (calls one by one); on Cluster the calls
of a wave go concurrently, each to its node (the last test shows it).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import durabilis
from durabilis import CorruptData, IdempotencyGuard
from durabilis._scripts import ScriptCall


def claims(store: durabilis.Store, *names: str) -> list[ScriptCall]:
    ops = IdempotencyGuard(store)._ops
    return [ops.claim(ops.validate_key(name), None) for name in names]


def state(raw: Any, store: durabilis.Store, name: str) -> bytes | None:
    value = raw.hget(store.keys.idem(name), "s")
    return value if isinstance(value, bytes) else None


def refused(reply: Any) -> bool:
    return bool(reply[0] != b"new")


def test_a_failure_in_a_wave_lets_its_other_calls_run_and_sends_no_later_wave(
    store: durabilis.Store, raw: Any, namespace: str
) -> None:
    store._fuse = False  # the Cluster code path (a no-op on Cluster)
    a, c = claims(store, "wave-a", "wave-c")
    planted = f"{namespace}:x:{{layer}}:planted"  # the layer's slot: a two-key script
    raw.set(planted, "not a sorted set")
    bad = ScriptCall("layer_note", [planted, store.keys.layer("stats")], ["add", 1000, 1, "m"])
    with pytest.raises(CorruptData) as caught:
        store.run_step([bad, a, c], waves=[0, 0, 1])
    partial = caught.value.partial
    assert partial is not None and partial.status == "?cn"
    assert state(raw, store, "wave-a") == b"p"  # beside the failure: ran
    assert state(raw, store, "wave-c") is None  # the next wave: never sent


def test_a_gated_refusal_ends_the_step_after_its_wave(
    store: durabilis.Store, raw: Any
) -> None:
    store._fuse = False
    a, b, c = claims(store, "gate-a", "gate-b", "gate-c")
    store.run(a)  # a second claim of gate-a is refused
    replies = store.run_step([a, b, c], gates={0: refused}, waves=[0, 0, 1])
    assert replies.status == "rcn"
    assert state(raw, store, "gate-b") == b"p"
    assert state(raw, store, "gate-c") is None
    replies = store.run_step(claims(store, "gate-d", "gate-e"), gates={0: refused}, waves=[0, 1])
    assert replies.status == "cc"


def test_waves_must_name_every_call(store: durabilis.Store) -> None:
    store._fuse = False
    with pytest.raises(ValueError, match="waves"):
        store.run_step(claims(store, "w-1", "w-2"), waves=[0])


@pytest.mark.cluster_only
def test_on_cluster_the_calls_of_a_wave_go_at_once(
    store: durabilis.Store, raw: Any
) -> None:
    """One node stalls its writes: the other call of the wave lands meanwhile."""
    slow = "slow-0"
    node = raw.get_node_from_key(store.keys.idem(slow))
    fast = next(f"fast-{i}" for i in range(1000)
                if raw.get_node_from_key(store.keys.idem(f"fast-{i}")) != node)
    calls = claims(store, slow, fast)
    store.run_step(claims(store, "warm-1", "warm-2"), waves=[0, 0])  # scripts loaded
    raw.execute_command("CLIENT", "PAUSE", 1500, "WRITE", target_nodes=node)
    out: list[Any] = []
    began = time.monotonic()
    step = threading.Thread(target=lambda: out.append(store.run_step(calls, waves=[0, 0])))
    step.start()
    while state(raw, store, fast) is None and time.monotonic() - began < 5:
        time.sleep(0.01)
    landed = time.monotonic() - began
    step.join(10)
    assert landed < 1.0, "the second call waited for the first one's node"
    assert out and out[0].status == "cc"
    assert time.monotonic() - began >= 1.2  # the first call did wait for its node
