"""DLQ pure code: config, encodings, call building and reply decoding. No Redis."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import durabilis
from durabilis._keys import KeySpace
from durabilis._scripts import ScriptCall
from durabilis._steps import IO, Run, Sleep
from durabilis.dlq import (
    DeadLetterQueue,
    DlqConfig,
    DlqRecord,
    DlqStatus,
    ReplayOutcome,
    ReplayResult,
    _DlqOps,
    _encode_operation,
    _Pacer,
    _Tally,
    error_text,
    handler_plan,
    sort_key,
)
from durabilis.errors import (
    ConfigError,
    CorruptData,
    InvalidKey,
    InvalidPayload,
    InvalidTtl,
    OperationError,
    PayloadTooLarge,
)


def ops(**config: Any) -> _DlqOps:
    return _DlqOps(KeySpace("ns"), DlqConfig(**config), owner="me")


def enqueue_args(**changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "agent_id": "agent-1",
        "operation_type": "wiki_write",
        "original_operation": {"page": "Home"},
        "retry_count": 3,
        "last_error": "NETWORK_TIMEOUT",
    }
    args.update(changes)
    return args


# --- config --------------------------------------------------------------------------


def test_config_defaults_keep_the_seed_ttl_of_one_day() -> None:
    config = DlqConfig()
    assert config.default_ttl_seconds == 86400
    assert config.max_pending >= 1
    assert config.claim_ttl_seconds > 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("default_ttl_seconds", 0),
        ("default_ttl_seconds", -5),
        ("default_ttl_seconds", math.inf),
        ("max_pending", 0),
        ("max_pending", 1.5),
        ("claim_ttl_seconds", 0),
        ("claim_ttl_seconds", True),
        ("max_payload_bytes", 0),
        ("max_error_bytes", 8),
        ("max_name_bytes", 0),
        ("cleanup_batch_size", 0),
        ("purge_per_enqueue", -1),
        ("purge_per_enqueue", 1.0),
    ],
)
def test_invalid_config_raises_config_error_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        DlqConfig(**{field: value})
    assert err.value.field == field


def test_purge_per_enqueue_zero_is_allowed() -> None:
    assert DlqConfig(purge_per_enqueue=0).purge_per_enqueue == 0


# --- sort keys -----------------------------------------------------------------------


def test_sort_key_orders_ten_after_nine_within_one_millisecond() -> None:
    assert sort_key("1700000000000-9") < sort_key("1700000000000-10")
    assert sort_key("1700000000000-99") < sort_key("1700000000000-100")
    assert sort_key("1700000000000-0") == "001700000000000-a0"


@given(
    st.lists(
        st.tuples(st.integers(0, 10**15 - 1), st.integers(0, 2**64 - 1)), min_size=2, max_size=20
    )
)
def test_sort_key_byte_order_is_stream_id_order(ids: list[tuple[int, int]]) -> None:
    by_number = sorted(ids)
    by_key = sorted(ids, key=lambda p: sort_key(f"{p[0]}-{p[1]}").encode())
    assert by_key == by_number


@pytest.mark.parametrize("bad", ["", "12", "a-1", "1-", "-1", "1-2-3"])
def test_sort_key_rejects_what_is_not_a_stream_id(bad: str) -> None:
    with pytest.raises(InvalidKey):
        sort_key(bad)


# --- payload encoding -----------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [{"page": "Home", "n": 1, "ok": True}, [1, 2.5, None], "text", 7, {"é": ["ü"]}]
)
def test_json_compatible_operations_are_stored_as_json_text(value: Any) -> None:
    field, data = _encode_operation(value)
    assert field == "original_operation"
    assert data.decode("utf-8")  # readable text


@pytest.mark.parametrize(
    "value", [b"\x00\xff", {1: "int key"}, (1, 2), float("nan"), {"nested": b"bytes"}]
)
def test_operations_json_would_change_are_stored_as_msgpack(value: Any) -> None:
    field, _ = _encode_operation(value)
    assert field == "original_operation_msgpack"


def test_an_operation_msgpack_cannot_encode_raises_invalid_payload() -> None:
    with pytest.raises(InvalidPayload):
        ops().enqueue(**enqueue_args(original_operation=object()))


# --- enqueue call building and validation -----------------------------------------------


def test_enqueue_call_keys_share_the_dlq_hash_tag_and_the_namespace() -> None:
    call = ops().enqueue(**enqueue_args())
    assert call.name == "dlq_enqueue"
    assert all(str(k).startswith("ns:dlq:{dlq}:") for k in call.keys)
    assert call.keys[0] == "ns:dlq:{dlq}:stream"
    assert call.keys[5] == f"ns:dlq:{{dlq}}:rec:{call.args[0]!s}"


def test_enqueue_generates_distinct_ids_and_keeps_a_chosen_one() -> None:
    o = ops()
    first, second = (o.enqueue(**enqueue_args()).args[0] for _ in range(2))
    assert first != second
    assert len(str(first)) == 32
    assert o.enqueue(**enqueue_args(), dlq_id="agent-1:wiki:abc").args[0] == "agent-1:wiki:abc"


def test_metadata_becomes_prefixed_plain_fields() -> None:
    call = ops().enqueue(**enqueue_args(), metadata={"idempotency_key": "k1", "payload": "x"})
    assert call.args[11] == 0  # keep_pending off
    assert list(call.args[12:]) == ["meta:idempotency_key", "k1", "meta:payload", "x"]


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"agent_id": ""}, InvalidKey),
        ({"agent_id": 5}, InvalidKey),
        ({"operation_type": ""}, InvalidKey),
        ({"operation_type": "a\x00b"}, InvalidKey),
        ({"operation_type": "x" * 257}, InvalidKey),
        ({"retry_count": -1}, InvalidPayload),
        ({"retry_count": True}, InvalidPayload),
        ({"retry_count": "3"}, InvalidPayload),
        ({"last_error": 42}, InvalidPayload),
        ({"ttl_seconds": 0}, InvalidTtl),
        ({"ttl_seconds": -1.0}, InvalidTtl),
        ({"ttl_seconds": math.nan}, InvalidTtl),
    ],
)
def test_bad_enqueue_input_raises_a_typed_error(changes: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        ops().enqueue(**enqueue_args(**changes))


@pytest.mark.parametrize("metadata", [{"": "x"}, {"k": 1}, {2: "x"}])
def test_metadata_must_map_non_empty_text_to_text(metadata: dict[Any, Any]) -> None:
    with pytest.raises(InvalidPayload):
        ops().enqueue(**enqueue_args(), metadata=metadata)


@pytest.mark.parametrize("dlq_id", ["", "a|b", "a b", "x" * 201, "é"])
def test_a_malformed_chosen_dlq_id_raises_invalid_key(dlq_id: str) -> None:
    with pytest.raises(InvalidKey):
        ops().enqueue(**enqueue_args(), dlq_id=dlq_id)


def test_an_operation_over_max_payload_bytes_raises_payload_too_large() -> None:
    with pytest.raises(PayloadTooLarge) as err:
        ops(max_payload_bytes=100).enqueue(**enqueue_args(original_operation="x" * 200))
    assert err.value.limit == 100
    with pytest.raises(PayloadTooLarge):  # metadata counts towards the limit
        ops(max_payload_bytes=100).enqueue(**enqueue_args(), metadata={"k": "v" * 100})


def test_long_errors_are_truncated_not_refused() -> None:
    call = ops(max_error_bytes=64).enqueue(**enqueue_args(last_error="é" * 500))
    text = str(call.args[6])
    assert len(text.encode("utf-8")) <= 64
    assert text.endswith("[truncated]")


def test_bad_input_fails_before_any_redis_call() -> None:
    # Nothing listens on port 1: reaching Redis would raise StorageUnavailable.
    store = durabilis.connect("redis://127.0.0.1:1/0", namespace="unit", socket_timeout=0.2)
    dlq = DeadLetterQueue(store)
    with pytest.raises(InvalidKey):
        dlq.enqueue("", "wiki_write", {}, 1, "x")
    with pytest.raises(InvalidKey):
        dlq.list_pending("")
    with pytest.raises(ConfigError):
        dlq.replay_pending(lambda r: None, limit=-1)
    with pytest.raises(ConfigError):
        dlq.replay_pending(lambda r: None, max_per_second=0)
    with pytest.raises(InvalidKey):
        dlq.list_all(after="not-an-id")
    with pytest.raises(InvalidKey):
        dlq.get(123)  # type: ignore[arg-type]
    # Malformed ids are unknown ids: answered without I/O, as the seed answers unknown ids.
    assert dlq.get("no such|id") is None
    assert dlq.mark_replayed("no such|id") is False
    assert dlq.abandon("") is False
    assert dlq.replay("a b", lambda r: None).outcome is ReplayOutcome.NOT_FOUND
    store.close()


# --- decoding ---------------------------------------------------------------------------


def hash_fields(**changes: Any) -> dict[str, Any]:
    h: dict[str, Any] = {
        "st": b"pending",
        "op": b"wiki_write",
        "sid": b"1700000000000-0",
        "ts": b"1700000000000",
        "exp": b"1700086400000",
        "ra": b"0",
    }
    h.update(changes)
    return {k: v for k, v in h.items() if v is not None}


def stream_fields(dlq_id: str = "abc", **changes: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "dlq_id": dlq_id.encode(),
        "agent_id": b"agent-1",
        "operation_type": b"wiki_write",
        "retry_count": b"3",
        "last_error": b"NETWORK_TIMEOUT",
        "failed_at": b"2023-11-14T22:13:20.000Z",
        "original_operation": b'{"page": "Home"}',
        "meta:idempotency_key": b"k1",
    }
    s.update(changes)
    return {k: v for k, v in s.items() if v is not None}


def test_a_record_decodes_from_its_hash_and_stream_entry() -> None:
    rec = ops().record("abc", hash_fields(le=b"boom", ra=b"2", co=b"r1", ce=b"1700000001000"),
                       stream_fields())
    assert isinstance(rec, DlqRecord)
    assert rec.status is DlqStatus.PENDING
    assert rec.original_operation == {"page": "Home"}
    assert rec.last_error == "boom"
    assert rec.original_error == "NETWORK_TIMEOUT"
    assert rec.replay_attempts == 2
    assert rec.metadata == {"idempotency_key": "k1"}
    assert rec.failed_at.tzinfo is not None
    assert rec.claimed_by == "r1"
    assert rec.stream_id == "1700000000000-0"


@pytest.mark.parametrize(
    ("h", "s", "key"),
    [
        (hash_fields(st=b"lost"), stream_fields(), "ns:dlq:{dlq}:rec:abc"),
        (hash_fields(ts=b"soon"), stream_fields(), "ns:dlq:{dlq}:rec:abc"),
        (hash_fields(ts=None), stream_fields(), "ns:dlq:{dlq}:rec:abc"),
        (hash_fields(), stream_fields(original_operation=b"{not json"), "ns:dlq:{dlq}:stream"),
        (hash_fields(), stream_fields(original_operation=None), "ns:dlq:{dlq}:stream"),
        (hash_fields(), stream_fields(original_operation=None, original_operation_msgpack=b"\xc1"),
         "ns:dlq:{dlq}:stream"),
        (hash_fields(), stream_fields(dlq_id="other"), "ns:dlq:{dlq}:stream"),
        (hash_fields(), stream_fields(retry_count=b"many"), "ns:dlq:{dlq}:stream"),
    ],
)
def test_garbage_fields_raise_corrupt_data_naming_the_key(
    h: dict[str, Any], s: dict[str, Any], key: str
) -> None:
    with pytest.raises(CorruptData) as err:
        ops().record("abc", h, s)
    assert err.value.key == key


def test_a_corrupt_script_reply_names_the_key_the_script_reported() -> None:
    o = ops()
    call = o.enqueue(**enqueue_args())
    with pytest.raises(CorruptData) as err:
        o.decode_enqueue(call, [b"corrupt", b"ns:dlq:{dlq}:stream", b"a string where ..."])
    assert err.value.key == "ns:dlq:{dlq}:stream"
    with pytest.raises(CorruptData):
        o.decode_enqueue(call, None)


def test_stats_subtract_the_expired_backlog_and_flag_over_max_pending() -> None:
    reply = [
        b"ok",
        1700000010000,
        [b"pending|wiki_write", b"3", b"replayed|wiki_write", b"1", b"pending|mcp|call", b"2"],
        [b"pending|wiki_write", 1],
        b"001700000000000-a0|abc",
    ]
    stats = ops(max_pending=3).decode_stats(reply)
    assert stats.by_status == {
        DlqStatus.PENDING: 4, DlqStatus.REPLAYED: 1, DlqStatus.ABANDONED: 0
    }
    assert stats.by_operation_type["mcp|call"][DlqStatus.PENDING] == 2
    assert stats.pending_for("wiki_write") == 2
    assert stats.total == 5
    assert stats.expired_awaiting_cleanup == 1
    assert stats.oldest_pending_age_seconds == 10.0
    assert stats.over_max_pending is True


def test_members_of_the_by_type_index_decode_to_their_ids() -> None:
    members = ops().decode_members("wiki", [b"wiki\x00001700000000000-a0|abc"])
    assert [(m.sort_key, m.dlq_id) for m in members] == [("001700000000000-a0", "abc")]
    with pytest.raises(CorruptData) as err:
        ops().decode_members(None, [b"garbage"])
    assert err.value.key == "ns:dlq:{dlq}:pending"


# --- replay plan decisions ----------------------------------------------------------------


def _handler(record: DlqRecord) -> None:
    raise AssertionError("the plan asks its driver to run the handler")


def _one_shielded_call(step: object) -> ScriptCall:
    """The replay's claim and the notes of its outcome wait out a cancellation."""
    assert isinstance(step, IO) and step.shield and len(step.calls) == 1
    return step.calls[0]


