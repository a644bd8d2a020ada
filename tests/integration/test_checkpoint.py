"""Checkpoint pillar against a real Redis: the seed's behaviours and durabilis's fixes."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

import durabilis
from durabilis.checkpoint import (
    NO_CHECKPOINT,
    CheckpointConfig,
    CheckpointManager,
)
from durabilis.errors import (
    CheckpointConflict,
    CheckpointNotFound,
    CorruptData,
    InvalidTtl,
)
from tests.support.lossy import lose_replies
from tests.support.waits import wait_until

pytestmark = pytest.mark.topologies("cluster")


@pytest.fixture
def mgr(store: durabilis.Store) -> CheckpointManager:
    return CheckpointManager(store)


def ckpt_keys(raw: redis.Redis, namespace: str, tail: str = "*") -> list[str]:
    return sorted(k.decode() for k in raw.scan_iter(match=f"{namespace}:ckpt:{{ckpt}}:{tail}"))


# --- the seed's behaviours ----------------------------------------------------------


def test_save_returns_every_field(mgr: CheckpointManager) -> None:
    before = datetime.now(UTC)
    cp = mgr.save("task-123", "agent-1", "phase-2", {"step": 2, "items": [1, 2]}, ttl_seconds=3600)
    assert len(cp.checkpoint_id) == 32
    assert (cp.task_id, cp.agent_id, cp.phase) == ("task-123", "agent-1", "phase-2")
    assert cp.state == {"step": 2, "items": [1, 2]}
    assert cp.created_at.tzinfo is not None
    assert abs(cp.created_at - before) < timedelta(seconds=5)
    assert cp.expires_at - cp.created_at == timedelta(seconds=3600)
    assert cp.parent_checkpoint_id is None


def test_save_without_ttl_uses_the_default_ttl(store: durabilis.Store) -> None:
    mgr = CheckpointManager(store, CheckpointConfig(default_ttl_seconds=120))
    cp = mgr.save("t", "a", "p", 1)
    assert cp.expires_at - cp.created_at == timedelta(seconds=120)


def test_ttl_zero_raises_invalid_ttl_and_writes_nothing(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    with pytest.raises(InvalidTtl):
        mgr.save("t", "a", "p", 1, ttl_seconds=0)
    assert mgr.count() == 0
    assert ckpt_keys(raw, namespace) == []


def test_phases_are_independent(mgr: CheckpointManager) -> None:
    mgr.save("t", "a", "phase-1", "one")
    mgr.save("t", "a", "phase-2", "two")
    mgr.save("t", "a", "phase-1", "one again")
    assert mgr.restore("t", "a", "phase-1").state == "one again"
    assert mgr.restore("t", "a", "phase-2").state == "two"
    assert mgr.count() == 2


def test_restore_without_phase_returns_the_newest_across_phases(mgr: CheckpointManager) -> None:
    mgr.save("t", "a", "phase-1", 1)
    newest = mgr.save("t", "a", "phase-2", 2)
    assert mgr.restore("t", "a") == newest
    again = mgr.save("t", "a", "phase-1", 3)
    assert mgr.restore("t", "a") == again


def test_restore_of_unknown_task_or_phase_raises_not_found(mgr: CheckpointManager) -> None:
    with pytest.raises(CheckpointNotFound):
        mgr.restore("nope", "a")
    mgr.save("t", "a", "phase-1", 1)
    with pytest.raises(CheckpointNotFound):
        mgr.restore("t", "a", "phase-9")


def test_restore_for_another_agent_raises_not_found(mgr: CheckpointManager) -> None:
    mgr.save("t", "agent-1", "p", 1)
    with pytest.raises(CheckpointNotFound):
        mgr.restore("t", "agent-2")


def test_clear_task_returns_how_many_current_checkpoints_it_removed(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    mgr.save("t", "a", "p1", 1)
    replaced = mgr.save("t", "a", "p2", 2)
    mgr.save("t", "a", "p2", 3)
    mgr.save("t", "b", "p1", 4)
    other = mgr.save("other", "a", "p1", 5)
    assert mgr.clear_task("t") == 3
    assert mgr.count() == 1
    with pytest.raises(CheckpointNotFound):
        mgr.restore("t", "a")
    with pytest.raises(CheckpointNotFound):
        mgr.get_by_id(replaced.checkpoint_id)  # replaced lineage records go too
    assert mgr.restore("other", "a") == other
    assert not [k for k in ckpt_keys(raw, namespace) if ":task:t" in k]
    assert mgr.clear_task("t") == 0


def test_cap_eviction_keeps_the_newest(
    store: durabilis.Store, raw: redis.Redis, namespace: str
) -> None:
    mgr = CheckpointManager(store, CheckpointConfig(max_checkpoints=3))
    saved = [mgr.save(f"task-{i}", "a", "p", i) for i in range(5)]
    assert mgr.count() == 3
    for old in saved[:2]:
        with pytest.raises(CheckpointNotFound):
            mgr.get_by_id(old.checkpoint_id)
        with pytest.raises(CheckpointNotFound):
            mgr.restore(old.task_id, "a")
    for new in saved[2:]:
        assert mgr.restore(new.task_id, "a") == new
    assert len(ckpt_keys(raw, namespace, "rec:*")) == 3
    # the evicted tasks' indexes were cleaned in the same step, not left behind
    assert len(ckpt_keys(raw, namespace, "task:*")) == 3


def test_cap_eviction_works_for_a_manager_that_never_saw_the_victims(
    store: durabilis.Store, redis_url: str, namespace: str
) -> None:
    cfg = CheckpointConfig(max_checkpoints=4)
    first = CheckpointManager(store, cfg)
    for i in range(4):
        first.save(f"t{i}", "a", "p", i)
    with durabilis.connect(redis_url, namespace=namespace) as other_store:
        fresh = CheckpointManager(other_store, cfg)
        fresh.save("new", "a", "p", "x")
        assert fresh.count() == 4
    with pytest.raises(CheckpointNotFound):
        first.restore("t0", "a")


def test_lowering_the_cap_evicts_several_oldest_in_one_save(store: durabilis.Store) -> None:
    CheckpointManager(store, CheckpointConfig(max_checkpoints=10)).save("t0", "a", "p", 0)
    big = CheckpointManager(store, CheckpointConfig(max_checkpoints=10))
    for i in range(1, 8):
        big.save(f"t{i}", "a", "p", i)
    small = CheckpointManager(store, CheckpointConfig(max_checkpoints=3))
    small.save("t8", "a", "p", 8)
    assert small.count() == 3
    assert [small.restore(f"t{i}", "a").state for i in (6, 7, 8)] == [6, 7, 8]
    with pytest.raises(CheckpointNotFound):
        small.restore("t5", "a")


def test_get_by_id(mgr: CheckpointManager) -> None:
    cp = mgr.save("t", "a", "p", {"x": 1})
    assert mgr.get_by_id(cp.checkpoint_id) == cp
    with pytest.raises(CheckpointNotFound):
        mgr.get_by_id("0" * 32)


def test_fork_copies_under_a_new_id_with_parent_and_starts_a_new_lineage(
    store: durabilis.Store,
) -> None:
    mgr = CheckpointManager(store, CheckpointConfig(default_ttl_seconds=500))
    src = mgr.save("t", "agent-1", "phase-2", {"branch": "main"}, ttl_seconds=60)
    fork = mgr.fork(src.checkpoint_id, "t-alt")
    assert fork.checkpoint_id != src.checkpoint_id
    assert fork.parent_checkpoint_id == src.checkpoint_id
    assert (fork.task_id, fork.agent_id, fork.phase) == ("t-alt", "agent-1", "phase-2")
    assert fork.state == {"branch": "main"}
    assert fork.expires_at - fork.created_at == timedelta(seconds=500)  # the default TTL
    assert mgr.restore("t-alt", "agent-1") == fork
    assert mgr.restore("t", "agent-1") == src  # the source task is untouched
    nxt = mgr.save("t-alt", "agent-1", "phase-3", {"branch": "alt"})
    assert nxt.parent_checkpoint_id == fork.checkpoint_id
    assert [c.checkpoint_id for c in mgr.history("t-alt", "agent-1")] == [
        nxt.checkpoint_id, fork.checkpoint_id, src.checkpoint_id,
    ]


def test_fork_of_an_unknown_checkpoint_raises_not_found(mgr: CheckpointManager) -> None:
    with pytest.raises(CheckpointNotFound):
        mgr.fork("0" * 32, "t2")


def test_rewind_restores_an_earlier_snapshot(mgr: CheckpointManager) -> None:
    first = mgr.save("t", "a", "phase-1", {"v": 1})
    mgr.save("t", "a", "phase-2", {"v": 2})
    mgr.save("t", "a", "phase-3", {"v": 3})
    back = mgr.rewind("t", first.checkpoint_id)
    assert back.parent_checkpoint_id == first.checkpoint_id
    assert (back.phase, back.state) == ("phase-1", {"v": 1})
    assert mgr.restore("t", "a") == back
    assert mgr.restore("t", "a", "phase-1") == back
    # the replaced original stays reachable by id for lineage
    assert mgr.get_by_id(first.checkpoint_id) == first


def test_rewind_to_a_checkpoint_of_another_task_is_not_found(mgr: CheckpointManager) -> None:
    mine = mgr.save("t", "a", "p", 1)
    theirs = mgr.save("other", "a", "p", 2)
    with pytest.raises(CheckpointNotFound):
        mgr.rewind("t", theirs.checkpoint_id)
    assert mgr.restore("t", "a") == mine


# --- lineage ----------------------------------------------------------------------------


def test_history_walks_through_replaced_records(mgr: CheckpointManager) -> None:
    a = mgr.save("t", "a", "loop", 1)
    b = mgr.save("t", "a", "loop", 2)
    c = mgr.save("t", "a", "loop", 3)
    assert mgr.count() == 1
    assert [h.state for h in mgr.history("t", "a")] == [3, 2, 1]
    assert c.parent_checkpoint_id == b.checkpoint_id
    assert b.parent_checkpoint_id == a.checkpoint_id
    assert mgr.get_by_id(a.checkpoint_id).state == 1
    assert len(mgr.history("t", "a", limit=2)) == 2
    assert mgr.history("t", "nobody") == []


def test_replaced_record_keeps_its_own_ttl(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    old = mgr.save("t", "a", "p", 1, ttl_seconds=50)
    mgr.save("t", "a", "p", 2, ttl_seconds=5000)
    pttl = raw.pttl(f"{namespace}:ckpt:{{ckpt}}:rec:{old.checkpoint_id}")
    assert 0 < pttl <= 50_000


def test_lineage_ends_at_an_expired_ancestor(mgr: CheckpointManager) -> None:
    mgr.save("t", "a", "p1", 1, ttl_seconds=0.2)
    mid = mgr.save("t", "a", "p2", 2)
    top = mgr.save("t", "a", "p3", 3)
    time.sleep(0.3)
    assert mgr.history("t", "a") == [top, mid]


# --- the lineage cap (max_lineage_per_task) ------------------------------------------------


def count_scripts(store: durabilis.Store, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts every script the store runs, by name (a fused step by its bodies).

    Steps and, on Cluster, ``run_many`` go through ``Store.run``; a standalone
    ``run_many`` is one pipeline.
    """
    seen: Counter[str] = Counter()
    run, run_many = store.run, store.run_many

    def one(call: Any) -> Any:
        name = str(call.name)
        seen.update(name.removeprefix("fused:").split("+"))
        return run(call)

    def many(calls: Any) -> Any:
        if not store.is_cluster:
            seen.update(c.name for c in calls)
        return run_many(calls)

    monkeypatch.setattr(store, "run", one)
    monkeypatch.setattr(store, "run_many", many)
    return seen


