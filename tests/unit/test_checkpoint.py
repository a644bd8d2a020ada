"""Checkpoint pillar without Redis: config, input checks, call building, reply decoding."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from durabilis import _codec
from durabilis._keys import KeySpace
from durabilis._scripts import ScriptCall, sources
from durabilis.checkpoint import (
    NO_CHECKPOINT,
    Checkpoint,
    CheckpointConfig,
    CheckpointManager,
    _CheckpointOps,
    _Entry,
    _RunPlan,
    _Walk,
    new_checkpoint_id,
)
from durabilis.errors import (
    CheckpointConflict,
    CheckpointNotFound,
    ConfigError,
    CorruptData,
    InvalidKey,
    InvalidPayload,
    InvalidTtl,
    PayloadTooLarge,
)

NOW_MS = 1_700_000_000_000


class _NoIOStore:
    """Stands in for a store where any Redis call is a test failure."""

    keys = KeySpace("unit")

    def run(self, call: ScriptCall) -> Any:
        raise AssertionError(f"unexpected Redis call {call.name}")

    def run_many(self, calls: Any) -> Any:
        raise AssertionError("unexpected Redis call")


def ops(**config: Any) -> _CheckpointOps:
    return _CheckpointOps(KeySpace("unit"), CheckpointConfig(**config))


def manager() -> CheckpointManager:
    return CheckpointManager(_NoIOStore())  # type: ignore[arg-type]


def cp(cid: str, parent: str | None, *, agent: str = "a", phase: str = "p") -> Checkpoint:
    at = datetime(2024, 1, 1, tzinfo=UTC)
    return Checkpoint(cid, "t", agent, phase, {"id": cid}, at, at, parent)


# --- config ------------------------------------------------------------------------


def test_config_defaults_are_the_seeds() -> None:
    cfg = CheckpointConfig()
    assert cfg.default_ttl_seconds == 86400
    assert cfg.max_checkpoints == 10_000
    assert cfg.max_state_bytes == 1024 * 1024
    assert cfg.max_lineage_per_task == 100


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("default_ttl_seconds", 0),
        ("default_ttl_seconds", -1),
        ("default_ttl_seconds", math.inf),
        ("default_ttl_seconds", 0.0001),
        ("default_ttl_seconds", 10**12),
        ("max_checkpoints", 0),
        ("max_checkpoints", 1.5),
        ("max_checkpoints", True),
        ("max_state_bytes", -5),
        ("max_lineage_per_task", 0),
        ("max_lineage_per_task", 2.5),
        ("max_lineage_per_task", True),
    ],
)
def test_invalid_config_names_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        CheckpointConfig(**{field: value})
    assert err.value.field == field


# --- input checks happen before any Redis call ----------------------------------------


@pytest.mark.parametrize("ttl", [0, -1, 0.0, math.nan, "10"])
def test_ttl_zero_or_invalid_raises_invalid_ttl_before_io(ttl: Any) -> None:
    with pytest.raises(InvalidTtl) as err:
        manager().save("t", "a", "p", {}, ttl_seconds=ttl)
    assert err.value.field == "ttl_seconds"


def test_ttl_beyond_ten_years_is_refused() -> None:
    with pytest.raises(ConfigError):
        manager().save("t", "a", "p", {}, ttl_seconds=11 * 365 * 86400)


def test_state_over_max_state_bytes_raises_payload_too_large_before_io() -> None:
    m = CheckpointManager(_NoIOStore(), CheckpointConfig(max_state_bytes=100))  # type: ignore[arg-type]
    with pytest.raises(PayloadTooLarge) as err:
        m.save("t", "a", "p", "x" * 200)
    assert err.value.limit == 100
    assert err.value.size > 100


def test_state_that_msgpack_cannot_encode_raises_invalid_payload() -> None:
    with pytest.raises(InvalidPayload):
        manager().save("t", "a", "p", object())


@pytest.mark.parametrize(
    "args", [("", "a", "p"), ("t", "", "p"), ("t", "a", ""), ("t" * 1025, "a", "p"), (1, "a", "p")]
)
def test_empty_or_oversized_ids_raise_invalid_key(args: tuple[Any, ...]) -> None:
    with pytest.raises(InvalidKey):
        manager().save(*args, {})


def test_bad_ids_in_reads_raise_before_io() -> None:
    m = manager()
    with pytest.raises(InvalidKey):
        m.restore("", "a")
    with pytest.raises(InvalidKey):
        m.restore("t", "a", phase="")
    with pytest.raises(InvalidKey):
        m.get_by_id("")
    with pytest.raises(InvalidKey):
        m.fork("id", "")
    with pytest.raises(InvalidKey):
        m.task("t", "")
    with pytest.raises(InvalidTtl):
        m.task("t", "a", ttl_seconds=0)


# --- ids ------------------------------------------------------------------------------


def test_ids_are_uuid7_hex_unique_and_sorted_by_creation() -> None:
    ids = [new_checkpoint_id() for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    for cid in ids[:50]:
        assert len(cid) == 32
        assert cid[12] == "7"
        assert cid[16] in "89ab"
        assert ":" not in cid


# --- call building ------------------------------------------------------------------------


def test_save_call_keys_share_the_ckpt_hash_tag() -> None:
    call = ops().save("task:1", "agent", "phase", {"k": 1}, 10)
    assert call.name == "ckpt_save"
    assert all(str(k).startswith("unit:ckpt:{ckpt}:") for k in call.keys)
    assert call.keys[1] == "unit:ckpt:{ckpt}:task:task%3A1"
    assert call.keys[2] == "unit:ckpt:{ckpt}:task:task%3A1:replaced"
    assert call.args[5] == 10_000  # ttl in ms
    assert call.args[7:9] == ["0", ""]  # no expected check


@pytest.mark.parametrize(
    ("expected", "args"),
    [(None, ["0", ""]), (NO_CHECKPOINT, ["1", ""]), ("abc", ["1", "abc"])],
)
def test_expected_checkpoint_id_is_sent_as_check_flag_and_value(
    expected: Any, args: list[str]
) -> None:
    call = ops().save("t", "a", "p", 1, expected=expected)
    assert list(call.args[7:9]) == args


def test_every_script_the_ops_build_ships_in_lua() -> None:
    o = ops()
    names = {
        o.save("t", "a", "p", 1).name,
        o.find("t").name,
        o.get("x").name,
        o.count().name,
        o.clear("t", []).name,
    }
    assert names <= set(sources())


def _ok_reply(call: ScriptCall, *, hint: list[bytes], evicted: list[bytes]) -> list[Any]:
    return [b"ok", call.args[0], NOW_MS, NOW_MS + 5000, b"", b"a", b"p", b"", hint, evicted]


def test_decode_save_ok_returns_the_checkpoint_with_the_state_round_tripped() -> None:
    o = ops()
    call = o.save("t", "a", "p", (1, 2), 5)
    got = o.decode_save(call, _ok_reply(call, hint=[b"x:t2"], evicted=[]))
    assert isinstance(got, Checkpoint)
    assert got.state == (1, 2)  # tuples round-trip (msgpack ext types)
    assert got.created_at == datetime.fromtimestamp(NOW_MS / 1000, tz=UTC)
    assert got.expires_at.tzinfo is not None
    assert got.parent_checkpoint_id is None


def test_the_next_save_carries_the_hinted_eviction_candidates_as_declared_keys() -> None:
    o = ops()
    call = o.save("t", "a", "p", 1)
    o.decode_save(call, _ok_reply(call, hint=[b"id1:other:task"], evicted=[]))
    nxt = o.save("t", "a", "p", 2)
    assert list(nxt.keys[9:]) == [
        "unit:ckpt:{ckpt}:rec:id1",
        "unit:ckpt:{ckpt}:task:other%3Atask",
    ]
    assert list(nxt.args[12:]) == ["id1:other:task"]


def test_decode_save_miss_returns_the_same_save_with_the_fresh_candidates() -> None:
    o = ops()
    call = o.save("t", "a", "p", 1)
    again = o.decode_save(call, [b"miss", [b"v1:t1", b"v2:t2"]])
    assert isinstance(again, ScriptCall)
    assert again.args[:12] == call.args[:12]
    assert again.keys[:9] == call.keys[:9]
    assert list(again.args[12:]) == ["v1:t1", "v2:t2"]
    assert len(again.keys) == 9 + 4


def test_the_save_carries_both_caps_in_one_argument() -> None:
    call = ops(max_checkpoints=50, max_lineage_per_task=7).save("t", "a", "p", 1)
    assert call.args[6] == "50|7"


def test_lineage_candidates_are_bare_ids_with_one_declared_record_key_each() -> None:
    o = ops()
    call = o.save("t", "a", "p", 1)
    o.decode_save(call, [*_ok_reply(call, hint=[b"e1:other"], evicted=[]), [b"old1", b"old2"], []])
    nxt = o.save("t", "a", "p", 2)
    assert list(nxt.args[12:]) == ["e1:other", "old1", "old2"]
    assert list(nxt.keys[9:]) == [
        "unit:ckpt:{ckpt}:rec:e1",
        "unit:ckpt:{ckpt}:task:other",
        "unit:ckpt:{ckpt}:rec:old1",
        "unit:ckpt:{ckpt}:rec:old2",
    ]
    other = o.save("t2", "a", "p", 3)  # the lineage hint is per task
    assert list(other.args[12:]) == ["e1:other"]
    again = o.decode_save(nxt, [b"exists"])  # sent again under a new id, same candidates
    assert isinstance(again, ScriptCall)
    assert list(again.args[12:]) == list(nxt.args[12:])
    assert list(again.keys[9:]) == list(nxt.keys[9:])


def test_decode_save_miss_on_the_lineage_cap_resends_with_the_ids_to_delete() -> None:
    o = ops()
    call = o.save("t", "a", "p", 1)
    again = o.decode_save(call, [b"miss", [], [b"old1", b"old2"]])
    assert isinstance(again, ScriptCall)
    assert again.args[:12] == call.args[:12]
    assert list(again.args[12:]) == ["old1", "old2"]
    assert list(again.keys[9:]) == ["unit:ckpt:{ckpt}:rec:old1", "unit:ckpt:{ckpt}:rec:old2"]
    # an ok reply naming no lineage ids forgets the task's hint
    o.decode_save(again, [*_ok_reply(again, hint=[], evicted=[]), [], [b"old1"]])
    assert list(o.save("t", "a", "p", 2).args[12:]) == []


def test_lineage_walks_follow_the_callers_limit_whatever_the_managers_lineage_cap() -> None:
    # the cap of the manager reading is not the one the task was written under
    # (replicas, a lowered cap): the walk's read bound is MAX_LINEAGE_PER_TASK per task
    o = ops(max_lineage_per_task=3)
    assert o.lineage_limit(None) is None
    assert o.lineage_limit(2) == 2
    assert o.lineage_limit(1000) == 1000
    assert o.lineage_limit(-1) == 0
    entries = [_Entry("a", f"p{i}", f"i{i}", i) for i in range(1, 7)]
    entries.append(_Entry("b", "late", "b9", 9))  # newer than the agent's newest: no ancestor
    ahead = o.lineage_entries("a", entries, 3)
    assert [e.checkpoint_id for e in ahead] == ["i6", "i5", "i4"]
    assert len(o.lineage_entries("a", entries, None)) == 6
    assert o.lineage_entries("nobody", entries, 3) == []


def test_decode_save_exists_retries_under_a_new_id() -> None:
    o = ops()
    call = o.save("t", "a", "p", 1)
    again = o.decode_save(call, [b"exists"])
    assert isinstance(again, ScriptCall)
    assert again.args[0] != call.args[0]
    assert again.keys[0] == o.rec(str(again.args[0]))


def test_decode_save_conflict_raises_with_task_expected_and_actual() -> None:
    o = ops()
    call = o.save("t", "a", "p", 1, expected="old")
    with pytest.raises(CheckpointConflict) as err:
        o.decode_save(call, [b"conflict", b"new"])
    assert (err.value.task_id, err.value.expected, err.value.actual) == ("t", "old", "new")


def test_decode_save_conflict_on_no_checkpoint_reports_expected_none() -> None:
    o = ops()
    call = o.save("t", "a", "p", 1, expected=NO_CHECKPOINT)
    with pytest.raises(CheckpointConflict) as err:
        o.decode_save(call, [b"conflict", b"x"])
    assert err.value.expected is None


def test_decode_save_notfound_raises_checkpoint_not_found() -> None:
    o = ops()
    with pytest.raises(CheckpointNotFound):
        o.decode_save(o.rewind("t", "src"), [b"notfound"])


@pytest.mark.parametrize(
    "reply", [[b"corrupt", b"unit:ckpt:{ckpt}:live", b"a string"], [b"???"], 42, None, []]
)
def test_decode_save_of_foreign_reply_raises_corrupt_data(reply: Any) -> None:
    o = ops()
    with pytest.raises(CorruptData):
        o.decode_save(o.save("t", "a", "p", 1), reply)


def test_corrupt_reply_names_the_key_the_script_found() -> None:
    o = ops()
    with pytest.raises(CorruptData) as err:
        o.decode_save(o.save("t", "a", "p", 1), [b"corrupt", b"unit:ckpt:{ckpt}:live", b"x"])
    assert err.value.key == "unit:ckpt:{ckpt}:live"


def test_decode_get_of_garbage_state_raises_corrupt_data_naming_the_record() -> None:
    o = ops()
    reply = [b"ok", b"t", b"a", b"p", b"\xc1", b"1", b"2", b""]
    with pytest.raises(CorruptData) as err:
        o.decode_get("cid", reply)
    assert err.value.key == o.rec("cid")


def test_decode_get_none_is_none() -> None:
    assert ops().decode_get("cid", [b"none"]) is None


def test_decode_find_splits_escaped_agent_and_phase() -> None:
    o = ops()
    call = o.find("t")
    reply = [b"ok", [b"a%3Ab%25:ph:ase", b"id1", b"7", b"x:p", b"id2", b"9"]]
    assert o.decode_find(call, reply) == [
        _Entry("a:b%", "ph:ase", "id1", 7),
        _Entry("x", "p", "id2", 9),
    ]


def test_decode_find_of_a_foreign_field_raises_corrupt_data() -> None:
    o = ops()
    call = o.find("t")
    with pytest.raises(CorruptData) as err:
        o.decode_find(call, [b"ok", [b"nocolon", b"id", b"1"]])
    assert err.value.key == call.keys[0]


def test_pick_takes_the_phase_or_the_agents_newest() -> None:
    entries = [_Entry("a", "p1", "i1", 1), _Entry("a", "p2", "i2", 5), _Entry("b", "p3", "i3", 9)]
    assert _CheckpointOps.pick(entries, "a", None) == "i2"
    assert _CheckpointOps.pick(entries, "a", "p1") == "i1"
    assert _CheckpointOps.pick(entries, "a", "p3") is None
    assert _CheckpointOps.pick(entries, "c", None) is None


# --- lineage walk and the resume plan ------------------------------------------------------


def test_walk_follows_parents_and_asks_for_records_it_lacks() -> None:
    known = {"c3": cp("c3", "c2"), "c2": cp("c2", "c1")}
    walk = _Walk("c3", known, None)
    assert walk.need() == "c1"
    walk.feed("c1", cp("c1", None))
    assert walk.need() is None
    assert [c.checkpoint_id for c in walk.chain] == ["c3", "c2", "c1"]


def test_walk_ends_at_the_first_missing_ancestor() -> None:
    walk = _Walk("c2", {"c2": cp("c2", "gone")}, None)
    walk.feed("gone", None)
    assert walk.need() is None
    assert [c.checkpoint_id for c in walk.chain] == ["c2"]


def test_walk_stops_on_a_cycle_and_at_the_limit() -> None:
    cyc = _Walk("x", {"x": cp("x", "y"), "y": cp("y", "x")}, None)
    assert cyc.need() is None
    assert len(cyc.chain) == 2
    lim = _Walk("x", {"x": cp("x", "y"), "y": cp("y", "z")}, 1)
    assert lim.need() is None
    assert len(lim.chain) == 1


def test_walk_asks_for_at_most_its_fetch_budget() -> None:
    walk = _Walk("x", {"x": cp("x", "y")}, None, 1)
    assert walk.need() == "y"
    walk.feed("y", cp("y", "z"))
    assert walk.need() is None  # z would be a second fetch
    assert [c.checkpoint_id for c in walk.chain] == ["x", "y"]
    assert _Walk("x", {"x": cp("x", "y")}, None, 0).need() is None


def test_run_plan_completes_the_agents_phases_on_the_lineage_only() -> None:
    plan = _RunPlan(ops(), "t", "a", None, True)
    chain = {
        "r1": cp("r1", "p1", phase="one"),  # a rewind copy of p1
        "p1": cp("p1", None, phase="one"),
        "b1": cp("b1", None, agent="b", phase="other"),
    }
    entries = [_Entry("a", "one", "r1", 4), _Entry("b", "other", "b1", 6)]
    plan.load(entries, _Walk("r1", chain, None))
    assert set(plan.completed) == {"one"}
    assert plan.completed["one"].checkpoint_id == "r1"
    assert plan.expected == "b1"  # the task's latest, whatever its agent


def test_run_plan_expects_no_checkpoint_on_a_fresh_task_and_nothing_when_not_exclusive() -> None:
    plan = _RunPlan(ops(), "t", "a", None, True)
    plan.load([], _Walk(None, {}, None))
    assert plan.expected is NO_CHECKPOINT
    assert plan.save_call("one", 1).args[7:9] == ["1", ""]
    loose = _RunPlan(ops(), "t", "a", None, False)
    loose.load([_Entry("a", "one", "x", 1)], _Walk(None, {}, None))
    assert loose.expected is None


def test_run_plan_builds_each_save_on_the_previous_one() -> None:
    plan = _RunPlan(ops(), "t", "a", 30, True)
    plan.load([], _Walk(None, {}, None))
    state = plan.saved(cp("new", None, phase="one"))
    assert state == {"id": "new"}
    assert plan.expected == "new"
    assert plan.save_call("two", 1).args[5] == 30_000


def test_codec_state_round_trip_is_what_a_resumed_run_sees() -> None:
    assert _codec.unpack(_codec.pack((1, {"a": (2,)})), key="k") == (1, {"a": (2,)})
