"""OpenTelemetry spans of durable calls (durabilis.otel), read with the SDK's
in-memory exporter: a success, a retry (events), a park (DLQ id, status, the
trace context kept in the record) and its replay (a Link to the parked call's
span), the async twin, and nothing at all when tracing is off.

Each test hands its own SDK ``TracerProvider`` to ``durabilis.otel.use`` (and
takes it back after): the global provider, which OpenTelemetry lets a process
set only once, is never touched here, except in the child processes of the
tests that show how a global provider is picked up.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import durabilis
from durabilis import (
    CircuitBreakerConfig,
    DlqConfig,
    OperationError,
    RetryExhausted,
    aio,
    otel,
)
from durabilis.dlq import ReplayOutcome
from durabilis.errors import PayloadTooLarge
from durabilis.layer import AsyncDurabilityLayer, DurabilityLayer, OperationContext
from tests.integration._cli_support import run_cli
from tests.integration._layer_support import Counter, fast_config

pytestmark = pytest.mark.topologies("cluster")

ROOT = Path(__file__).resolve().parents[2]
# A breaker that never trips in these tests: a park is a plain exhaustion.
CALM = CircuitBreakerConfig("svc", 1.0, 4, 1, 1, 10, 1)  # (a rate over 1.0: never)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """durabilis's spans go to an SDK provider of this test's, exported in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.use(provider)
    try:
        yield exporter
    finally:
        otel.use(None)
        provider.shutdown()


@pytest.fixture
def layer(store: durabilis.Store) -> Iterator[DurabilityLayer]:
    with DurabilityLayer(store, fast_config(breaker=CALM)) as made:
        yield made


def _only(exporter: InMemorySpanExporter) -> ReadableSpan:
    finished = exporter.get_finished_spans()
    assert len(finished) == 1, [s.name for s in finished]
    exporter.clear()
    return finished[0]


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_a_success_is_one_internal_span_with_the_call_s_attributes(
    layer: DurabilityLayer, spans: InMemorySpanExporter
) -> None:
    assert layer.execute("a1", "job", {"text": "hi"}, Counter()) == "done"
    span = _only(spans)
    key = str(durabilis.IdempotencyKey.new("a1", "job", {"text": "hi"}))
    assert span.name == "durabilis.execute job"
    assert span.kind is SpanKind.INTERNAL
    assert span.status.status_code is StatusCode.UNSET
    assert _attrs(span) == {
        "durabilis.operation.type": "job",
        "durabilis.agent.id": "a1",
        "durabilis.key.hash": otel.key_hash(key),
        "durabilis.dependency": "svc",
        "durabilis.outcome": "success",
        "durabilis.attempts": 1,
        "durabilis.breaker.decision": "admitted",
    }
    assert not span.events and not span.links

    # The same call again: answered from the record, nothing ran.
    assert layer.execute("a1", "job", {"text": "hi"}, Counter()) == "done"
    dup = _only(spans)
    assert _attrs(dup)["durabilis.outcome"] == "duplicate"
    assert _attrs(dup)["durabilis.attempts"] == 0
    assert "durabilis.breaker.decision" not in _attrs(dup)  # a duplicate asks no breaker


def test_a_retry_is_an_event_on_the_call_s_span(
    layer: DurabilityLayer, spans: InMemorySpanExporter
) -> None:
    assert layer.execute("a1", "job", "p", Counter(["NETWORK_TIMEOUT"])) == "done"
    span = _only(spans)
    assert _attrs(span)["durabilis.outcome"] == "success"
    assert _attrs(span)["durabilis.attempts"] == 2
    assert [(e.name, dict(e.attributes or {})) for e in span.events] == [
        ("durabilis.retry", {
            "durabilis.attempt": 1, "durabilis.retry.delay_ms": 1.0,
            "durabilis.error.code": "NETWORK_TIMEOUT",
        }),
    ]