def _poll(step: object) -> None:
    """An unshielded no-op: an interruption held back meanwhile lands here."""
    assert isinstance(step, Sleep) and step.seconds == 0 and not step.shield


def test_a_claim_held_elsewhere_skips_without_running_the_handler() -> None:
    plan = ops().replay_steps("abc", handler_plan(_handler))
    _poll(plan.send(None))
    call = _one_shielded_call(plan.send(None))
    assert call.name == "dlq_claim"
    with pytest.raises(StopIteration) as done:
        plan.send([[b"busy", b"other-host:1", 1700000000000]])
    result = done.value.value
    assert result.outcome is ReplayOutcome.CLAIMED_ELSEWHERE


def test_a_raising_handler_is_reported_with_its_error_and_token() -> None:
    plan = ops().replay_steps("abc", handler_plan(_handler))
    _poll(plan.send(None))
    plan.send(None)
    h = [x for kv in hash_fields(co=b"me", ct=b"1-5", ce=b"1").items() for x in kv]
    s = [x for kv in stream_fields().items() for x in kv]
    _poll(plan.send([[b"ok", b"1-5", 0, h, s]]))
    step = plan.send(None)
    assert isinstance(step, Run) and step.fn is _handler
    assert step.arg.dlq_id == "abc"
    fail = _one_shielded_call(plan.send((False, OperationError("SERVICE_UNAVAILABLE", "down"))))
    assert fail.name == "dlq_fail"
    assert list(fail.args) == ["1-5", "SERVICE_UNAVAILABLE: down", "abc"]
    with pytest.raises(StopIteration) as done:
        plan.send([[b"ok", 1]])
    assert done.value.value.outcome is ReplayOutcome.FAILED
    assert done.value.value.replay_attempts == 1