def records(raw: redis.Redis, namespace: str) -> list[str]:
    return ckpt_keys(raw, namespace, "rec:*")


def test_3000_saves_of_one_task_keep_at_most_the_lineage_cap_and_every_walk_reads_no_more(
    store: durabilis.Store, raw: redis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mgr = CheckpointManager(store)
    cap = mgr.config.max_lineage_per_task
    assert cap == 100
    mgr.save("job", "agent", "fetch", "pages")
    seen = count_scripts(store, monkeypatch)
    for i in range(3000):
        mgr.save("job", "agent", "progress", i)
    # one round trip per save: each reply names the records the next save deletes
    assert seen["ckpt_save"] <= 3000 + 1
    assert len(records(raw, namespace)) == cap
    assert raw.zcard(f"{namespace}:ckpt:{{ckpt}}:task:job:replaced") == cap - 2

    seen.clear()
    history = mgr.history("job", "agent")
    # the deleted records are spliced out: the lineage still reaches the first phase
    assert [h.state for h in history] == [*range(2999, 2999 - (cap - 1), -1), "pages"]
    assert seen["ckpt_get"] <= cap
    assert len(mgr.history("job", "agent", limit=10 * cap)) == cap
    assert len(mgr.history("job", "agent", limit=5)) == 5

    seen.clear()
    started = time.perf_counter()
    with mgr.task("job", "agent") as run:
        assert run.phase("fetch", lambda: pytest.fail("a completed phase ran again")) == "pages"
        assert run.completed["progress"].state == 2999
    assert seen["ckpt_get"] <= cap
    assert time.perf_counter() - started < 0.5
    for key in records(raw, namespace):
        assert raw.pttl(key) > 0


def test_the_lineage_cap_counts_every_agent_and_phase_of_the_task(
    store: durabilis.Store, raw: redis.Redis, namespace: str
) -> None:
    mgr = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=6))
    for i in range(30):
        mgr.save("t", "a", f"p{i % 3}", i)
        mgr.save("t", "b", "q", i)
        mgr.save("other", "a", "p", i)  # another task: its own cap
    assert len([k for k in records(raw, namespace)]) == 6 + 6
    # a(29) -> b(28) -> a(28) -> b(27) -> a(27) -> b(26): deleted, and a(27) is a
    # current checkpoint: relinked past the deleted records, to nothing older
    assert [h.state for h in mgr.history("t", "a")] == [29, 28, 28, 27, 27]
    assert len(mgr.history("other", "a")) == 6
    assert {c.phase for c in mgr.list_current("t")} == {"p0", "p1", "p2", "q"}