def test_the_call_s_span_is_current_while_fn_runs_and_only_then(
    layer: DurabilityLayer, spans: InMemorySpanExporter
) -> None:
    seen: list[Any] = []

    def fn(_ctx: OperationContext) -> str:
        seen.append(trace.get_current_span().get_span_context())  # fn's own spans: children
        return "ok"

    layer.execute("a1", "job", "child", fn)
    span = _only(spans)
    assert seen == [span.get_span_context()]
    assert trace.get_current_span() is trace.INVALID_SPAN  # and no longer after


def test_a_park_and_its_replay_link_to_the_parked_call_s_span(
    layer: DurabilityLayer, spans: InMemorySpanExporter, capsys: pytest.CaptureFixture[str],
    redis_url: str, namespace: str,
) -> None:
    with pytest.raises(RetryExhausted) as parked:
        layer.execute("a1", "job", {"n": 1}, Counter(["NETWORK_TIMEOUT"] * 3))
    dlq_id = parked.value.dlq_id
    assert dlq_id is not None
    park = _only(spans)
    assert park.status.status_code is StatusCode.ERROR
    attrs = _attrs(park)
    assert (attrs["durabilis.outcome"], attrs["durabilis.attempts"]) == ("parked", 3)
    assert attrs["durabilis.dlq.id"] == dlq_id
    assert attrs["durabilis.error.code"] == "NETWORK_TIMEOUT"
    assert attrs["error.type"] == "RetryExhausted"
    assert [e.attributes["durabilis.attempt"] for e in park.events if e.attributes] == [1, 2]

    record = layer.dlq.get(dlq_id)
    assert record is not None
    assert record.trace_context == (_traceparent(park), None)
    # `durabilis dlq show` prints it on one line.
    code, out, _ = run_cli(capsys, "dlq", "show", dlq_id, "--url", redis_url,
                           "--namespace", namespace)
    assert code == 0
    assert [line.split() for line in out.splitlines() if line.startswith("trace ")] == [
        ["trace", _traceparent(park)]
    ]
    assert "traceparent" not in out  # (not a second time, in the metadata)

    result = layer.replay(dlq_id, Counter())
    assert result.outcome is ReplayOutcome.REPLAYED
    replay = _only(spans)
    assert replay.name == "durabilis.replay job"
    assert _attrs(replay)["durabilis.replay"] is True
    assert _attrs(replay)["durabilis.dlq.id"] == dlq_id
    assert _attrs(replay)["durabilis.outcome"] == "success"
    assert _attrs(replay)["durabilis.key.hash"] == attrs["durabilis.key.hash"]
    [link] = replay.links
    assert link.context.trace_id == park.context.trace_id
    assert link.context.span_id == park.context.span_id
    assert link.context.is_remote
    assert dict(link.attributes or {}) == {"durabilis.dlq.id": dlq_id}


def test_replay_pending_and_requeued_link_each_record_to_its_parked_call(
    layer: DurabilityLayer, spans: InMemorySpanExporter
) -> None:
    parked: dict[str, ReadableSpan] = {}
    for n in range(2):
        with pytest.raises(RetryExhausted) as exc:
            layer.execute("a1", "job", {"n": n}, Counter(["NETWORK_TIMEOUT"] * 3))
        assert exc.value.dlq_id is not None
        parked[exc.value.dlq_id] = _only(spans)
    summary = layer.replay_pending(Counter(), "job")
    assert summary.replayed == 2
    for span in spans.get_finished_spans():
        [link] = span.links
        origin = parked[_attrs(span)["durabilis.dlq.id"]]
        assert (link.context.trace_id, link.context.span_id) == (
            origin.context.trace_id, origin.context.span_id)
    spans.clear()

    with pytest.raises(RetryExhausted) as exc:
        layer.execute("a1", "job", {"n": 9}, Counter(["NETWORK_TIMEOUT"] * 3))
    dlq_id = exc.value.dlq_id
    assert dlq_id is not None
    origin = _only(spans)
    assert [r.outcome for r in layer.dlq.requeue([dlq_id], by="test")] == ["requeued"]
    assert layer.replay_requeued({"job": Counter()}).replayed == 1
    [link] = _only(spans).links
    assert link.context.span_id == origin.context.span_id


