"""A request's common case takes a shorter way through the same checks.

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
from durabilis.layer import DurabilityConfig, DurabilityLayer
from durabilis.layer._plans.base import _Request

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