def test_a_fresh_manager_at_the_lineage_cap_saves_in_two_round_trips_then_one(
    store: durabilis.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = CheckpointConfig(max_lineage_per_task=5)
    for i in range(10):
        CheckpointManager(store, config).save("t", "a", "p", i)
    fresh = CheckpointManager(store, config)
    seen = count_scripts(store, monkeypatch)
    fresh.save("t", "a", "p", 10)
    assert seen["ckpt_save"] == 2  # "miss": told which records to delete, sent again
    fresh.save("t", "a", "p", 11)
    assert seen["ckpt_save"] == 3
    assert [h.state for h in fresh.history("t", "a")] == [11, 10, 9, 8, 7]


def test_a_lowered_lineage_cap_shrinks_a_longer_lineage_by_at_most_32_records_per_save(
    store: durabilis.Store, raw: redis.Redis, namespace: str
) -> None:
    wide = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=1000))
    for i in range(200):
        wide.save("t", "a", "p", i)
    assert len(records(raw, namespace)) == 200
    narrow = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=10))
    sizes = []
    for i in range(200, 208):
        narrow.save("t", "a", "p", i)
        sizes.append(len(records(raw, namespace)))
    assert sizes == [169, 138, 107, 76, 45, 14, 10, 10]
    assert [h.state for h in narrow.history("t", "a")] == list(range(207, 197, -1))