def test_a_parked_call_keeps_the_caller_s_trace_and_tracestate(
    layer: DurabilityLayer, spans: InMemorySpanExporter
) -> None:
    caller = trace.SpanContext(
        0x1234, 0x5678, is_remote=True, trace_flags=trace.TraceFlags(1),
        trace_state=trace.TraceState([("vendor", "v1")]),
    )
    token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(caller)))
    try:
        with pytest.raises(RetryExhausted) as exc:
            layer.execute("a1", "job", "traced", Counter(["NETWORK_TIMEOUT"] * 3))
    finally:
        context.detach(token)
    park = _only(spans)
    assert park.context.trace_id == 0x1234  # the caller's trace
    assert park.parent is not None and park.parent.span_id == 0x5678
    assert exc.value.dlq_id is not None
    record = layer.dlq.get(exc.value.dlq_id)
    assert record is not None
    assert record.trace_context == (_traceparent(park), "vendor=v1")


def test_no_attribute_or_event_holds_the_key_or_the_payload(
    layer: DurabilityLayer, spans: InMemorySpanExporter
) -> None:
    secret_key, secret_payload = "order-4242-secret", "payload-secret-77"
    op = Counter(["NETWORK_TIMEOUT"] * 3)
    with pytest.raises(RetryExhausted) as exc:
        layer.execute("a1", "job", {"v": secret_payload}, op, idempotency_key=secret_key)
    assert exc.value.dlq_id is not None
    layer.replay(exc.value.dlq_id, Counter())
    layer.execute("a1", "job", {"v": secret_payload}, Counter(), idempotency_key=secret_key)
    finished = spans.get_finished_spans()
    assert len(finished) == 3
    texts = []
    for span in finished:
        texts += [span.name, *map(str, _attrs(span).values())]
        for event in span.events:
            texts += [event.name, *map(str, (event.attributes or {}).values())]
    assert not [t for t in texts if secret_key in t or secret_payload in t]
    assert op.calls[0].idempotency_key  # (the key the spans hash)
    assert {_attrs(s)["durabilis.key.hash"] for s in finished} == {
        otel.key_hash(op.calls[0].idempotency_key)
    }


def test_a_non_retryable_error_and_an_open_breaker_end_their_spans_in_error(
    store: durabilis.Store, spans: InMemorySpanExporter
) -> None:
    layer = DurabilityLayer(store, fast_config())
    with pytest.raises(OperationError):
        layer.execute("a1", "job", "denied", Counter(["PERMISSION_DENIED"]))
    denied = _only(spans)
    assert denied.status.status_code is StatusCode.ERROR
    assert (_attrs(denied)["durabilis.outcome"], _attrs(denied)["error.type"]) == (
        "failed", "OperationError")
    assert _attrs(denied)["durabilis.attempts"] == 1

    layer.breakers.force_open("svc")
    with pytest.raises(durabilis.CircuitOpen):
        layer.execute("a1", "job", "refused", Counter())
    refused = _only(spans)
    assert _attrs(refused)["durabilis.outcome"] == "rejected"
    assert _attrs(refused)["durabilis.breaker.decision"] == "rejected"
    assert _attrs(refused)["durabilis.attempts"] == 0
    with pytest.raises(RetryExhausted) as exc:
        layer.execute("a1", "job", "refused", Counter(), park_on_open=True)
    parked = _only(spans)
    assert _attrs(parked)["durabilis.outcome"] == "parked"
    assert _attrs(parked)["durabilis.breaker.decision"] == "rejected"
    assert _attrs(parked)["durabilis.dlq.id"] == exc.value.dlq_id
    layer.close()


