"""What a call is keyed by and what its operation is handed (issue 32):
``@layer.durable`` keys the call, not its spelling (sync and asyncio);
``ctx.idempotency_key`` forwards the scoped stored key and ``ctx.caller_key``
the caller's key as given; ``max_key_length`` counts the key the user gave."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durabilis
from durabilis import IdempotencyKey, OperationError, RetryExhausted
from durabilis.dlq import DlqConfig
from durabilis.errors import InvalidKey
from durabilis.layer import (
    AsyncDurabilityLayer,
    DurabilityLayer,
    OperationContext,
    current_operation,
)
from durabilis.testing import instant_retries
from tests.integration._layer_support import Counter, fast_config


@pytest.fixture
def layer(store: durabilis.Store) -> Any:
    made = DurabilityLayer(store, fast_config())
    yield made
    made.close()


# --- what fn is handed ----------------------------------------------------------------


def test_ctx_forwards_the_scoped_key_and_the_callers_key_as_given(
    layer: DurabilityLayer,
) -> None:
    op = Counter()
    layer.execute("gw-1", "job", {"o": 1}, op, idempotency_key="order-o-1")
    layer.execute("gw-2", "job", {"o": 1}, op, idempotency_key="order-o-1")
    first, second = op.calls
    # Two agents' equal client keys stay apart downstream: the scoped form.
    assert first.idempotency_key == "%raw:gw-1:order-o-1"
    assert second.idempotency_key == "%raw:gw-2:order-o-1"
    assert first.caller_key == second.caller_key == "order-o-1"

    # A content key forwards what it always did, and has no caller's key.
    layer.execute("gw-1", "job", {"c": 1}, op)
    assert op.calls[-1].idempotency_key == str(IdempotencyKey.new("gw-1", "job", {"c": 1}))
    assert op.calls[-1].caller_key is None

    # A replay hands the same two keys again.
    down = Counter(fail_codes=["NETWORK_TIMEOUT"] * 10)
    with instant_retries(), pytest.raises(RetryExhausted) as info:
        layer.execute("gw-1", "job", {"o": 2}, down, idempotency_key="order-o-2")
    assert info.value.dlq_id is not None
    replayed = Counter()
    layer.replay(info.value.dlq_id, replayed)
    (ctx,) = replayed.calls
    assert ctx.replay and ctx.idempotency_key == "%raw:gw-1:order-o-2"
    assert ctx.caller_key == "order-o-2"


# --- the length limit -----------------------------------------------------------------


def test_max_key_length_counts_the_callers_key_not_the_layers_scope(
    layer: DurabilityLayer,
) -> None:
    op = Counter()
    layer.execute("gw-1", "job", "p", op, idempotency_key="k" * 240)
    layer.execute("gw-1", "job", "p", op, idempotency_key="k" * 256)  # exactly the limit
    assert len(op.calls) == 2
    with pytest.raises(InvalidKey) as info:
        layer.execute("gw-1", "job", "p", op, idempotency_key="k" * 257)
    message = str(info.value)
    assert "257 bytes, over max_key_length=256" in message
    assert "the key as given is counted, not the layer's %raw:<agent>: scope" in message
    assert len(op.calls) == 2

    # The stored form's own cap: max_key_length + 1024 bytes of scope (reached by
    # an agent id the DLQ is configured to take: max_name_bytes is 256 by default).
    roomy = DurabilityLayer(layer.store, fast_config(dlq=DlqConfig(max_name_bytes=4096)))
    try:
        with pytest.raises(InvalidKey) as info:
            roomy.execute("g" * 1100, "job", "p", op, idempotency_key="k" * 200)  # 1306
        assert "over its cap of max_key_length + 1024 = 1280" in str(info.value)
        roomy.execute("g" * 1000, "job", "p", op, idempotency_key="k" * 256)  # 1262
    finally:
        roomy.close()
    assert len(op.calls) == 3


# --- @layer.durable keys the call -----------------------------------------------------


def test_durable_keys_the_call_not_its_spelling(layer: DurabilityLayer) -> None:
    ran: list[OperationContext | None] = []

    @layer.durable("job", agent_id="bot")
    def remember(fact: str, source: str = "user") -> str:
        ran.append(current_operation())
        return f"{fact}/{source}"

    for call in (lambda: remember("x"), lambda: remember(fact="x"),
                 lambda: remember("x", "user"), lambda: remember("x", source="user"),
                 lambda: remember(source="user", fact="x")):
        assert call() == "x/user"
    assert len(ran) == 1
    ctx = ran[0]
    # An argument at its default is left out of the payload.
    assert ctx is not None and ctx.payload == {"args": ["x"], "kwargs": {}}
    # The canonical spelling keeps the key the decorator gave it before binding.
    assert ctx.idempotency_key == str(IdempotencyKey.new(
        "bot", "job", {"args": ["x"], "kwargs": {}}))
    assert remember("x", "bot") == "x/bot" and remember("y") == "y/user"
    assert len(ran) == 3

    @layer.durable("job", agent_id="bot")
    def tag(first: str, *names: str, strict: bool = False, **attrs: int) -> int:
        ran.append(current_operation())
        return len(names) + len(attrs)

    assert tag("a", "b", k=1) == tag(first="a", k=1) + 1
    assert tag("a", "b", strict=False, k=1) == 2  # the default spelled: the same call
    assert len(ran) == 5
    assert ran[3] is not None and ran[3].payload == {
        "args": ["a", "b"], "kwargs": {"k": 1}}

    # A call that does not fit the signature fails as the function would, before a claim.
    with pytest.raises(TypeError):
        remember()
    with pytest.raises(TypeError):
        remember("x", fact="x")
    assert len(ran) == 5


def test_async_durable_keys_the_call_not_its_spelling(redis_url: str, namespace: str) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, fast_config())
        ran: list[OperationContext | None] = []

        @layer.durable("job", agent_id="bot")
        async def remember(fact: str, source: str = "user") -> str:
            ran.append(current_operation())
            return f"{fact}/{source}"

        try:
            assert await remember("x") == "x/user"
            assert await remember(fact="x") == "x/user"
            assert await remember("x", source="user") == "x/user"
            assert len(ran) == 1
            assert ran[0] is not None and ran[0].payload == {"args": ["x"], "kwargs": {}}
            assert await remember("x", "bot") == "x/bot"
            assert len(ran) == 2
            with pytest.raises(TypeError):
                await remember()
        finally:
            await layer.close()
            await store.close()

    asyncio.run(main())


def test_durable_payload_is_what_a_failed_call_parks(layer: DurabilityLayer) -> None:
    @layer.durable("job", agent_id="bot")
    def send(to: str, body: str = "hi") -> None:
        raise OperationError("NETWORK_TIMEOUT", "down")

    with instant_retries(), pytest.raises(RetryExhausted) as info:
        send(to="ann")
    assert info.value.dlq_id is not None
    record = layer.dlq.get(info.value.dlq_id)
    assert record is not None
    assert record.original_operation == {"args": ["ann"], "kwargs": {}}


def test_durable_keys_a_call_alike_across_a_deploy_that_adds_a_parameter_or_changes_a_default(
    layer: DurabilityLayer,
) -> None:
    # Two replicas of a rolling deploy: the new one added an optional
    # parameter (its default not even JSON) and changed a default. A
    # re-delivery of a call that left them out is the same operation.
    ran: list[str] = []
    unset = object()

    @layer.durable("job", agent_id="bot")
    def before(fact: str, source: str = "user") -> str:
        ran.append("before")
        return fact

    @layer.durable("job", agent_id="bot")
    def after(fact: str, source: str = "api", *, tag: object = unset) -> str:
        ran.append("after")
        return fact

    assert before("x") == "x"
    assert after("x") == "x"
    assert after(fact="x", tag=unset) == "x"
    assert ran == ["before"]


def test_durable_never_merges_calls_whose_arguments_differ_from_the_default_in_json(
    layer: DurabilityLayer,
) -> None:
    # An argument is left out only when it is the default object or the same
    # JSON: -0.0 is not 0.0, 1.0 not 1, True not 1 (the key tells them apart).
    ran: list[Any] = []

    @layer.durable("job", agent_id="bot")
    def g(x: str, when: float = -0.0, opts: Any = None) -> Any:
        ran.append((when, opts))
        return when

    g("x")
    g("x", 0.0)
    g("x", -0.0, {"scale": 1})
    g("x", -0.0, {"scale": 1.0})
    g("x", -0.0, {"scale": True})
    g("x", -0.0, None)  # the default: the first call again
    assert len(ran) == 5