def test_a_lineage_cap_below_the_current_checkpoints_keeps_them_and_no_replaced_record(
    store: durabilis.Store, raw: redis.Redis, namespace: str
) -> None:
    mgr = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=2))
    first = mgr.save("t", "a", "one", 1)
    for i in range(5):
        latest = mgr.save("t", "a", "two", i)
    assert len(records(raw, namespace)) == 2
    assert latest.parent_checkpoint_id == first.checkpoint_id  # the replaced parent is gone
    assert [h.state for h in mgr.history("t", "a")] == [4, 1]
    mgr.save("t", "a", "three", 3)  # current checkpoints are never deleted by this cap
    assert len(records(raw, namespace)) == 3
    assert [c.phase for c in mgr.list_current("t")] == ["three", "two", "one"]
    one = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=1))
    solo = one.save("solo", "a", "p", 0)
    again = one.save("solo", "a", "p", 1)
    assert again.parent_checkpoint_id is None
    with pytest.raises(CheckpointNotFound):
        one.get_by_id(solo.checkpoint_id)


def test_the_lineage_cap_never_deletes_a_rewinds_source(mgr: CheckpointManager) -> None:
    small = CheckpointManager(mgr.store, CheckpointConfig(max_lineage_per_task=3))
    a = small.save("t", "x", "p", "a")
    b = small.save("t", "x", "p", "b")
    small.save("t", "x", "p", "c")
    copy = small.rewind("t", a.checkpoint_id)  # a is the oldest replaced record
    assert copy.parent_checkpoint_id == a.checkpoint_id
    assert small.get_by_id(a.checkpoint_id).state == "a"
    with pytest.raises(CheckpointNotFound):
        small.get_by_id(b.checkpoint_id)
    assert [h.state for h in small.history("t", "x")] == ["a", "a"]


# --- expiry ------------------------------------------------------------------------------