def test_the_async_layer_traces_a_success_a_retry_a_park_and_its_replay(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    async def main() -> None:
        store = aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, fast_config(breaker=CALM))
        try:
            async def ok(ctx: OperationContext) -> str:
                assert trace.get_current_span().is_recording()
                return "ok"

            assert await layer.execute("a1", "job", "ok", ok) == "ok"
            assert await layer.execute("a1", "job", "retry", Counter(["NETWORK_TIMEOUT"])) \
                == "done"
            with pytest.raises(RetryExhausted) as exc:
                await layer.execute("a1", "job", "park", Counter(["NETWORK_TIMEOUT"] * 3))
            assert exc.value.dlq_id is not None
            result = await layer.replay(exc.value.dlq_id, Counter())
            assert result.outcome is ReplayOutcome.REPLAYED
        finally:
            await layer.close()
            await store.close()

    asyncio.run(main())
    success, retried, park, replay = spans.get_finished_spans()
    assert _attrs(success)["durabilis.outcome"] == "success"
    assert [e.name for e in retried.events] == ["durabilis.retry"]
    assert _attrs(park)["durabilis.outcome"] == "parked"
    assert park.status.status_code is StatusCode.ERROR
    [link] = replay.links
    assert link.context.span_id == park.context.span_id
    assert _attrs(replay)["durabilis.outcome"] == "success"


def test_nothing_is_traced_or_stored_while_no_provider_is_configured(
    layer: DurabilityLayer,
) -> None:
    # This process never sets a global provider: the API's default (a proxy) is in force.
    assert not otel.enabled()
    with pytest.raises(RetryExhausted) as exc:
        layer.execute("a1", "job", "untraced", Counter(["NETWORK_TIMEOUT"] * 3))
    assert exc.value.dlq_id is not None
    record = layer.dlq.get(exc.value.dlq_id)
    assert record is not None
    assert record.trace_context is None
    assert "traceparent" not in record.metadata


def test_an_explicit_no_op_provider_turns_tracing_off(
    layer: DurabilityLayer,
) -> None:
    otel.use(trace.NoOpTracerProvider())
    try:
        assert not otel.enabled()
        with pytest.raises(RetryExhausted) as exc:
            layer.execute("a1", "job", "noop", Counter(["NETWORK_TIMEOUT"] * 3))
    finally:
        otel.use(None)
    assert exc.value.dlq_id is not None
    record = layer.dlq.get(exc.value.dlq_id)
    assert record is not None and record.trace_context is None


_CHILD = """
import json, sys
{prelude}
import durabilis
from durabilis import otel
from durabilis.layer import DurabilityLayer
from tests.integration._layer_support import fast_config
store = durabilis.connect(sys.argv[1], namespace=sys.argv[2])
layer = DurabilityLayer(store, fast_config())
out = {{"before": otel.enabled(), "first": layer.execute("a1", "job", 1, lambda ctx: "one")}}
{later}
out["second"] = layer.execute("a1", "job", 2, lambda ctx: "two")
out["after"] = otel.enabled()
{report}
print(json.dumps(out))
"""


