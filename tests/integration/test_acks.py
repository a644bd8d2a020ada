"""``acks="replicas:N"``: each write script is followed by ``WAIT`` on its own
connection, in the same round trip; too few confirmations fail the step closed.

The same tests on every backend: the session's standalone server has no
replica, the local Cluster one per primary, the Sentinel topology two. Asking
for one more than there are is the "replicas did not confirm in time" case,
made certain (docs/operations.md, "Acknowledgements").
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durabilis
from durabilis import DurabilityLayer
from durabilis.errors import NotReplicated
from durabilis.layer import AsyncDurabilityLayer
from tests.integration._layer_support import Counter, fast_config
from tests.support.backends import keys_matching

pytestmark = pytest.mark.topologies("cluster", "sentinel")

REPLICAS = {"standalone": 0, "cluster": 1, "sentinel": 2}
"""Replicas of each key's primary on each test backend."""


def _waits(raw: Any, backend: str) -> int:
    """``WAIT`` commands the data nodes have run (every primary's on Cluster)."""
    if backend == "cluster":
        per_node = raw.info("commandstats", target_nodes=raw.get_primaries())
        return sum(int(stats.get("cmdstat_wait", {}).get("calls", 0))
                   for stats in per_node.values())
    return int(raw.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def test_a_write_counts_once_the_replicas_asked_for_confirm_it(
    redis_url: str, namespace: str, raw: Any, backend: str
) -> None:
    have = REPLICAS[backend]
    store = durabilis.connect(redis_url, namespace=namespace)
    layer = DurabilityLayer(store, fast_config(acks=f"replicas:{max(have, 1)}"))
    op = Counter()
    try:
        assert layer.store.acks == f"replicas:{max(have, 1)}" and store.acks == "primary"
        if have == 0:  # nothing can confirm it: refused, nothing ran, the key stays free
            with pytest.raises(NotReplicated) as info:
                layer.execute("a1", "job", "p", op)
            assert (info.value.acked, info.value.wanted) == (0, 1)
            assert op.calls == []
            assert DurabilityLayer(store, fast_config()).execute("a1", "job", "p", op) == "done"
            assert len(op.calls) == 1
            return
        before = _waits(raw, backend)
        assert layer.execute("a1", "job", "p", op, task_id="t", phase="one") == "done"
        # the claim step and the record step (record + report + checkpoint) each
        # waited; on Cluster each script of a step waits on its own node
        assert _waits(raw, backend) - before >= 2
        assert layer.execute("a1", "job", "p", op) == "done"  # a duplicate: no second run
        assert len(op.calls) == 1
    finally:
        layer.close()
        store.close()


def test_too_few_confirmations_fail_the_claim_closed(
    redis_url: str, namespace: str, raw: Any, backend: str
) -> None:
    store = durabilis.connect(redis_url, namespace=namespace)
    wanted = REPLICAS[backend] + 1
    strict = DurabilityLayer(store, fast_config(acks=f"replicas:{wanted}",
                                                acks_timeout_seconds=0.05))
    op = Counter()
    try:
        with pytest.raises(NotReplicated) as info:
            strict.execute("a1", "job", "p", op)
        assert info.value.wanted == wanted and info.value.acked < wanted
        assert op.calls == []  # the claim was not used: nothing ran
        # released on the primary: the next delivery runs it at once, exactly once
        plain = DurabilityLayer(store, fast_config())
        assert plain.execute("a1", "job", "p", op) == "done"
        assert plain.execute("a1", "job", "p", op) == "done"
        assert len(op.calls) == 1
        assert strict.dlq.stats().total == 0  # a refusal, not a parked operation
        plain.close()
    finally:
        strict.close()
        store.close()


def test_reads_need_no_confirmation(redis_url: str, namespace: str, backend: str) -> None:
    """An operator reads the DLQ, the breakers and the counters while replicas lag."""
    store = durabilis.connect(redis_url, namespace=namespace)
    strict = store.with_acks(f"replicas:{REPLICAS[backend] + 1}", timeout=0.05)
    layer = DurabilityLayer(strict, fast_config())
    try:
        assert layer.dlq.stats().total == 0
        assert layer.dlq.list_pending() == []
        assert layer.stats().started == 0
        assert layer.breakers.state("svc").value == "closed"
    finally:
        layer.close()
        store.close()


def test_dlq_records_and_checkpoints_wait_for_the_replicas_too(
    redis_url: str, namespace: str, raw: Any, backend: str
) -> None:
    have = REPLICAS[backend]
    store = durabilis.connect(redis_url, namespace=namespace,
                              acks=f"replicas:{have + 1}", acks_timeout=0.05)
    try:
        with pytest.raises(NotReplicated):
            durabilis.dlq.DeadLetterQueue(store).enqueue("a1", "job", {"x": 1}, 3, "boom")
        with pytest.raises(NotReplicated):
            durabilis.checkpoint.CheckpointManager(store).save("task-1", "a1", "phase-1", {"k": 1})
        if have:
            confirmed = store.with_acks(f"replicas:{have}")
            before = _waits(raw, backend)
            dlq_id = durabilis.dlq.DeadLetterQueue(confirmed).enqueue(
                "a1", "job", {"x": 1}, 3, "boom")
            record = durabilis.dlq.DeadLetterQueue(store).get(dlq_id)
            assert record is not None and record.last_error == "boom"
            saved = durabilis.checkpoint.CheckpointManager(confirmed).save(
                "task-1", "a1", "phase-1", {"k": 1})
            assert saved.phase == "phase-1"
            assert _waits(raw, backend) - before >= 2
    finally:
        store.close()


def test_the_async_twin_fails_closed_and_confirms_alike(
    redis_url: str, namespace: str, backend: str, raw: Any
) -> None:
    have = REPLICAS[backend]
    batches: list[int] = []
    refused_waits: list[int] = []

    async def main() -> list[str]:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        strict = AsyncDurabilityLayer(store, fast_config(acks=f"replicas:{have + 1}",
                                                         acks_timeout_seconds=0.05))
        ran: list[str] = []

        async def op(ctx: Any) -> str:
            ran.append(ctx.idempotency_key)
            return "done"

        try:
            with pytest.raises(NotReplicated):
                await strict.execute("a1", "job", "p", op)
            assert ran == []
            # (the refused claim and its undo, each refused too, and their resends)
            refused_waits.append(_waits(raw, backend))
            if have:
                layer = AsyncDurabilityLayer(store, fast_config(acks=f"replicas:{have}"))
                # many at once: the scripts of a batch share ONE WAIT at its end
                sent = store.autopipe.batches if store.autopipe is not None else 0
                done = await asyncio.gather(
                    *(layer.execute("a1", "job", f"p{i}", op) for i in range(50)))
                assert done == ["done"] * 50
                if store.autopipe is not None:
                    batches.append(store.autopipe.batches - sent)
                await layer.close()
            return ran
        finally:
            await strict.close()
            await store.close()

    assert len(asyncio.run(main())) == (50 if have else 0)
    if batches:  # standalone / Sentinel (auto-pipelined): at most one WAIT a batch
        waited = _waits(raw, backend) - refused_waits[0]
        assert 0 < waited <= batches[0]
        assert waited < 100  # 50 calls, 2 confirmed steps each


def test_fsync_acks_on_a_redis_without_waitaof_is_refused_before_any_write(
    redis_url: str, namespace: str, raw: Any
) -> None:
    """``+fsync`` (``WAITAOF``) needs Redis >= 7.2: on an older server the first call
    is refused with the reason, before a script is sent; on a newer one it runs."""
    store = durabilis.connect(redis_url, namespace=namespace, acks="primary+fsync")
    op = Counter()
    version = tuple(int(p) for p in str(raw.info("server")["redis_version"]).split(".")[:2])
    try:
        layer = DurabilityLayer(store, fast_config())
        if version >= (7, 2):  # (not this machine's Redis: 7.0)
            layer.execute("a1", "job", "p", op)
            assert len(op.calls) == 1
            return
        with pytest.raises(durabilis.ConfigError, match=r"WAITAOF \(Redis >= 7.2\)"):
            layer.execute("a1", "job", "p", op)
        assert op.calls == []
        assert keys_matching(raw, f"{namespace}:*") == []  # nothing written

        async def twin() -> None:
            astore = durabilis.aio.connect(redis_url, namespace=namespace,
                                           acks="replicas:1+fsync")
            try:
                with pytest.raises(durabilis.ConfigError, match="WAITAOF"):
                    await AsyncDurabilityLayer(astore, fast_config()).execute(
                        "a1", "job", "p", op)
            finally:
                await astore.close()

        asyncio.run(twin())
        assert op.calls == [] and keys_matching(raw, f"{namespace}:*") == []
    finally:
        store.close()