def test_expired_checkpoint_is_not_restored_counted_or_indexed(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    keep = mgr.save("t", "a", "p1", 1)
    gone = mgr.save("t", "a", "p2", 2, ttl_seconds=0.6)
    assert mgr.restore("t", "a") == gone
    time.sleep(0.7)
    assert mgr.restore("t", "a") == keep
    with pytest.raises(CheckpointNotFound):
        mgr.restore("t", "a", "p2")
    with pytest.raises(CheckpointNotFound):
        mgr.get_by_id(gone.checkpoint_id)
    assert mgr.count() == 1
    index = f"{namespace}:ckpt:{{ckpt}}:task:t"
    assert raw.hlen(index) == 1  # the dead entry was dropped by the read
    assert raw.zcard(f"{namespace}:ckpt:{{ckpt}}:live") == 1  # and pruned by count()


def test_an_expired_latest_no_longer_satisfies_expected(mgr: CheckpointManager) -> None:
    cp = mgr.save("t", "a", "p", 1, ttl_seconds=0.2)
    time.sleep(0.3)
    with pytest.raises(CheckpointConflict) as err:
        mgr.save("t", "a", "p", 2, expected_checkpoint_id=cp.checkpoint_id)
    assert err.value.actual is None
    assert mgr.save("t", "a", "p", 2, expected_checkpoint_id=NO_CHECKPOINT).state == 2


def test_every_key_carries_a_ttl_and_the_ckpt_hash_tag(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    mgr.save("t", "a", "p", 1)
    mgr.save("t", "a", "p", 2)
    mgr.save("u", "b", "q", 3, ttl_seconds=10)
    keys = ckpt_keys(raw, namespace)
    assert {k.split("{ckpt}:")[1].split(":")[0] for k in keys} == {
        "rec", "task", "live", "order", "seq", "kids",
    }
    for key in keys:
        assert raw.pttl(key) > 0, key


def test_index_keys_live_as_long_as_their_longest_lived_record(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    mgr.save("t", "a", "p1", 1, ttl_seconds=1000)
    mgr.save("t", "a", "p2", 1, ttl_seconds=10)
    assert raw.pttl(f"{namespace}:ckpt:{{ckpt}}:task:t") > 900_000


# --- safe concurrent writers ----------------------------------------------------------------


def test_save_on_a_stale_expected_id_raises_conflict_and_writes_nothing(
    mgr: CheckpointManager,
) -> None:
    base = mgr.save("t", "a", "p", {"n": 0})
    winner = mgr.save("t", "a", "p", {"n": 1}, expected_checkpoint_id=base.checkpoint_id)
    with pytest.raises(CheckpointConflict) as err:
        mgr.save("t", "a", "p", {"n": 1}, expected_checkpoint_id=base.checkpoint_id)
    assert (err.value.task_id, err.value.expected, err.value.actual) == (
        "t", base.checkpoint_id, winner.checkpoint_id,
    )
    assert mgr.restore("t", "a") == winner
    assert [h.state["n"] for h in mgr.history("t", "a")] == [1, 0]


def test_expected_compares_with_the_tasks_latest_across_agents_and_phases(
    mgr: CheckpointManager,
) -> None:
    mine = mgr.save("t", "a", "p1", 1)
    theirs = mgr.save("t", "b", "p9", 2)
    with pytest.raises(CheckpointConflict) as err:
        mgr.save("t", "a", "p2", 3, expected_checkpoint_id=mine.checkpoint_id)
    assert err.value.actual == theirs.checkpoint_id
    ok = mgr.save("t", "a", "p2", 3, expected_checkpoint_id=theirs.checkpoint_id)
    assert ok.parent_checkpoint_id == theirs.checkpoint_id


def test_no_checkpoint_expectation_only_holds_on_an_empty_task(mgr: CheckpointManager) -> None:
    mgr.save("t", "a", "p", 1, expected_checkpoint_id=NO_CHECKPOINT)
    with pytest.raises(CheckpointConflict):
        mgr.save("t", "a", "p", 2, expected_checkpoint_id=NO_CHECKPOINT)


def test_without_expected_the_last_writer_wins(mgr: CheckpointManager) -> None:
    base = mgr.save("t", "a", "p", 0)
    mgr.save("t", "a", "p", 1)
    last = mgr.save("t", "a", "p", 2)
    assert mgr.restore("t", "a") == last
    assert base.checkpoint_id != last.checkpoint_id


def test_rewind_with_a_stale_expected_id_raises_conflict(mgr: CheckpointManager) -> None:
    first = mgr.save("t", "a", "p1", 1)
    mgr.save("t", "a", "p2", 2)
    with pytest.raises(CheckpointConflict):
        mgr.rewind("t", first.checkpoint_id, expected_checkpoint_id=first.checkpoint_id)


# --- ids with separators, foreign data ---------------------------------------------------------


def test_agents_and_phases_with_separators_never_collide(mgr: CheckpointManager) -> None:
    a = mgr.save("t:1", "a", "b:c", "agent a, phase b:c")
    b = mgr.save("t:1", "a:b", "c", "agent a:b, phase c")
    pct = mgr.save("t:1", "50%{x}", "p", "percent")
    assert mgr.restore("t:1", "a") == a
    assert mgr.restore("t:1", "a:b") == b
    assert mgr.restore("t:1", "50%{x}") == pct
    assert mgr.count() == 3
    forked = mgr.fork(b.checkpoint_id, "t:2")
    assert mgr.restore("t:2", "a:b", "c") == forked


def test_foreign_data_at_the_task_index_raises_corrupt_data_naming_it(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    index = f"{namespace}:ckpt:{{ckpt}}:task:t"
    raw.set(index, "not a hash")
    with pytest.raises(CorruptData) as err:
        mgr.save("t", "a", "p", 1)
    assert err.value.key == index
    with pytest.raises(CorruptData) as err:
        mgr.restore("t", "a")
    assert err.value.key == index


def test_foreign_record_raises_corrupt_data_naming_it(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    cp = mgr.save("t", "a", "p", 1)
    rec = f"{namespace}:ckpt:{{ckpt}}:rec:{cp.checkpoint_id}"
    raw.hset(rec, "s", b"\xc1")
    with pytest.raises(CorruptData) as err:
        mgr.get_by_id(cp.checkpoint_id)
    assert err.value.key == rec
    raw.delete(rec)
    raw.rpush(rec, "x")
    with pytest.raises(CorruptData) as err:
        mgr.restore("t", "a")
    assert err.value.key == rec


def test_foreign_global_index_raises_corrupt_data(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    live = f"{namespace}:ckpt:{{ckpt}}:live"
    raw.set(live, "x")
    with pytest.raises(CorruptData) as err:
        mgr.count()
    assert err.value.key == live


def test_a_record_deleted_behind_its_back_stops_being_counted(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    older = mgr.save("t", "a", "p1", 1)
    cp = mgr.save("t", "a", "p2", 2)
    raw.delete(f"{namespace}:ckpt:{{ckpt}}:rec:{cp.checkpoint_id}")  # e.g. volatile-lru
    assert mgr.restore("t", "a") == older
    assert mgr.count() == 1


# --- the resume helper ----------------------------------------------------------------------


def test_task_run_skips_completed_phases_and_returns_their_saved_state(
    mgr: CheckpointManager,
) -> None:
    calls: list[str] = []

    def step(name: str, value: object) -> object:
        calls.append(name)
        return value

    with mgr.task("job", "agent") as run:
        assert run.phase("fetch", lambda: step("fetch", (1, 2))) == (1, 2)
        assert run.phase("parse", lambda: step("parse", {"n": 3})) == {"n": 3}
    with mgr.task("job", "agent") as run:
        assert set(run.completed) == {"fetch", "parse"}
        assert run.phase("fetch", lambda: step("fetch again", 0)) == (1, 2)
        assert run.phase("parse", lambda: step("parse again", 0)) == {"n": 3}
        assert run.phase("store", lambda: step("store", "ok")) == "ok"
    assert calls == ["fetch", "parse", "store"]
    assert [h.phase for h in mgr.history("job", "agent")] == ["store", "parse", "fetch"]


def test_task_run_after_a_rewind_reruns_the_later_phases(mgr: CheckpointManager) -> None:
    with mgr.task("job", "agent") as run:
        for name in ("one", "two", "three"):
            run.phase(name, lambda n=name: n)
    mgr.rewind("job", mgr.restore("job", "agent", "one").checkpoint_id)
    ran: list[str] = []
    with mgr.task("job", "agent") as run:
        for name in ("one", "two", "three"):
            run.phase(name, lambda n=name: ran.append(n) or n)
    assert ran == ["two", "three"]


def test_exclusive_task_run_conflicts_when_another_writer_saved_meanwhile(
    mgr: CheckpointManager,
) -> None:
    run = mgr.task("job", "agent").load()
    run.phase("one", lambda: 1)
    mgr.save("job", "intruder", "x", 0)
    with pytest.raises(CheckpointConflict):
        run.phase("two", lambda: 2)
    loose = mgr.task("job", "agent", exclusive=False).load()
    assert loose.phase("two", lambda: 2) == 2


def test_task_run_without_with_loads_on_the_first_phase(mgr: CheckpointManager) -> None:
    mgr.save("job", "agent", "one", "saved")
    run = mgr.task("job", "agent", ttl_seconds=30)
    assert run.phase("one", lambda: "fresh") == "saved"
    cp = mgr.get_by_id(mgr.restore("job", "agent").checkpoint_id)
    assert cp.state == "saved"
    two = run.phase("two", lambda: 2)
    assert two == 2
    latest = mgr.restore("job", "agent")
    assert latest.expires_at - latest.created_at == timedelta(seconds=30)


def test_a_foreign_member_in_the_global_order_raises_corrupt_data_and_writes_nothing(
    store: durabilis.Store, raw: redis.Redis, namespace: str
) -> None:
    mgr = CheckpointManager(store, CheckpointConfig(max_checkpoints=1))
    mgr.save("t", "a", "p", 1)
    order = f"{namespace}:ckpt:{{ckpt}}:order"
    live = f"{namespace}:ckpt:{{ckpt}}:live"
    raw.zadd(order, {"garbage": 0})
    raw.zadd(live, {"garbage": 9e15})
    with pytest.raises(CorruptData) as err:
        mgr.save("u", "a", "p", 2)
    assert err.value.key == order
    assert mgr.restore("t", "a").state == 1


# --- a task run's save after its phase ran: a lost reply ----------------------------------


@pytest.mark.parametrize("landed", [True, False], ids=["the save landed", "it did not"])
@pytest.mark.parametrize("exclusive", [True, False], ids=["exclusive", "shared"])
def test_a_phase_whose_save_reply_is_lost_is_saved_once_and_never_run_again(
    store: durabilis.Store, mgr: CheckpointManager, landed: bool, exclusive: bool,
) -> None:
    lost = lose_replies(store, "ckpt_save", landed=landed, times=1)
    calls: Counter[str] = Counter()

    def phase(name: str) -> Any:
        def fn() -> str:
            calls[name] += 1
            return f"{name} done"
        return fn

    with mgr.task("job", "agent", exclusive=exclusive) as run:
        assert run.phase("fetch", phase("fetch")) == "fetch done"
        assert run.phase("fetch", phase("fetch")) == "fetch done"  # completed: not run
        assert run.phase("parse", phase("parse")) == "parse done"  # no conflict with itself
    assert lost == [0] and calls == {"fetch": 1, "parse": 1}
    current = mgr.list_current("job", "agent")
    assert sorted(c.phase for c in current) == ["fetch", "parse"]
    assert len(mgr.history("job", "agent")) == 2  # the fetch was saved once
    with mgr.task("job", "agent") as resumed:
        assert resumed.phase("fetch", phase("fetch")) == "fetch done"
    assert calls == {"fetch": 1, "parse": 1}


# --- the lineage cap never breaks a resume (issue 35, hole 6) -------------------------------


def _phases_with_a_recurring_cursor(
    mgr: CheckpointManager, task: str, phases: int, cursor_every: int
) -> None:
    """A run of ``phases`` phases that also saves its "cursor" phase again and
    again (``cursor_every`` cursor saves after each phase, from the same process)."""
    with mgr.task(task, "agent", exclusive=False) as run:
        for i in range(phases):
            run.phase(f"p{i}", lambda i=i: {"phase": i})
            for j in range(cursor_every):
                mgr.save(task, "agent", "cursor", {"after": i, "n": j})


def _resume_runs_nothing_again(mgr: CheckpointManager, task: str, phases: int) -> None:
    ran: list[int] = []
    fresh = CheckpointManager(mgr.store, mgr.config)  # a restarted process
    with fresh.task(task, "agent") as run:
        for i in range(phases):
            state = run.phase(f"p{i}", lambda i=i: ran.append(i) or {"phase": i})
            assert state == {"phase": i}
    assert ran == []  # no completed phase ran again


def test_60_phases_and_a_recurring_cursor_save_resume_without_rerunning_a_phase(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    _phases_with_a_recurring_cursor(mgr, "job", 60, 1)
    assert len(records(raw, namespace)) == mgr.config.max_lineage_per_task
    # the children index holds an entry per kept parent, none for a deleted one
    assert raw.hlen(f"{namespace}:ckpt:{{ckpt}}:kids") < mgr.config.max_lineage_per_task
    _resume_runs_nothing_again(mgr, "job", 60)
    history = mgr.history("job", "agent")
    assert history[-1].phase == "p0"  # the walk still reaches the first phase
    assert [h.phase for h in history if h.phase != "cursor"] == [
        f"p{i}" for i in range(59, -1, -1)
    ]


def test_300_phases_and_many_cursor_saves_resume_without_rerunning_a_phase(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    _phases_with_a_recurring_cursor(mgr, "big", 300, 3)
    # 300 current phases + 1 current cursor: over the cap, so no replaced record is kept
    assert len(records(raw, namespace)) == 301
    _resume_runs_nothing_again(mgr, "big", 300)
    history = mgr.history("big", "agent")
    assert [h.phase for h in history] == ["cursor", *(f"p{i}" for i in range(299, -1, -1))]


def test_trimming_relinks_every_child_of_a_deleted_record_across_tasks(
    store: durabilis.Store,
) -> None:
    small = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=3))
    small.save("t", "a", "first", 0)
    mid = small.save("t", "a", "p", 1)
    copy = small.fork(mid.checkpoint_id, "forked")  # a child in another task
    for i in range(2, 8):
        small.save("t", "a", "p", i)  # mid is a superseded save: trimmed
    with pytest.raises(CheckpointNotFound):
        small.get_by_id(mid.checkpoint_id)
    assert [h.state for h in small.history("forked", "a")] == [1, 0]
    assert small.get_by_id(copy.checkpoint_id).parent_checkpoint_id != mid.checkpoint_id
    assert [h.state for h in small.history("t", "a")][-1] == 0


def test_a_parents_children_index_entry_is_swept_once_the_parent_expired(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    kids = f"{namespace}:ckpt:{{ckpt}}:kids"
    first = mgr.save("t", "a", "p1", 1, ttl_seconds=0.2)
    mgr.save("t", "a", "p2", 2, ttl_seconds=0.2)
    assert raw.hkeys(kids) == [first.checkpoint_id.encode()]
    deadline = time.monotonic() + 10
    while records(raw, namespace) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert records(raw, namespace) == []
    mgr.save("u", "a", "p", 3)  # any later save sweeps it
    assert raw.hlen(kids) == 0


def test_clear_task_drops_its_records_children_index_entries(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    for i in range(5):
        mgr.save("t", "a", f"p{i % 2}", i)
    assert raw.hlen(f"{namespace}:ckpt:{{ckpt}}:kids") == 4
    assert mgr.clear_task("t") == 2
    assert ckpt_keys(raw, namespace, "kids*") == []


# --- branches, mixed caps (adv32 findings 1 and 2) ------------------------------------------


def _resume_reruns(mgr: CheckpointManager, task: str, phases: list[str]) -> list[str]:
    ran: list[str] = []
    fresh = CheckpointManager(mgr.store, mgr.config)  # a restarted process
    with fresh.task(task, "a") as run:
        for p in phases:
            run.phase(p, lambda p=p: ran.append(p))
    return ran


def test_a_fork_keeps_a_phase_whose_only_record_on_its_lineage_is_a_trimmed_superseded_save(
    store: durabilis.Store,
) -> None:
    small = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=4))
    with small.task("src", "a") as run:
        run.phase("p0", lambda: "v1")
        run.phase("p1", lambda: "v1")
    small.fork(small.restore("src", "a").checkpoint_id, "copy")
    for i in range(6):  # the source saves p0 again, past its cap: p0(v1) is superseded
        small.save("src", "a", "p0", f"v{i + 2}")
    assert _resume_reruns(small, "copy", ["p0", "p1"]) == []
    assert [(h.phase, h.state) for h in small.history("copy", "a")][-1] == ("p0", "v1")


def test_a_rewind_branch_keeps_a_phase_whose_only_record_on_it_is_a_superseded_save(
    store: durabilis.Store,
) -> None:
    small = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=6))
    small.save("t", "a", "p0", "v1")
    small.save("t", "a", "p1", "v1")
    cursor = small.save("t", "a", "cursor", 1)
    small.save("t", "a", "p1", "v2")  # p1(v1) is superseded on the main line
    small.save("t", "a", "cursor", 2)
    small.rewind("t", cursor.checkpoint_id)  # the branch: cursor(1) <- p1(v1) <- p0
    assert [h.phase for h in small.history("t", "a")] == ["cursor", "cursor", "p1", "p0"]
    for i in range(3, 12):
        small.save("t", "a", "cursor", i)  # the task's cap trims superseded saves
    assert [h.phase for h in small.history("t", "a") if h.phase != "cursor"] == ["p1", "p0"]
    assert _resume_reruns(small, "t", ["p0", "p1"]) == []


def test_a_lower_lineage_cap_than_the_writers_never_reruns_a_completed_phase(
    store: durabilis.Store,
) -> None:
    wide = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=10_000))
    for i in range(5):
        with wide.task("t", "a") as run:
            run.phase(f"p{i}", lambda i=i: i)
        for j in range(40):
            wide.save("t", "a", "cursor", j)
    narrow = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=10))
    assert _resume_reruns(narrow, "t", [f"p{i}" for i in range(5)]) == []
    assert [h.phase for h in narrow.history("t", "a")][-1] == "p0"


def test_a_fork_of_a_task_with_more_phases_than_the_cap_reruns_none(
    store: durabilis.Store,
) -> None:
    small = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=20))
    phases = [f"p{i}" for i in range(50)]
    with small.task("src", "a") as run:
        for p in phases:
            run.phase(p, lambda p=p: p)
    small.fork(small.restore("src", "a").checkpoint_id, "copy")
    assert _resume_reruns(small, "copy", phases) == []
    assert _resume_reruns(small, "src", phases) == []


