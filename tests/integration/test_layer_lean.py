"""The durable call's lean request (docs/layer.md, "Check before the effect"): a
failure's DLQ record is built only when the operation is parked, from the payload
as it was claimed, and a request of an (agent, operation) pair seen before does
not check and escape its key parts again. What a caller sees is unchanged."""

from __future__ import annotations

import datetime
import decimal
import re
import threading
from typing import Any

import pytest

import durabilis
from durabilis import DlqConfig, IdempotencyKey, OperationError, RetryExhausted
from durabilis.errors import InvalidKey, PayloadTooLarge
from durabilis.layer import DurabilityLayer
from tests.integration._layer_support import Counter, fast_config


def _exhausted(layer: DurabilityLayer, payload: Any, fn: Any = None, **kw: Any) -> Any:
    with pytest.raises(RetryExhausted) as info:
        layer.execute("a1", "job", payload, fn or Counter(["NETWORK_TIMEOUT"] * 3), **kw)
    record = layer.dlq.get(str(info.value.dlq_id))
    assert record is not None
    return record


def test_a_payload_fn_changed_is_parked_as_it_was_claimed(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, fast_config())

    def fn(ctx: durabilis.OperationContext) -> Any:
        ctx.payload["rows"].append(ctx.attempt)  # (the caller's own object)
        ctx.payload["seen"] = True
        raise OperationError("NETWORK_TIMEOUT", "down")

    payload = {"rows": [], "page": "P"}
    record = _exhausted(layer, payload, fn)
    assert record.original_operation == {"rows": [], "page": "P"}
    assert payload == {"rows": [0, 1, 2], "page": "P", "seen": True}


@pytest.mark.parametrize("payload", [
    {"page": "P", "n": 1, "f": 0.5, "none": None, "text": "\u00e9\u4e2d"},
    ("a", 1),
    b"\x00\xff bytes",
    {"when": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
     "amount": decimal.Decimal("1.10"), "tags": {"x", "y"}},
    {1: "int keys"},
    "plain text",
])
def test_a_parked_payload_comes_back_exactly(store: durabilis.Store, payload: Any) -> None:
    layer = DurabilityLayer(store, fast_config())
    record = _exhausted(layer, payload, idempotency_key="k-1")  # (any payload: a caller key)
    assert record.original_operation == payload
    assert type(record.original_operation) is type(payload)


def test_a_payload_near_the_dlq_cap_is_checked_before_the_claim(
    store: durabilis.Store,
) -> None:
    """A payload whose envelope is over the DLQ record's room is prepared before
    the claim: refused there if it cannot be parked (nothing claimed, fn never
    runs), else parked whole when it fails."""
    cap = 600
    layer = DurabilityLayer(store, fast_config(dlq=DlqConfig(max_payload_bytes=cap)))
    big = {"text": "x" * (cap + 10)}
    op = Counter()
    with pytest.raises(PayloadTooLarge):
        layer.execute("a1", "job", big, op)
    assert op.calls == []
    assert layer.idempotency.check(IdempotencyKey.new("a1", "job", big)) is None
    # Fits the record, though the envelope around it (agent, type, key...) does not.
    near = {"text": "y" * (cap - 220)}
    core = layer._core
    req = core.request(
        "a1", "job", near, dependency=None, idempotency_key=None, task_id=None,
        phase=None, wait=None, park_on_open=False, deadline_seconds=None,
    )
    room = core._park_room(core._metadata(req.key.value, req.dependency, None, None, None))
    assert len(durabilis._codec.pack(near, what="p")) <= room < len(req.envelope)
    assert req.park is not None  # (prepared before the claim)
    assert _exhausted(layer, near).original_operation == near


@pytest.mark.parametrize("secret", [None, "s3cret-s3cret-s3cret"])
def test_a_pair_seen_before_gives_the_key_it_gave_the_first_time(
    store: durabilis.Store, secret: str | None,
) -> None:
    config = fast_config(idempotency=durabilis.IdempotencyConfig(key_secret=secret))
    layer = DurabilityLayer(store, config)
    keys = [
        layer.execute("a:1%", "op:w%", {"i": i}, lambda ctx: ctx.idempotency_key)
        for i in (1, 2, 1)
    ]
    assert keys[0] == keys[2] != keys[1]
    for i, key in zip((1, 2), keys, strict=False):
        assert key == IdempotencyKey.new("a:1%", "op:w%", {"i": i}, secret=secret).value