def test_error_text_keeps_codes_and_names_plain_exceptions() -> None:
    assert error_text(OperationError("RATE_LIMITED", "slow down")) == "RATE_LIMITED: slow down"
    assert error_text(ValueError("bad")) == "ValueError: bad"
    assert error_text(TimeoutError()) == "TimeoutError"


@pytest.mark.parametrize("raised", [RuntimeError, SystemExit, KeyboardInterrupt])
def test_error_text_never_raises_on_an_exception_that_cannot_be_printed(
    raised: type[BaseException],
) -> None:
    class Unprintable(Exception):
        @property
        def code(self) -> str:
            raise raised("no code")

        def __str__(self) -> str:
            raise raised("no str")

    assert error_text(Unprintable()) == "Unprintable: <Unprintable: str() failed>"


def test_pacer_spaces_handler_starts() -> None:
    pacer = _Pacer(4.0)
    assert pacer.wait(10.0) == 0.0
    pacer.started(10.0)
    assert pacer.wait(10.1) == pytest.approx(0.15)
    assert pacer.wait(11.0) == 0.0
    unpaced = _Pacer(None)
    unpaced.started(10.0)
    assert unpaced.wait(10.0) == 0.0


def test_tally_counts_runs_and_skips() -> None:
    tally = _Tally()
    assert tally.add(ReplayResult("a", ReplayOutcome.REPLAYED))
    assert tally.add(ReplayResult("b", ReplayOutcome.FAILED))
    assert tally.add(ReplayResult("c", ReplayOutcome.CLAIM_LOST))
    assert not tally.add(ReplayResult("d", ReplayOutcome.CLAIMED_ELSEWHERE))
    assert not tally.add(ReplayResult("e", ReplayOutcome.NOT_FOUND))
    summary = tally.summary()
    assert (summary.replayed, summary.failed, summary.lost, summary.skipped) == (1, 1, 1, 2)
    assert summary.failed_ids == ("b",)
    assert tally.ran == 3