def _child(redis_url: str, namespace: str, **parts: str) -> dict[str, Any]:
    code = _CHILD.format(**{"prelude": "", "later": "", "report": "", **parts})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OTEL_PYTHON_TRACER_PROVIDER", None)
    done = subprocess.run(
        [sys.executable, "-c", code, redis_url, namespace], capture_output=True, text=True,
        cwd=ROOT, env=env, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_global_provider_set_after_durabilis_is_imported_is_picked_up(
    redis_url: str, namespace: str
) -> None:
    out = _child(
        redis_url, namespace,
        later=(
            "from opentelemetry import trace\n"
            "from opentelemetry.sdk.trace import TracerProvider\n"
            "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
            "from opentelemetry.sdk.trace.export.in_memory_span_exporter import "
            "InMemorySpanExporter\n"
            "exporter = InMemorySpanExporter()\n"
            "provider = TracerProvider()\n"
            "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
            "trace.set_tracer_provider(provider)\n"
        ),
        report="out['spans'] = [s.name for s in exporter.get_finished_spans()]",
    )
    assert (out["before"], out["after"]) == (False, True)
    assert out["spans"] == ["durabilis.execute job"]  # the second call only
    assert (out["first"], out["second"]) == ("one", "two")


def test_without_the_opentelemetry_api_the_layer_runs_untraced(
    redis_url: str, namespace: str
) -> None:
    out = _child(
        redis_url, namespace,
        prelude="sys.modules['opentelemetry'] = None  # as if the otel extra were missing",
        report="out['api'] = otel._trace is None",
    )
    assert out == {"before": False, "first": "one", "second": "two", "after": False,
                   "api": True}


# -- a failing tracer changes nothing of a durable call --


class _RaisingProcessor(SpanProcessor):
    """A span processor whose on_start and on_end raise (a vendor's bug)."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("span processor bug (on_start)")

    def on_end(self, span: Any) -> None:
        raise RuntimeError("span processor bug (on_end)")


class _BrokenSpan:
    """An SDK span whose methods named in ``broken`` raise (the rest are the span's)."""

    def __init__(self, real: Any, broken: frozenset[str]) -> None:
        self._real, self._broken = real, broken

    def __getattr__(self, name: str) -> Any:
        if name in self._broken:
            def boom(*_args: Any, **_kw: Any) -> Any:
                raise RuntimeError(f"tracer bug ({name})")
            return boom
        return getattr(self._real, name)


class _BrokenTracer:
    def __init__(self, real: Any, broken: frozenset[str]) -> None:
        self._real, self._broken = real, broken

    def start_span(self, *args: Any, **kw: Any) -> Any:
        if "start_span" in self._broken:
            raise RuntimeError("tracer bug (start_span)")
        return _BrokenSpan(self._real.start_span(*args, **kw), self._broken)


class _BrokenProvider(TracerProvider):
    def __init__(self, broken: frozenset[str]) -> None:
        super().__init__()
        self._broken = broken

    def get_tracer(self, *args: Any, **kw: Any) -> Any:
        return _BrokenTracer(super().get_tracer(*args, **kw), self._broken)


_BROKEN = {
    "on_start_and_on_end": None,  # (the SDK's processor raising)
    "add_event": frozenset({"add_event"}),
    "get_span_context": frozenset({"get_span_context"}),
    "start_span": frozenset({"start_span"}),
    "every_span_method": frozenset({
        "add_event", "get_span_context", "set_attribute", "set_status", "is_recording", "end",
    }),
}


@pytest.fixture(params=list(_BROKEN))
def broken_tracer(request: pytest.FixtureRequest) -> Iterator[str]:
    """durabilis's spans come from a provider whose calls raise (as named)."""
    broken = _BROKEN[request.param]
    if broken is None:
        provider: TracerProvider = TracerProvider()
        provider.add_span_processor(_RaisingProcessor())
    else:
        provider = _BrokenProvider(broken)
    otel.use(provider)
    try:
        yield request.param
    finally:
        otel.use(None)


def test_a_raising_tracer_leaves_every_outcome_as_it_is_untraced(
    layer: DurabilityLayer, broken_tracer: str
) -> None:
    assert otel.enabled()
    # A success is recorded and returned (the same call again: answered, not run).
    op = Counter()
    assert layer.execute("a1", "job", {"n": 1}, op) == "done"
    assert layer.execute("a1", "job", {"n": 1}, op) == "done"
    assert len(op.calls) == 1
    # A retry, then a success.
    flaky = Counter(["NETWORK_TIMEOUT"])
    assert layer.execute("a1", "job", {"n": 2}, flaky) == "done"
    assert len(flaky.calls) == 2
    # A park: its real error and DLQ record, its claim released.
    with pytest.raises(RetryExhausted) as parked:
        layer.execute("a1", "job", {"n": 3}, Counter(["NETWORK_TIMEOUT"] * 3))
    assert parked.value.final_error == "NETWORK_TIMEOUT"
    dlq_id = parked.value.dlq_id
    assert dlq_id is not None
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.status.value == "pending"
    assert layer.stats().in_flight == 0
    # Its replay, from a requeue: counted replayed.
    assert [r.outcome for r in layer.dlq.requeue([dlq_id], by="test")] == ["requeued"]
    assert layer.replay_requeued({"job": Counter()}).replayed == 1
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.status.value == "replayed"
    assert layer.stats().in_flight == 0


def test_a_raising_tracer_leaves_an_async_call_s_outcome_as_it_is_untraced(
    redis_url: str, namespace: str, broken_tracer: str
) -> None:
    async def main() -> None:
        store = aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, fast_config(breaker=CALM))
        try:
            assert await layer.execute("a1", "job", "retry", Counter(["NETWORK_TIMEOUT"])) \
                == "done"
            with pytest.raises(RetryExhausted) as exc:
                await layer.execute("a1", "job", "park", Counter(["NETWORK_TIMEOUT"] * 3))
            assert exc.value.dlq_id is not None
            result = await layer.replay(exc.value.dlq_id, Counter())
            assert result.outcome is ReplayOutcome.REPLAYED
        finally:
            await layer.close()
            await store.close()

    asyncio.run(main())


def test_a_tracer_failure_is_logged_once_per_hook_and_an_interrupt_still_passes(
    layer: DurabilityLayer, caplog: pytest.LogCaptureFixture
) -> None:
    provider = _BrokenProvider(frozenset({"add_event"}))
    otel.use(provider)
    otel._FAILED.clear()  # (another test of this process may have logged it already)
    try:
        with caplog.at_level("WARNING", logger="durabilis"):
            for n in range(3):
                assert layer.execute("a1", "job", n, Counter(["NETWORK_TIMEOUT"])) == "done"
        logged = [r.getMessage() for r in caplog.records if "durability_otel_failed" in
                  r.getMessage()]
        assert len(logged) == 1 and "hook=retried" in logged[0]

        def interrupted(_ctx: OperationContext) -> str:
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            layer.execute("a1", "job", "interrupted", interrupted)
    finally:
        otel.use(None)


def test_a_traced_record_parked_near_the_cap_stays_within_max_payload_bytes(
    store: durabilis.Store, spans: InMemorySpanExporter
) -> None:
    cap = 2000
    layer = DurabilityLayer(store, fast_config(breaker=CALM, dlq=DlqConfig(max_payload_bytes=cap)))

    def accepted(fill: int) -> bool:
        try:
            layer.execute("a1", "job", {"p": "x" * fill}, Counter(),
                          idempotency_key=f"probe-{fill}")
        except PayloadTooLarge:
            return False
        return True

    low, high = 1, cap  # the largest payload accepted (tracing changes none of them)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if accepted(mid) else (low, mid - 1)
    state = trace.TraceState([(f"v{i:02d}", "x" * 27) for i in range(8)])
    assert len(state.to_header()) == 255
    caller = trace.SpanContext(0x1234, 0x5678, is_remote=True,
                               trace_flags=trace.TraceFlags(1), trace_state=state)
    kept: dict[int, tuple[str, str | None] | None] = {}
    token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(caller)))
    try:
        for fill in (low, low - 100, low - 400):
            with pytest.raises(RetryExhausted) as exc:
                layer.execute("a1", "job", {"p": "x" * fill}, Counter(["NETWORK_TIMEOUT"] * 3),
                              idempotency_key=f"park-{fill}")
            assert exc.value.dlq_id is not None
            record = layer.dlq.get(exc.value.dlq_id)
            assert record is not None
            # The record as stored, checked against the cap by the DLQ's own rule.
            layer.dlq._ops.prepare(record.agent_id, record.operation_type,
                                   record.original_operation, record.metadata)
            kept[fill] = record.trace_context
    finally:
        context.detach(token)
        layer.close()
    assert kept[low] is None  # no room left: no link
    assert kept[low - 100] is not None and kept[low - 100][1] is None  # traceparent only
    assert kept[low - 400] is not None and kept[low - 400][1] == state.to_header()