def test_a_fork_of_a_fork_keeps_its_phase_when_only_the_second_copy_saved_it_again(
    store: durabilis.Store,
) -> None:
    # the first copy is its task's newest checkpoint *and* has a child (the second
    # copy): a newer save of the phase below it, in another task, does not cover it
    small = CheckpointManager(store, CheckpointConfig(max_lineage_per_task=2))
    with small.task("src", "a") as run:
        run.phase("cur", lambda: 1)
        run.phase("p0", lambda: 0)
    first = small.fork(small.restore("src", "a", "p0").checkpoint_id, "one")
    second = small.fork(first.checkpoint_id, "two")
    small.save("two", "a", "cur", 2)
    for i in range(3, 8):
        small.save("src", "a", "cur", i)  # src's cap trims its superseded cur(1)
    assert second.parent_checkpoint_id == first.checkpoint_id
    assert _resume_reruns(small, "one", ["cur", "p0"]) == []
    assert _resume_reruns(small, "two", ["cur", "p0"]) == []


# --- the review's regressions ---------------------------------------------------------------


def test_a_user_whose_acl_predates_zmscore_saves_every_phase_and_runs_a_call_once(
    redis_url: str, raw: Any, namespace: str
) -> None:
    # The line docs/operations.md gave before this release had no +zmscore: a
    # save must not fail mid-upgrade (the layer re-ran the operation each time).
    from durabilis.layer import DurabilityLayer, OperationContext
    from tests.support.acl import rules_for

    rules = rules_for(namespace, "pw")
    assert "+zmscore" in rules
    older = [r for r in rules if r != "+zmscore"]
    nodes = ([raw.get_redis_connection(n) for n in raw.get_nodes()]
             if isinstance(raw, redis.cluster.RedisCluster) else [raw])
    user = f"old-{namespace}"
    for node in nodes:
        node.execute_command("ACL", "SETUSER", user, *older)
    try:
        url = redis_url.replace("://", f"://{user}:pw@", 1)
        with durabilis.connect(url, namespace=namespace) as store:
            mgr = CheckpointManager(store)
            for i, phase in enumerate(("p1", "p2", "p3", "p1", "p2")):
                mgr.save("t", "a", phase, i)
            assert [mgr.restore("t", "a", p).state for p in ("p1", "p2", "p3")] == [3, 4, 2]
            layer = DurabilityLayer(store)
            runs: list[str] = []

            def fn(ctx: OperationContext) -> Any:
                runs.append(ctx.payload["phase"])
                return {"done": ctx.payload["phase"]}

            try:
                for phase in ("q1", "q2", "q2", "q1"):  # the last two: deliveries again
                    assert layer.execute("a", "op", {"phase": phase}, fn, idempotency_key=phase,
                                         task_id="u", phase=phase) == {"done": phase}
                assert runs == ["q1", "q2"]
            finally:  # (its duplicates' counts go now: not from its keep-alive, after the
                layer.close()  # user is gone, into another test's output)
    finally:
        for node in nodes:
            node.execute_command("ACL", "DELUSER", user)