def test_bad_key_parts_are_refused_whatever_pairs_were_seen(store: durabilis.Store) -> None:
    layer = DurabilityLayer(store, fast_config())
    op = Counter()
    layer.execute("a1", "job", "p", op)
    for agent, op_type in (("", "job"), ("a1", ""), ("a\x00", "job"), ("a" * 300, "job")):
        with pytest.raises(InvalidKey):
            layer.execute(agent, op_type, "p", op)
    assert len(op.calls) == 1
    # Caller keys of a known pair are still checked.
    with pytest.raises(InvalidKey):
        layer.execute("a1", "job", "p", op, idempotency_key="k" * 300)


# --- the lean path sends what the plans send -------------------------------------------


def _steps_of(monkeypatch: pytest.MonkeyPatch, layer: DurabilityLayer, call: Any,
              *, lean: bool, tag: str) -> list[Any]:
    """The steps one call yields (calls normalised: its nonce, key and timings
    named, not valued), under the lean path or the plans alone."""
    from durabilis import _steps
    from durabilis.core import layer as _plans
    from durabilis.layer import _direct

    seen: list[Any] = []
    marks: dict[str, str] = {tag: "<tag>", layer.breakers.replica_id: "<replica>"}
    perform = _steps.perform

    def name(value: Any) -> Any:
        if isinstance(value, float) or (type(value) is int and value >= 10**12):
            return "<ms>"  # (a duration, or a time in ms: a parking guard's bound)
        if isinstance(value, (str, bytes)):
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            for real, mark in marks.items():
                text = text.replace(real, mark)
            text = re.sub(r"[0-9a-f]{32}", "<id>", text)  # (DLQ ids: of the key, the nonce)
            text = re.sub(r"\|\d+\.\d+\|", "|<ms>|", text)  # (a breaker report's duration)
            return "<token>" if text.isdigit() and len(text) >= 13 else text
        return value

    caller = threading.get_ident()

    def recording(store: Any, step: Any, leases: Any, held: Any) -> Any:
        if threading.get_ident() != caller:  # (the keep-alive's renewals: not the call's)
            return perform(store, step, leases, held)
        if type(step) is _steps.Hold:
            marks[step.nonce] = "<nonce>"
            marks[step.key] = "<key>"
        if type(step) is _steps.IO:
            seen.append((
                [(c.name, [name(k) for k in c.keys], [name(a) for a in c.args])
                 for c in step.calls],
                sorted(step.gates or {}), step.shield, list(step.waves or []),
            ))
        else:
            seen.append(type(step).__name__)
        return perform(store, step, leases, held)

    monkeypatch.setattr(_steps, "perform", recording)
    if not lean:
        monkeypatch.setattr(_plans._LayerCore, "_lean", lambda self, req, policy: False)
    else:  # (the sync layer performs the lean plan's steps in place: layer._direct)
        lean_run = _direct._lean

        def counted(*args: Any) -> Any:
            seen.append("lean")
            return lean_run(*args)

        monkeypatch.setattr(_direct, "_lean", counted)
    try:
        call()
    except Exception as exc:  # (the same error both ways: compared by the caller)
        seen.append(type(exc).__name__)
    finally:
        monkeypatch.undo()
    return seen


@pytest.mark.parametrize("breaker", [False, True])
@pytest.mark.parametrize("story", ["success", "retried", "duplicate", "fails"])
def test_the_lean_path_sends_the_steps_the_plans_send(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch, breaker: bool, story: str,
) -> None:
    """The same operation, once on the lean path and once on the plans alone
    (each in a namespace of its own): the same steps, calls, gates, shields and
    waves, in the same order. The simulator's faults between steps then meet the
    lean path exactly where they meet the plans."""

    def run(lean: bool) -> list[Any]:
        space = f"{namespace}-{'L' if lean else 'P'}"  # (one length: same arguments)
        with durabilis.connect(redis_url, namespace=space) as store:
            if not store.fuses:
                pytest.skip("the lean path is the fused (standalone) step's")
            config = fast_config() if breaker else fast_config(dependencies={})
            layer = DurabilityLayer(store, config)
            op = Counter(["NETWORK_TIMEOUT"] * {"retried": 1, "fails": 3}.get(story, 0))

            def call() -> None:
                layer.execute("a1", "job", {"tag": story}, op)
                if story == "duplicate":
                    layer.execute("a1", "job", {"tag": story}, op)

            if breaker:  # (registered: both runs' claim steps alike)
                layer.execute("a1", "job", {"warm": story}, Counter())
            steps = _steps_of(monkeypatch, layer, call, lean=lean, tag=space)
            layer.close()
        return steps

    lean, plans = run(True), run(False)
    assert lean.count("lean") == (2 if story == "duplicate" else 1)  # (it did run)
    lean = [step for step in lean if step != "lean"]
    for i, (a, b) in enumerate(zip(lean, plans, strict=False)):
        assert a == b, f"step {i}:\n{a}\n{b}"
    assert lean == plans
    assert "Run" in lean