def test_text_with_lone_surrogates_is_cleaned_not_refused() -> None:
    call = ops().enqueue(
        **enqueue_args(last_error="bad \udcff byte"), metadata={"k\udcff": "v\udcff"}
    )
    for arg in (call.args[6], *call.args[11:]):
        str(arg).encode("utf-8")  # would raise on a lone surrogate


def test_metadata_that_is_not_a_mapping_raises_invalid_payload() -> None:
    with pytest.raises(InvalidPayload):
        ops().enqueue(**enqueue_args(), metadata=[("k", "v")])  # type: ignore[arg-type]


def test_a_cancellation_held_back_during_the_claim_releases_it_before_the_handler_starts() -> None:
    plan = ops().replay_steps("abc", handler_plan(_handler))
    _poll(plan.send(None))
    plan.send(None)  # the claim, shielded: a cancellation waits for its reply
    h = [x for kv in hash_fields(co=b"me", ct=b"1-5", ce=b"1").items() for x in kv]
    s = [x for kv in stream_fields().items() for x in kv]
    _poll(plan.send([[b"ok", b"1-5", 0, h, s]]))  # ... and is delivered here
    release = _one_shielded_call(plan.throw(asyncio.CancelledError()))
    token, _, _, mode = release.args
    assert release.name == "dlq_fail" and token == "1-5" and mode == "defer"  # nothing counted
    with pytest.raises(asyncio.CancelledError):
        plan.send([[b"ok", 0]])