def test_a_replaced_record_never_outlives_the_replaced_ids_index_and_clear_task_removes_it(
    mgr: CheckpointManager, raw: redis.Redis, namespace: str
) -> None:
    old = mgr.save("t", "a", "p", 1, ttl_seconds=600)
    new = mgr.save("t", "a", "p", 2, ttl_seconds=0.3)
    index = f"{namespace}:ckpt:{{ckpt}}:task:t:replaced"
    record = f"{namespace}:ckpt:{{ckpt}}:rec:{old.checkpoint_id}"
    assert raw.zscore(index, old.checkpoint_id) is not None
    assert raw.pttl(index) >= raw.pttl(record) > 300_000
    # once the current record expired, the index still lists the replaced one
    wait_until(lambda: not raw.exists(f"{namespace}:ckpt:{{ckpt}}:rec:{new.checkpoint_id}"),
               timeout=10)
    mgr.clear_task("t")
    assert not raw.exists(record)
    with pytest.raises(CheckpointNotFound):
        mgr.get_by_id(old.checkpoint_id)


@pytest.mark.standalone_only  # memory:// is one in-process backend: no topology to vary
def test_a_task_saves_several_phases_and_forks_on_the_memory_backend() -> None:
    """memory:// (fakeredis) has no ``redis.sha1hex``: a task's second save (the
    first one with a parent, whose mark in the children index is a digest)
    and a fork still work there, and its lineage reads back."""
    store = durabilis.connect("memory://ckpt-mark", namespace="mem-ckpt")
    try:
        ckpt = CheckpointManager(store)
        first = ckpt.save("task-m", "agent-1", "fetch", {"n": 1})
        second = ckpt.save("task-m", "agent-1", "render", {"n": 2})
        third = ckpt.save("task-m", "agent-1", "render", {"n": 3})
        assert ckpt.restore("task-m", "agent-1").checkpoint_id == third.checkpoint_id
        forked = ckpt.fork(second.checkpoint_id, "task-f")
        assert ckpt.restore("task-f", "agent-1").state == {"n": 2}
        assert forked.parent_checkpoint_id == second.checkpoint_id
        ids = [c.checkpoint_id for c in ckpt.history("task-m", "agent-1")]
        assert ids[0] == third.checkpoint_id and first.checkpoint_id in ids
    finally:
        store.close()
