"""Replay by the fleet: an operator marks records (`durabilis dlq requeue`, no
application code at hand) and the replicas that have the handlers replay them;
a replay that lacks config counts nothing; bulk abandon and purge by filter."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import durabilis
from durabilis import OperationError
from durabilis.cli import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from durabilis.dlq import DlqStatus, ReplayOutcome
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext
from durabilis.testing import instant_retries
from tests.integration._dlq_fleet_workers import fleet_config
from tests.support.waits import wait_until

pytestmark = pytest.mark.serial

HERE = Path(__file__).resolve().parent
CLI = str(Path(sys.executable).with_name("durabilis"))


def _park(layer: DurabilityLayer, *pages: int, agent: str = "agent-1") -> list[str]:
    def down(ctx: OperationContext) -> Any:
        raise OperationError("NETWORK_TIMEOUT", "ledger down")

    ids = []
    with instant_retries():
        for page in pages:
            with pytest.raises(durabilis.RetryExhausted) as info:
                layer.execute(agent, "job", {"page": page}, down)
            ids.append(str(info.value.dlq_id))
    return ids


def _cli(cwd: Path, redis_url: str, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``durabilis`` console script, as an operator runs it: no terminal on stdin."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABILIS_")}
    return subprocess.run([CLI, *args, "--url", redis_url, "--namespace", namespace],
                          cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=120, check=False)


def _changes(raw: Any, layer: DurabilityLayer, dlq_id: str) -> list[tuple[str, str]]:
    """(change, by) of one record's entries in the DLQ's log stream, in order."""
    return [(f[b"change"].decode(), f.get(b"by", b"").decode())
            for _, f in raw.xrange(layer.dlq._ops.log_key) if f[b"dlq_id"].decode() == dlq_id]


def test_a_requeue_from_a_cli_without_the_handler_is_replayed_once_by_one_of_three_replicas(
    redis_url: str, namespace: str, store: durabilis.Store, raw: Any, tmp_path: Path,
) -> None:
    layer = DurabilityLayer(store, fleet_config())
    raced, alone = _park(layer, 1, 2)
    # The application lives where the replicas run it, not on the operator's laptop.
    app, laptop = tmp_path / "app", tmp_path / "laptop"
    app.mkdir()
    laptop.mkdir()
    shutil.copy(HERE / "_requeue_app.py", app / "fleet_app.py")
    assert subprocess.run([sys.executable, "-c", "import fleet_app"], cwd=laptop,
                          capture_output=True, check=False).returncode != 0
    def spawn(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "fleet_app.py", *args, redis_url, namespace],
                                cwd=app, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)

    workers = [spawn("serve", f"worker-{i}") for i in range(3)]
    live = spawn("deliver", "1")
    try:
        for p in [*workers, live]:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        done = _cli(laptop, redis_url, namespace, "dlq", "requeue", raced, alone, "--by", "ops")
        assert done.returncode == EXIT_OK, done.stderr
        assert f"{raced}: requeued" in done.stdout and f"{alone}: requeued" in done.stdout
        assert live.stdin is not None
        live.stdin.write("go\n")  # a live delivery of `raced` races the replicas' replay
        live.stdin.flush()
        assert live.wait(timeout=60) == 0

        def settled() -> bool:
            return all((r := layer.dlq.get(i)) is not None and r.status is DlqStatus.REPLAYED
                       for i in (raced, alone))

        wait_until(settled, timeout=60, what="both requeued records replayed")
    finally:
        for p in workers:
            assert p.stdin is not None
            p.stdin.close()
        outs = [p.stdout.read() if p.stdout else "" for p in workers]
        for p in workers:
            p.wait(timeout=60)
        live.kill()
        live.wait()
    assert [p.returncode for p in workers] == [0, 0, 0], outs
    assert all("error None" in out for out in outs), outs
    # The effect happened exactly once per operation, whoever won the race.
    effects = {k.decode(): int(v) for k, v in raw.hgetall(f"{namespace}:test-effects:{{fx}}")
               .items()}
    assert effects == {"1": 1, "2": 1}
    by_worker = {"worker-0", "worker-1", "worker-2"}
    record = layer.dlq.get(alone)
    assert record is not None and record.replayed_by in by_worker
    assert record.requeued_by == "ops" and record.replay_attempts == 0
    assert _changes(raw, layer, alone) == [("parked", ""), ("requeued", "ops"),
                                           ("replayed", record.replayed_by)]
    record = layer.dlq.get(raced)
    assert record is not None and record.replayed_by in by_worker | {"its worker"}
    # Progress is readable without the application: nothing left marked.
    listing = _cli(laptop, redis_url, namespace, "dlq", "ls", "--status", "requeued", "--json")
    assert listing.returncode in (EXIT_OK, 5) and raw.zcard(layer.dlq._ops.requeue_key) == 0
    layer.close()


def test_requeue_refuses_final_records_and_a_second_mark_changes_nothing(
    redis_url: str, namespace: str, store: durabilis.Store, raw: Any, tmp_path: Path,
) -> None:
    layer = DurabilityLayer(store, fleet_config())
    pending, replayed, abandoned = _park(layer, 1, 2, 3)
    assert layer.dlq.mark_replayed(replayed) and layer.dlq.abandon(abandoned)
    first = _cli(tmp_path, redis_url, namespace, "dlq", "requeue", pending, "--by", "ann")
    assert first.returncode == EXIT_OK, first.stderr
    again = _cli(tmp_path, redis_url, namespace, "dlq", "requeue", pending, "--by", "bob")
    assert again.returncode == EXIT_OK
    assert f"{pending}: already requeued (by ann at " in again.stdout
    record = layer.dlq.get(pending)
    assert record is not None and record.requeued_by == "ann"  # the first mark stands
    refused = _cli(tmp_path, redis_url, namespace, "dlq", "requeue", replayed, abandoned,
                   "no-such-id", "--json")
    assert refused.returncode == EXIT_NOT_FOUND
    doc = json.loads(refused.stdout)
    assert [(r["dlq_id"], r["outcome"], r["status"]) for r in doc["results"]] == [
        (replayed, "final", "replayed"), (abandoned, "final", "abandoned")]
    assert doc["final"] == 2 and doc["not_found"] == 1
    # One "requeued" log entry, one index entry: the second mark wrote nothing.
    assert [c for c, _ in _changes(raw, layer, pending)] == ["parked", "requeued"]
    assert raw.zcard(layer.dlq._ops.requeue_key) == 1
    for final in (replayed, abandoned):
        assert [c for c, _ in _changes(raw, layer, final)][-1] != "requeued"
    dry = _cli(tmp_path, redis_url, namespace, "dlq", "requeue", "--all", "--dry-run")
    assert dry.returncode == EXIT_OK and "dry run: would requeue 1 record(s)" in dry.stdout
    layer.close()


def test_only_the_replica_with_the_types_handler_replays_and_a_failure_ends_the_mark(
    store: durabilis.Store, raw: Any,
) -> None:
    layer = DurabilityLayer(store, fleet_config())
    (dlq_id,) = _park(layer, 1)
    assert [r.outcome for r in layer.dlq.requeue([dlq_id])] == ["requeued"]
    summary = layer.replay_requeued({"other_type": lambda ctx: "never"})
    assert summary.replayed == summary.failed == 0  # not this replica's type: untouched
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.claimed_by is None and record.requeued_at is not None

    def still_down(ctx: OperationContext) -> Any:
        raise OperationError("NETWORK_TIMEOUT", "still down")

    with instant_retries():
        summary = layer.replay_requeued({"job": still_down})
    assert summary.failed == 1
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.replay_attempts == 1 and record.requeued_at is None
    assert layer.dlq.list_requeued() == []  # replayed once per requeue, no loop
    assert layer.replay_requeued({"job": still_down}).failed == 0
    layer.close()


def test_a_replay_lacking_config_counts_no_attempt_keeps_last_error_and_says_it_in_clear(
    redis_url: str, namespace: str, store: durabilis.Store, raw: Any, tmp_path: Path,
) -> None:
    layer = DurabilityLayer(store, fleet_config())
    (dlq_id,) = _park(layer, 1)
    layer.dlq.requeue([dlq_id])
    # A process without the fleet's breaker config (the laptop's defaults).
    bare = DurabilityLayer(store, DurabilityConfig())
    result = bare.replay(dlq_id, lambda ctx: "never runs")
    assert result.outcome is ReplayOutcome.CONFIG_ERROR
    assert result.error == "DependencyNotFound: no circuit breaker is configured for 'svc'"
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.replay_attempts == 0
    assert record.last_error == "NETWORK_TIMEOUT: ledger down"
    assert record.last_replay_error == result.error and record.claimed_by is None
    assert record.requeued_at is not None  # a replica with the config will replay it
    assert [c for c, _ in _changes(raw, layer, dlq_id)][-1] == "replay_config_error"
    # The CLI says it in clear (our text, not user data), exit 2, nothing counted.
    out = _cli(tmp_path, redis_url, namespace, "dlq", "replay", dlq_id, "--handler",
               "tests.integration._cli_handlers:record")
    assert out.returncode == EXIT_USAGE, out.stderr
    assert "no circuit breaker is configured for 'svc'" in out.stdout
    assert "[REDACTED]" not in out.stdout
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.replay_attempts == 0
    assert record.last_error == "NETWORK_TIMEOUT: ledger down"
    assert layer.replay_requeued({"job": lambda ctx: "ok"}).replayed == 1
    bare.close()
    layer.close()


def test_bulk_abandon_and_purge_act_on_their_filter_only_and_refuse_without_confirmation(
    redis_url: str, namespace: str, store: durabilis.Store, raw: Any, tmp_path: Path,
) -> None:
    layer = DurabilityLayer(store, fleet_config())
    timeouts = _park(layer, 1, 2, 3)
    # Another reason, another type: left alone.
    lost = [layer.dlq.enqueue("agent-1", "job", {"page": 4}, 1, "WORKER_LOST: lease ended")]
    other = [layer.dlq.enqueue("agent-1", "other_job", {"page": 5}, 2,
                               "NETWORK_TIMEOUT: ledger down")]
    args = ("dlq", "abandon", "--type", "job", "--reason", "NETWORK_TIMEOUT")
    refused = _cli(tmp_path, redis_url, namespace, *args)
    assert refused.returncode == EXIT_USAGE
    assert "without confirmation" in refused.stderr and "--yes" in refused.stderr
    assert layer.dlq.pending_count() == 5  # nothing half-done
    dry = _cli(tmp_path, redis_url, namespace, *args, "--dry-run", "--json")
    assert dry.returncode == EXIT_OK
    assert sorted(r["dlq_id"] for r in json.loads(dry.stdout)["records"]) == sorted(timeouts)
    assert layer.dlq.pending_count() == 5
    done = _cli(tmp_path, redis_url, namespace, *args, "--yes", "--by", "ann")
    assert done.returncode == EXIT_OK, done.stderr
    for dlq_id in timeouts:
        record = layer.dlq.get(dlq_id)
        assert record is not None and record.status is DlqStatus.ABANDONED
        assert record.abandoned_by == "ann"
    for dlq_id in lost + other:
        record = layer.dlq.get(dlq_id)
        assert record is not None and record.status is DlqStatus.PENDING
    # Purge: the abandoned ones only; the pending ones stay.
    purge = ("dlq", "purge", "--status", "abandoned")
    refused = _cli(tmp_path, redis_url, namespace, *purge)
    assert refused.returncode == EXIT_USAGE and "without confirmation" in refused.stderr
    assert all(layer.dlq.get(i) is not None for i in timeouts)
    gone = _cli(tmp_path, redis_url, namespace, *purge, "--yes", "--json")
    assert gone.returncode == EXIT_OK, gone.stderr
    assert json.loads(gone.stdout)["count"] == 3
    assert all(layer.dlq.get(i) is None for i in timeouts)
    stats = layer.dlq.stats()
    assert stats.total == 2 and stats.pending == 2
    assert [c for c, _ in _changes(raw, layer, timeouts[0])][-1] == "purged"
    assert len(raw.xrange(layer.dlq._ops.stream_key)) == 2  # their entries went too
    layer.close()


@pytest.mark.topologies("cluster")
def test_requeue_prune_purge_and_bulk_abandon_scripts_keep_every_index_straight(
    store: durabilis.Store, raw: Any,
) -> None:
    dlq = durabilis.dlq.DeadLetterQueue(store)
    short = dlq.enqueue("agent-1", "job", {"n": 0}, 1, "NETWORK_TIMEOUT: x", ttl_seconds=0.3)
    held, kept, done = (dlq.enqueue("agent-1", "job", {"n": i}, 1, "NETWORK_TIMEOUT: x")
                        for i in (1, 2, 3))
    assert [r.outcome for r in dlq.requeue([short, held, kept, done], by="ann")] == [
        "requeued"] * 4
    assert dlq.abandon_many([done, "no-such-id"], by="ann") == {done: True, "no-such-id": False}
    assert {r.dlq_id for r in dlq.list_requeued()} == {short, held, kept}
    assert raw.zcard(dlq._ops.requeue_key) == 3  # the abandoned one left the index
    # A record under a live replay claim is not purged; another status is kept.
    claim = store.run(dlq._ops.claim(held))
    assert claim[0] in (b"ok", "ok")
    assert dlq.purge([held, kept], by="ann", status="abandoned") == {
        held: "other:requeued", kept: "other:requeued"}
    assert dlq.purge([held, kept], by="ann") == {held: "busy", kept: "purged"}
    assert dlq.get(kept) is None and dlq.get(held) is not None
    # The short-lived record expires; the next pass prunes its mark.
    wait_until(lambda: dlq.get(short) is None, timeout=30, what="the short record expired")
    ran: list[str] = []
    summary = dlq.replay_requeued({"job": lambda r: ran.append(r.dlq_id)})
    assert ran == [] and summary.skipped == 1  # (`held` is claimed elsewhere)
    assert summary.expired == 1
    members = raw.zrange(dlq._ops.requeue_key, 0, -1)
    assert [m.rsplit(b"|", 1)[1].decode() for m in members] == [held]
    stats = dlq.stats()
    assert stats.total == 2 and stats.by_status[DlqStatus.ABANDONED] == 1


def test_the_async_twin_requeues_and_replays_with_a_coroutine_handler(
    redis_url: str, namespace: str,
) -> None:
    async def main() -> list[str]:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        dlq = durabilis.aio.DeadLetterQueue(store)
        dlq_id = await dlq.enqueue("agent-1", "job", {"n": 1}, 1, "NETWORK_TIMEOUT: x")
        assert [r.outcome for r in await dlq.requeue([dlq_id])] == ["requeued"]
        assert [r.dlq_id for r in await dlq.list_requeued("job")] == [dlq_id]
        seen: list[str] = []

        async def handler(record: durabilis.dlq.DlqRecord) -> None:
            seen.append(record.dlq_id)

        summary = await dlq.replay_requeued({"job": handler})
        assert summary.replayed == 1 and await dlq.list_requeued() == []
        assert await dlq.purge([dlq_id], status="replayed") == {dlq_id: "purged"}
        await store.close()
        return seen

    assert len(asyncio.run(main())) == 1


def _failing(record: durabilis.dlq.DlqRecord) -> None:
    raise RuntimeError("downstream still rejects")


@pytest.mark.topologies("cluster")
def test_a_record_parked_again_under_an_expired_requeued_records_id_is_not_replayed(
    store: durabilis.Store, raw: Any,
) -> None:
    dlq = durabilis.dlq.DeadLetterQueue(store)
    rid = "order-1-rec"
    dlq.enqueue("agent-1", "charge", {"order": 1}, 3, "TIMEOUT", ttl_seconds=0.3, dlq_id=rid)
    assert [r.outcome for r in dlq.requeue([rid], by="ops")] == ["requeued"]
    wait_until(lambda: dlq.get(rid) is None, timeout=30, what="the requeued record expired")
    dlq.cleanup_expired()
    assert raw.zcard(dlq._ops.requeue_key) == 0  # its cleanup drops its index entry too
    # The operation is parked again under the same id: nobody requeued this one.
    dlq.enqueue("agent-1", "charge", {"order": 1}, 3, "DECLINED", ttl_seconds=600, dlq_id=rid)
    ran: list[str] = []
    for _ in range(3):
        dlq.replay_requeued({"charge": lambda r: (ran.append(r.dlq_id), _failing(r))})
    record = dlq.get(rid)
    assert ran == [] and record is not None and record.replay_attempts == 0


@pytest.mark.topologies("cluster")
def test_an_index_entry_of_an_unmarked_record_is_never_replayed_and_is_pruned(
    store: durabilis.Store, raw: Any,
) -> None:
    dlq = durabilis.dlq.DeadLetterQueue(store)
    rid = dlq.enqueue("agent-1", "charge", {"order": 1}, 3, "TIMEOUT")
    assert [r.outcome for r in dlq.requeue([rid], by="ops")] == ["requeued"]
    # An entry left behind by an older incarnation: the record no longer carries the mark.
    raw.hdel(dlq._ops.record_key(rid), "rq")
    ran: list[str] = []
    summary = dlq.replay_requeued({"charge": lambda r: ran.append(r.dlq_id)})
    assert ran == [] and summary.replayed == summary.failed == 0
    assert raw.zcard(dlq._ops.requeue_key) == 0  # the finder without its mark is pruned
    # And an entry naming another stream id than the marked record's is not followed.
    assert [r.outcome for r in dlq.requeue([rid], by="ops")] == ["requeued"]
    raw.zadd(dlq._ops.requeue_key, {b"charge\x00000000000000001-a0|" + rid.encode(): 0})
    assert raw.zcard(dlq._ops.requeue_key) == 2
    summary = dlq.replay_requeued({"charge": _failing})
    assert summary.failed == 1 and raw.zcard(dlq._ops.requeue_key) == 0
    record = dlq.get(rid)
    assert record is not None and record.replay_attempts == 1 and record.requeued_at is None


@pytest.mark.topologies("cluster")
def test_a_filled_in_requeued_record_moves_its_index_entry_and_a_failure_ends_the_mark(
    store: durabilis.Store, raw: Any,
) -> None:
    dlq = durabilis.dlq.DeadLetterQueue(store)
    ops = dlq._ops
    key = "agent-1:charge:" + "a" * 32

    def park(payload: Any, meta: dict[str, str]) -> str:
        prep = ops.prepare("agent-1", "charge", payload, meta)
        call = ops.enqueue_prepared(prep, 1, "WORKER_LOST", dlq_id=os.urandom(8).hex(),
                                    merge_key=key)
        return str(ops.decode_enqueue(call, store.run(call)).dlq_id)

    rid = park(None, {"idempotency_key": key, "payload_error": "CorruptData"})
    assert [r.outcome for r in dlq.requeue([rid], by="ops")] == ["requeued"]
    raw.pexpire(ops.requeue_key, 60_000)  # (as if marked when the record had a minute left)
    assert park({"order": 1}, {"idempotency_key": key}) == rid  # filled in: a new stream id
    record = dlq.get(rid)
    assert record is not None and record.requeued_at is not None
    assert [r.dlq_id for r in dlq.list_requeued()] == [rid]
    # The index outlives the record it lists (its new lifetime).
    assert raw.pttl(ops.requeue_key) >= raw.pttl(ops.record_key(rid))
    ran: list[str] = []
    for _ in range(3):
        dlq.replay_requeued({"charge": lambda r: (ran.append(r.dlq_id), _failing(r))})
    record = dlq.get(rid)
    assert ran == [rid] and record is not None and record.replay_attempts == 1
    assert record.requeued_at is None and raw.zcard(ops.requeue_key) == 0


@pytest.mark.topologies("cluster")
def test_a_claim_that_extends_a_marked_records_life_extends_the_requeue_index(
    store: durabilis.Store, raw: Any,
) -> None:
    dlq = durabilis.dlq.DeadLetterQueue(store)
    ops = dlq._ops
    rid = dlq.enqueue("agent-1", "charge", {"order": 1}, 3, "TIMEOUT", ttl_seconds=5)
    assert [r.outcome for r in dlq.requeue([rid], by="ops")] == ["requeued"]
    raw.pexpire(ops.requeue_key, 10_000)
    assert store.run(ops.claim(rid))[0] in (b"ok", "ok")  # pushes the record's expiry on
    assert raw.pttl(ops.record_key(rid)) > 10_000
    assert raw.pttl(ops.requeue_key) >= raw.pttl(ops.record_key(rid))


def test_abandon_refuses_a_record_a_running_replay_holds_as_purge_does(
    store: durabilis.Store, raw: Any,
) -> None:
    dlq = durabilis.dlq.DeadLetterQueue(store)
    held, free = (dlq.enqueue("agent-1", "job", {"n": i}, 1, "NETWORK_TIMEOUT: x")
                  for i in (1, 2))
    claim = store.run(dlq._ops.claim(held))
    assert claim[0] in (b"ok", "ok")
    assert dlq.abandon_many([held, free], by="ann") == {held: False, free: True}
    assert dlq.abandon(held, by="ann") is False
    record = dlq.get(held)
    assert record is not None and record.status is DlqStatus.PENDING
    assert record.claimed_by is not None  # the replay's hold stands


@pytest.mark.topologies("cluster")
def test_a_replica_lacking_config_logs_each_requeued_record_once_and_backs_it_off(
    store: durabilis.Store, raw: Any,
) -> None:
    from durabilis import ConfigError
    from durabilis.dlq import DeadLetterQueue

    def unconfigured(record: Any) -> Any:
        raise ConfigError("retry_policies", "no policy for charge on this replica")

    first = DeadLetterQueue(store, replayer_id="replica-x")
    ids = [first.enqueue("agent-1", "charge", {"o": i}, 3, "TIMEOUT") for i in range(3)]
    first.requeue(ids, by="ops")
    # Config errors count toward the pass's limit: two records met, not three.
    assert first.replay_requeued({"charge": unconfigured}, limit=2).config_error_ids == tuple(
        ids[:2])
    # This replica backs the records it met off: the next pass meets only the third.
    assert first.replay_requeued({"charge": unconfigured}).config_error_ids == (ids[2],)
    assert first.replay_requeued({"charge": unconfigured}).config_errors == 0
    # The same replica again (restarted: no memory) meets the same error: no new entry.
    again = DeadLetterQueue(store, replayer_id="replica-x")
    assert again.replay_requeued({"charge": unconfigured}).config_errors == 3
    # Another replica's first meeting is logged (who met what stays in the trail).
    other = DeadLetterQueue(store, replayer_id="replica-y")
    assert other.replay_requeued({"charge": unconfigured}).config_errors == 3
    for dlq_id in ids:
        changes = [(f[b"change"].decode(), f.get(b"by", b"").decode())
                   for _, f in raw.xrange(first._ops.log_key)
                   if f[b"dlq_id"].decode() == dlq_id and f[b"change"] == b"replay_config_error"]
        assert changes == [("replay_config_error", "replica-x"),
                           ("replay_config_error", "replica-y")]
        record = first.get(dlq_id)
        assert record is not None and record.replay_attempts == 0
        assert record.last_error == "TIMEOUT"  # a config error is no attempt's error
        assert record.requeued_at is not None and record.claimed_by is None
        assert record.last_replay_error is not None and "no policy" in record.last_replay_error
    assert DeadLetterQueue(store).replay_requeued({"charge": lambda record: None}).replayed == 3


def test_requeue_and_purge_with_expected_act_only_on_the_record_the_caller_saw(
    redis_url: str, namespace: str, store: durabilis.Store, raw: Any,
) -> None:
    # An id derives from the operation's key: purged and parked again, or parked
    # again into the record (a merge), it is the same id but another record.
    layer = DurabilityLayer(store, fleet_config())
    reparked, merged, same = _park(layer, 1, 2, 3)
    seen = {r.dlq_id: (r.stream_id, r.parkings) for r in layer.dlq.list_pending()}
    assert layer.dlq.purge([reparked]) == {reparked: "purged"}
    assert _park(layer, 1, 2) == [reparked, merged]
    assert [r.outcome for r in layer.dlq.requeue([reparked, merged, same], by="ann",
                                                 expected=seen)] == [
        "changed", "changed", "requeued"]
    assert layer.dlq.purge([reparked, merged, same], expected=seen) == {
        reparked: "changed", merged: "changed", same: "purged"}
    for dlq_id in (reparked, merged):
        record = layer.dlq.get(dlq_id)
        assert record is not None and record.requeued_at is None
        assert _changes(raw, layer, dlq_id)[-1][0] in ("parked", "parked_again")
    # Without an expectation (the CLI, old callers) they act as before.
    assert [r.outcome for r in layer.dlq.requeue([merged])] == ["requeued"]
    fresh = {merged: (layer.dlq.get(merged).stream_id, 2)}  # type: ignore[union-attr]
    assert layer.dlq.purge([merged, reparked], expected=fresh) == {
        merged: "purged", reparked: "purged"}
    with pytest.raises(durabilis.ConfigError):
        layer.dlq.purge([same], expected={same: ("not-a-stream-id", 1)})

    async def main() -> tuple[str, dict[str, str]]:
        astore = durabilis.aio.connect(redis_url, namespace=namespace)
        dlq = durabilis.aio.DeadLetterQueue(astore)
        dlq_id = await dlq.enqueue("agent-1", "job", {"n": 1}, 1, "NETWORK_TIMEOUT: x")
        record = await dlq.get(dlq_id)
        assert record is not None
        stale = {dlq_id: (record.stream_id, record.parkings + 1)}
        (result,) = await dlq.requeue([dlq_id], expected=stale)
        purged = await dlq.purge([dlq_id], expected=stale)
        await astore.close()
        return result.outcome, purged

    outcome, purged = asyncio.run(main())
    assert outcome == "changed" and list(purged.values()) == ["changed"]


@pytest.mark.topologies("cluster")
def test_abandon_with_expected_acts_only_on_the_record_the_caller_saw(
    redis_url: str, namespace: str, store: durabilis.Store, raw: Any,
) -> None:
    layer = DurabilityLayer(store, fleet_config())
    merged, same = _park(layer, 1, 2)
    seen = {r.dlq_id: (r.stream_id, r.parkings) for r in layer.dlq.list_pending()}
    assert _park(layer, 1) == [merged]  # parked again into the record: parkings + 1
    assert layer.dlq.abandon(merged, by="ann", expected=seen) is False
    record = layer.dlq.get(merged)
    assert record is not None and record.status is DlqStatus.PENDING
    assert _changes(raw, layer, merged)[-1][0] == "parked_again"
    assert layer.dlq.abandon(same, by="ann", expected=seen) is True
    assert layer.dlq.abandon(merged, by="ann") is True  # without one: as before
    with pytest.raises(durabilis.ConfigError):
        layer.dlq.abandon(same, expected={same: ("not-a-stream-id", 1)})

    async def main() -> tuple[bool, bool]:
        astore = durabilis.aio.connect(redis_url, namespace=namespace)
        dlq = durabilis.aio.DeadLetterQueue(astore)
        dlq_id = await dlq.enqueue("agent-1", "job", {"n": 1}, 1, "NETWORK_TIMEOUT: x")
        record = await dlq.get(dlq_id)
        assert record is not None
        stale = await dlq.abandon(dlq_id, expected={dlq_id: (record.stream_id, 2)})
        fresh = await dlq.abandon(dlq_id, expected={dlq_id: (record.stream_id, 1)})
        await astore.close()
        return stale, fresh

    assert asyncio.run(main()) == (False, True)


def test_a_requeue_result_names_who_marked_it_now_and_before(store: durabilis.Store) -> None:
    """``requeue()``'s result says who marked the record: the caller for a mark
    made now (as the record stores it), the earlier marker for one marked
    before; ``by=None`` marks it with no name."""
    layer = DurabilityLayer(store, fleet_config())
    first, second = _park(layer, 1, 2)
    marked = layer.dlq.requeue([first, first], by="ann")
    assert [(r.outcome, r.requeued_by) for r in marked] == [("requeued", "ann")] * 2
    stored = layer.dlq.get(first)
    assert stored is not None and stored.requeued_by == marked[0].requeued_by
    again = layer.dlq.requeue([first], by="bob")
    assert [(r.outcome, r.requeued_by) for r in again] == [("already", "ann")]
    anonymous = layer.dlq.requeue([second], by=None)
    assert [(r.outcome, r.requeued_by) for r in anonymous] == [("requeued", None)]
    layer.close()
