"""A request's common case takes a shorter way through the same checks (and
what a deferred success keeps of its step's gates).

``_Requests.request`` validates and encodes an operation before any I/O. For
its common case (a content key of an (agent, operation) pair seen before, no
task, wait, deadline or replay, no previous key secret) it takes
``_common_request``, which skips the checks of the options not given. Both
must build the same request: the same key, envelope and dependency, and the
DLQ record prepared before the claim for exactly the same payload sizes (the
record's room depends on the metadata's bytes). No server: building and
validating a request does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import durabilis
from durabilis import CircuitBreakerConfig, DlqConfig
from durabilis.core.layer.base import _Claim, _Request
from durabilis.core.steps import IO, Defer
from durabilis.errors import StorageUnavailable
from durabilis.layer import DurabilityConfig, DurabilityLayer

CAP = 2048  # the DLQ record's payload cap here (1 MiB by default)
OPTIONS: dict[str, Any] = dict(
    dependency=None, idempotency_key=None, task_id=None, phase=None, wait=None,
    park_on_open=False, deadline_seconds=None,
)


@pytest.fixture
def layer() -> Iterator[DurabilityLayer]:
    store = durabilis.connect("redis://127.0.0.1:9", namespace="req")  # never connected
    config = DurabilityConfig(
        breakers=(CircuitBreakerConfig("ledger"),), dependencies={"pay": "ledger"},
        dlq=DlqConfig(max_payload_bytes=CAP),
    )
    layer = DurabilityLayer(store, config)
    try:
        yield layer
    finally:
        layer.close()
        store.close()


def fields(req: _Request) -> tuple[Any, ...]:
    park = req.park
    return (
        req.agent_id, req.operation_type, req.payload, req.key, req.dependency,
        req.task_id, req.phase, req.wait, req.park_on_open, req.deadline, req.replay,
        req.envelope, None if park is None else (park.payload, park.metadata),
        req.replay_claim, req.aliases,
    )


def built(layer: DurabilityLayer, agent: str, op: str, payload: Any) -> Any:
    """The request's fields, or the type and text of the error it raised."""
    try:
        return fields(layer._core.request(agent, op, payload, **OPTIONS))
    except Exception as exc:
        return type(exc), str(exc)


def both(layer: DurabilityLayer, agent: str, op: str, payload: Any) -> tuple[Any, Any]:
    """The request built the general way (a pair not seen yet), then the common way."""
    core = layer._core
    core._known.clear()
    core.request(agent, op, {}, **OPTIONS)  # (the pair's parts checked: then the common way)
    core._known.clear()
    general = built(layer, agent, op, payload)
    core.request(agent, op, {}, **OPTIONS)
    assert (agent, op) in core._known
    return general, built(layer, agent, op, payload)


@pytest.mark.parametrize(("agent", "op"), [
    ("agent-1", "memory.store"), ("agent-\u00e9\u4e2d", "pay"), ("a", "pay"),
])
def test_the_common_way_builds_the_request_the_general_way_does(
    layer: DurabilityLayer, agent: str, op: str
) -> None:
    general, common = both(layer, agent, op, {"fact": "x", "n": 1})
    assert common == general
    assert common[4] == ("ledger" if op == "pay" else None)  # (the dependency)


@pytest.mark.parametrize(("agent", "op"), [("agent-1", "memory.store"), ("agent-\u00e9", "pay")])
def test_the_dlq_record_is_prepared_for_the_same_payload_sizes_either_way(
    layer: DurabilityLayer, agent: str, op: str
) -> None:
    """Through the size where the envelope stops fitting the record's room, to
    where the payload does not fit the record at all (PayloadTooLarge)."""
    seen = set()
    for size in range(CAP - 400, CAP + 10):
        general, common = both(layer, agent, op, {"text": "y" * size})
        assert common == general, size
        seen.add("error" if type(general[0]) is type else general[12] is not None)
    assert seen == {False, True, "error"}  # (the range holds both boundaries)


def test_a_deferred_success_s_checkpoint_save_does_not_gate_its_record(
    layer: DurabilityLayer,
) -> None:
    """Found by a review: a success whose record step could not be sent for its
    lease is handed to the keep-alive with the step's gates; the checkpoint
    save's gate ended that step at a refused save (stale eviction hints, a
    conflict: the plan itself decodes those, the keep-alive decodes nothing),
    so the record was never sent, the claim lapsed and a replay ran the
    operation again. The deferred step keeps the record's gate only."""
    core = layer._core
    core.clock = lambda: now[0]
    now = [0.0]
    req = core.request("agent-1", "memory.store", {"fact": "x"}, **{
        **OPTIONS, "task_id": "t1", "phase": "p1",
    })
    claim = _Claim("nonce1", "", "7")
    plan = core._succeeded(req, claim, None, {"ok": True}, 1.0)
    step = next(plan)
    names = [c.name for c in step.calls]
    assert "ckpt_save" in names and "idem_record" in names
    while type(step) is not Defer:  # the record step fails until its time is out
        if type(step) is IO:
            now[0] += 60.0
            step = plan.throw(StorageUnavailable("down"))
        else:  # (its backoff)
            step = plan.send(None)
    gated = {step.calls[i].name for i in step.gates or {}}
    assert gated == {"idem_record"}  # (was: the save too)
    assert [c.name for c in step.calls][:2] == names[:2]
