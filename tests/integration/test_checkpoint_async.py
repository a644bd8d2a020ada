"""The asyncio twin: the same behaviours through AsyncCheckpointManager and AsyncTaskRun."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import durabilis
from durabilis.checkpoint import NO_CHECKPOINT, AsyncCheckpointManager, CheckpointConfig
from durabilis.errors import CheckpointConflict, CheckpointNotFound, InvalidTtl

pytestmark = pytest.mark.topologies("cluster")


def run(redis_url: str, namespace: str, body: Any, config: CheckpointConfig | None = None) -> Any:
    async def main() -> Any:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        try:
            return await body(AsyncCheckpointManager(store, config))
        finally:
            await store.close()

    return asyncio.run(main())


def test_async_save_restore_history_fork_rewind_clear_and_count(
    redis_url: str, namespace: str
) -> None:
    async def body(m: AsyncCheckpointManager) -> None:
        with pytest.raises(InvalidTtl):
            await m.save("t", "a", "p", 1, ttl_seconds=0)
        one = await m.save("t", "a", "p1", {"v": 1}, expected_checkpoint_id=NO_CHECKPOINT)
        two = await m.save("t", "a", "p2", {"v": 2}, expected_checkpoint_id=one.checkpoint_id)
        with pytest.raises(CheckpointConflict):
            await m.save("t", "a", "p3", 3, expected_checkpoint_id=one.checkpoint_id)
        assert await m.restore("t", "a") == two
        assert await m.restore("t", "a", "p1") == one
        assert await m.get_by_id(two.checkpoint_id) == two
        assert await m.history("t", "a") == [two, one]
        fork = await m.fork(two.checkpoint_id, "t2")
        assert fork.parent_checkpoint_id == two.checkpoint_id
        assert await m.restore("t2", "a") == fork
        back = await m.rewind("t", one.checkpoint_id)
        assert (await m.restore("t", "a")).state == {"v": 1}
        assert back.parent_checkpoint_id == one.checkpoint_id
        with pytest.raises(CheckpointNotFound):
            await m.rewind("t", fork.checkpoint_id)
        assert await m.count() == 3
        assert await m.clear_task("t") == 2
        assert await m.count() == 1
        with pytest.raises(CheckpointNotFound):
            await m.get_by_id(one.checkpoint_id)
        with pytest.raises(CheckpointNotFound):
            await m.restore("t", "a")

    run(redis_url, namespace, body)


def test_async_cap_eviction_keeps_the_newest(redis_url: str, namespace: str) -> None:
    async def body(m: AsyncCheckpointManager) -> None:
        saved = [await m.save(f"t{i}", "a", "p", i) for i in range(5)]
        assert await m.count() == 2
        assert [(await m.restore(c.task_id, "a")).state for c in saved[3:]] == [3, 4]
        with pytest.raises(CheckpointNotFound):
            await m.restore("t2", "a")

    run(redis_url, namespace, body, CheckpointConfig(max_checkpoints=2))


def test_async_lineage_cap_bounds_the_records_history_and_the_resume(
    redis_url: str, namespace: str
) -> None:
    async def body(m: AsyncCheckpointManager) -> None:
        await m.save("t", "a", "fetch", "pages")
        for i in range(50):
            await m.save("t", "a", "loop", i)
        assert [h.state for h in await m.history("t", "a")] == [49, 48, 47, 46, "pages"]
        assert len(await m.history("t", "a", limit=100)) == 5
        async with m.task("t", "a") as run:
            assert await run.phase("fetch", lambda: pytest.fail("ran again")) == "pages"

    run(redis_url, namespace, body, CheckpointConfig(max_lineage_per_task=5))


def test_async_task_run_skips_completed_phases_and_awaits_async_phases(
    redis_url: str, namespace: str
) -> None:
    ran: list[str] = []

    async def fetch() -> Any:
        ran.append("fetch")
        await asyncio.sleep(0)
        return (1, 2)

    def parse() -> Any:
        ran.append("parse")
        return {"ok": True}

    async def body(m: AsyncCheckpointManager) -> None:
        async with m.task("job", "agent") as r:
            assert await r.phase("fetch", fetch) == (1, 2)
        async with m.task("job", "agent") as r:
            assert set(r.completed) == {"fetch"}
            assert await r.phase("fetch", fetch) == (1, 2)
            assert await r.phase("parse", parse) == {"ok": True}
        lazy = m.task("job", "agent")
        assert await lazy.phase("parse", parse) == {"ok": True}
        assert [h.phase for h in await m.history("job", "agent")] == ["parse", "fetch"]

    run(redis_url, namespace, body)
    assert ran == ["fetch", "parse"]


def test_a_run_cancelled_while_a_plain_phase_runs_saves_its_result_first(
    redis_url: str, namespace: str
) -> None:
    # A plain fn runs in a worker thread and is waited for: its result is
    # saved, then the cancellation is raised (the phase is not run again).
    ran: list[str] = []

    def charge() -> str:
        time.sleep(0.3)
        ran.append("charge")
        return "charged"

    async def body(m: AsyncCheckpointManager) -> None:
        async with m.task("job", "agent") as r:
            with pytest.raises(asyncio.TimeoutError):  # (wait_for's cancellation)
                await asyncio.wait_for(r.phase("charge", charge), timeout=0.1)
        async with m.task("job", "agent") as resumed:
            assert await resumed.phase("charge", charge) == "charged"
        assert ran == ["charge"]

    run(redis_url, namespace, body)
