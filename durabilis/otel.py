"""OpenTelemetry spans for durable calls (the ``otel`` extra: ``opentelemetry-api``).

Each durable call (``execute``, a ``@durable`` function, each record of a
``replay`` / ``replay_pending`` / ``replay_requeued``) is one span of kind
INTERNAL, named ``durabilis.execute <operation_type>`` or ``durabilis.replay
<operation_type>``, current while the call runs (spans that ``fn`` opens are its
children). Its attributes (:data:`ATTRIBUTES`): the operation type, the agent,
the key only as a hash (never the key, the payload or the result), the
dependency, the attempts started, the outcome, the breaker's decision and, when
parked, the DLQ record's id; on failure ``error.type`` and status ERROR. Each
retry is a span event ``durabilis.retry``. A parked operation keeps the W3C
``traceparent`` (and ``tracestate``) of its span in its DLQ record; the span of
its replay carries a Link to it.

Nothing happens when ``opentelemetry-api`` is not installed, or while the tracer
provider in force is the API's default (no SDK configured) or a no-op one: a
call then costs one cheap check (``benchmarks/bench_otel.py``). The global
provider may be set at any time (checked per call); :func:`use` chooses a
provider for durabilis's spans alone (tests, or an app that keeps the global
one for something else).

The layer calls this module at five places only (its start and end, each retry,
each parking, each replay): see ``docs/observability.md``. No call into
OpenTelemetry ever raises into a durable call: an exception of the API, the SDK
or a span processor is logged (``durability_otel_failed``, once per hook and
process) and that call goes on untraced from there; its outcome is the same as
untraced. A parked record's trace context is kept only in the room its
``max_payload_bytes`` leaves (``tracestate`` dropped first, then
``traceparent``).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import re
from collections.abc import Generator, Mapping
from typing import Any, Protocol

from durabilis.core import logsink
from durabilis.errors import CircuitOpen, OperationInProgress, RetryExhausted

try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
except ImportError:  # the otel extra is not installed: tracing stays off
    _context = None  # type: ignore[assignment]
    _trace = None  # type: ignore[assignment]

__all__ = [
    "ATTRIBUTES",
    "RETRY_EVENT",
    "enabled",
    "key_hash",
    "use",
]

ATTRIBUTES: Mapping[str, str] = {
    "durabilis.operation.type": "the operation type (wiki_write, ...)",
    "durabilis.agent.id": "the agent that asked for the operation",
    "durabilis.key.hash": "first 16 hex chars of the SHA-256 of the idempotency key",
    "durabilis.dependency": "the breaker guarding the operation (absent: none)",
    "durabilis.replay": "true on a replay's span",
    "durabilis.attempts": "attempts of fn started (0: answered without running it)",
    "durabilis.outcome": "success, duplicate, parked, exhausted, rejected, in_progress, "
                         "failed or interrupted",
    "durabilis.breaker.decision": "admitted or rejected (absent: no dependency, or not asked)",
    "durabilis.dlq.id": "the DLQ record parked in (a replay: the record replayed)",
    "durabilis.error.code": "the last failure's error code (parked, exhausted)",
    "error.type": "the exception's type on failure (its text is never recorded)",
}
"""The span attributes, by name, and what each holds."""

RETRY_EVENT = "durabilis.retry"
"""Span event of a retry: ``durabilis.attempt`` (the failed attempt, 1-based),
``durabilis.retry.delay_ms``, ``durabilis.error.code``."""

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_TRACESTATE_MAX = 256  # bytes of tracestate kept with a parked record (the W3C cap is 512)


class _Choice:
    """Which tracer durabilis uses: the one of :func:`use`'s provider, else the
    global provider's (cached by the provider's identity: the global one can be
    set once, at any time, and is then read again)."""

    __slots__ = ("explicit", "explicit_tracer", "seen", "tracer")

    def __init__(self) -> None:
        self.explicit = False
        self.explicit_tracer: Any = None
        self.seen: Any = None  # the global provider last looked at
        self.tracer: Any = None  # its tracer, None: tracing off


_CHOICE = _Choice()
_FAILED: set[str] = set()  # the hooks whose OpenTelemetry call raised (logged once each)


def _failed(hook: str, exc: Exception) -> None:
    """A call into OpenTelemetry raised at ``hook``: the durable call goes on
    untraced there; logged once per hook and process (the type only: an error's
    text may quote what it was handed)."""
    if hook not in _FAILED:
        _FAILED.add(hook)
        logsink.SINK.warning("durability_otel_failed", hook=hook, error=type(exc).__qualname__)
_READ_GLOBAL = (
    _trace is not None and hasattr(_trace, "_TRACER_PROVIDER")
    and "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ
)
_CURRENT: contextvars.ContextVar[_Traced | None] = contextvars.ContextVar(
    "durabilis_otel_span", default=None
)


def _tracer_of(provider: Any) -> Any:
    """The durabilis tracer of ``provider``, or ``None`` when it records nothing."""
    if provider is None or _trace is None:
        return None
    if isinstance(provider, (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)):
        return None  # the API's default (no SDK configured) or an explicit no-op
    from durabilis import __version__  # noqa: PLC0415  (imported while durabilis itself is)

    try:
        tracer = provider.get_tracer("durabilis", __version__)
    except Exception as exc:  # a provider that cannot give a tracer: tracing off
        _failed("get_tracer", exc)
        return None
    if isinstance(tracer, (_trace.NoOpTracer, _trace.ProxyTracer)):  # e.g. OTEL_SDK_DISABLED
        return None
    return tracer


def use(tracer_provider: Any = None) -> None:
    """Choose the tracer provider of durabilis's spans.

    Args:
        tracer_provider: An OpenTelemetry ``TracerProvider`` (e.g. the SDK's,
            in a test), used instead of the global one; ``None`` (the default
            state): the global provider (``opentelemetry.trace.set_tracer_provider``).
    """
    _CHOICE.explicit_tracer = _tracer_of(tracer_provider)
    _CHOICE.explicit = tracer_provider is not None


def _tracer() -> Any:
    """The tracer in force, or ``None``: tracing is off (the per-call check)."""
    if _CHOICE.explicit:
        return _CHOICE.explicit_tracer
    if _trace is None:
        return None
    # The API's global, as its getter returns it once set. The getter itself
    # also looks up an environment variable on each call while none is set
    # (~0.7 us, most of this check's cost): it is called only when that
    # variable named a provider to load at the process's start.
    provider = _trace._TRACER_PROVIDER if _READ_GLOBAL else _trace.get_tracer_provider()
    if provider is not _CHOICE.seen:
        _CHOICE.tracer = _tracer_of(provider)
        _CHOICE.seen = provider
    return _CHOICE.tracer


def enabled() -> bool:
    """Whether durable calls are traced now (the API installed, a provider set)."""
    return _tracer() is not None


def key_hash(key: str) -> str:
    """How a key appears in a span: the first 16 hex chars of its SHA-256 (to
    correlate spans of one key, not to hide a key that can be guessed)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class _Key(Protocol):
    @property
    def value(self) -> str: ...


class _Call(Protocol):
    """What a span reads of a durable call (the layer's request)."""

    @property
    def agent_id(self) -> str: ...
    @property
    def operation_type(self) -> str: ...
    @property
    def key(self) -> _Key: ...
    @property
    def dependency(self) -> str | None: ...
    @property
    def replay(self) -> bool: ...
    @property
    def replay_claim(self) -> Any: ...


def begin(call: _Call) -> _Traced | None:
    """HOOK (the start of a call): ``None`` when tracing is off (then nothing else
    of this module does any work), else what runs the call's plan in its span."""
    tracer = _tracer()
    return None if tracer is None else _Traced(tracer, call)


class _Traced:
    """One durable call's span: started when its plan starts, current while it
    runs (``fn``'s own spans are its children), ended with the plan's outcome."""

    __slots__ = ("breaker", "call", "duplicate", "retries", "span", "tracer")

    def __init__(self, tracer: Any, call: _Call) -> None:
        self.tracer = tracer
        self.call = call
        self.span: Any = None
        self.breaker = call.dependency is not None  # a dependency's breaker is asked
        self.duplicate = False
        self.retries = 0

    def _start(self) -> Any:
        call = self.call
        attributes: dict[str, Any] = {
            "durabilis.operation.type": call.operation_type,
            "durabilis.agent.id": call.agent_id,
            "durabilis.key.hash": key_hash(call.key.value),
        }
        if call.dependency is not None:
            attributes["durabilis.dependency"] = call.dependency
        links = None
        kind = "durabilis.execute"
        claim = call.replay_claim
        if call.replay:
            kind = "durabilis.replay"
            attributes["durabilis.replay"] = True
            if claim is not None:
                attributes["durabilis.dlq.id"] = claim.dlq_id
                try:
                    parked = parse_traceparent(*claim.trace) if claim.trace else None
                    if parked is not None:
                        links = [_trace.Link(parked, {"durabilis.dlq.id": claim.dlq_id})]
                except Exception as exc:  # the span goes without its link
                    _failed("link", exc)
                    links = None
        return self.tracer.start_span(
            f"{kind} {call.operation_type}", kind=_trace.SpanKind.INTERNAL,
            attributes=attributes, links=links,
        )

    def run(self, plan: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
        """Drive ``plan`` (the call's) in this span; HOOK (the end of a call): the
        outcome's attributes, then the span ends. An OpenTelemetry call that
        raises (``Exception``) is logged and the call goes on untraced from there:
        the plan's outcome is never changed (see :func:`_failed`)."""
        try:
            self.span = span = self._start()
        except Exception as exc:  # no span: the plan as is
            _failed("start", exc)
            untraced = _CURRENT.set(None)  # (its retries are not an outer call's events)
            try:
                return (yield from plan)
            finally:
                with contextlib.suppress(ValueError):
                    _CURRENT.reset(untraced)
        try:
            otel_token = _context.attach(_trace.set_span_in_context(span))
        except Exception as exc:  # (the span, not current: fn's own spans are not its children)
            _failed("attach", exc)
            otel_token = None
        token = _CURRENT.set(self)
        error: BaseException | None = None
        try:
            return (yield from plan)
        except BaseException as exc:
            error = exc
            raise
        finally:
            try:
                try:
                    self._outcome(error)
                except Exception as exc:
                    _failed("outcome", exc)
            finally:  # (even past a BaseException of the SDK: the span is ended)
                with contextlib.suppress(ValueError):  # (a plan closed from another context)
                    _CURRENT.reset(token)
                if otel_token is not None:
                    try:
                        _context.detach(otel_token)
                    except Exception as exc:
                        _failed("detach", exc)
                try:
                    span.end()
                except Exception as exc:
                    _failed("end", exc)

    def _outcome(self, error: BaseException | None) -> None:
        span = self.span
        if not span.is_recording():
            return
        attempts = 0 if self.duplicate else self.retries + 1
        decision: str | None = "admitted" if self.breaker and not self.duplicate else None
        if error is None:
            outcome = "duplicate" if self.duplicate else "success"
        elif isinstance(error, RetryExhausted):
            attempts = error.attempts
            outcome = "parked" if error.dlq_id is not None else "exhausted"
            if error.dlq_id is not None:
                span.set_attribute("durabilis.dlq.id", error.dlq_id)
            if error.final_error:
                span.set_attribute("durabilis.error.code", error.final_error)
            if error.final_error == "CIRCUIT_OPEN":
                decision = "rejected"
        elif isinstance(error, CircuitOpen):
            outcome, attempts, decision = "rejected", self.retries, "rejected"
        elif isinstance(error, OperationInProgress):
            outcome, attempts, decision = "in_progress", 0, None  # (a duplicate: no breaker)
        elif isinstance(error, Exception):
            outcome = "failed"
        else:  # a cancellation, KeyboardInterrupt, SystemExit
            outcome = "interrupted"
        span.set_attribute("durabilis.outcome", outcome)
        span.set_attribute("durabilis.attempts", attempts)
        if decision is not None:
            span.set_attribute("durabilis.breaker.decision", decision)
        if error is not None:
            # The type only: an error's text may quote a payload or a secret
            # (as in durabilis's log events, durabilis.events).
            span.set_attribute("error.type", type(error).__qualname__)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, outcome))

    def context_fields(self, room: int | None = None) -> dict[str, str]:
        """This span's W3C trace context, as DLQ record metadata, in ``room``
        bytes (names and values; ``None``: no limit): ``tracestate`` is left out
        when it does not fit, then ``traceparent`` (the record has no link)."""
        ctx = self.span.get_span_context()
        if not ctx.is_valid:
            return {}
        parent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
        left = (1 << 62 if room is None else room) - len("traceparent") - len(parent)
        if left < 0:
            return {}
        fields = {"traceparent": parent}
        state = ctx.trace_state.to_header() if ctx.trace_state else ""
        size = len(state.encode("utf-8", "replace"))
        if state and size <= _TRACESTATE_MAX and len("tracestate") + size <= left:
            fields["tracestate"] = state
        return fields


def retried(attempts: int, delay: float, error_code: str) -> None:
    """HOOK (each retry): a ``durabilis.retry`` event on the call's span."""
    traced = _CURRENT.get()
    if traced is None:
        return
    traced.retries = attempts
    try:
        if traced.span.is_recording():
            traced.span.add_event(RETRY_EVENT, {
                "durabilis.attempt": attempts,
                "durabilis.retry.delay_ms": round(delay * 1000.0, 3),
                "durabilis.error.code": error_code,
            })
    except Exception as exc:  # the retry goes on without its event
        _failed("retried", exc)


def answered_duplicate() -> None:
    """HOOK (a duplicate's answer): the call ran nothing, its outcome is the record's."""
    traced = _CURRENT.get()
    if traced is not None:
        traced.duplicate = True


def parking_fields(room: int | None = None) -> dict[str, str]:
    """HOOK (each parking): the trace context kept with the DLQ record (the
    call's span: ``traceparent``, ``tracestate``) in the ``room`` bytes the
    record's ``max_payload_bytes`` leaves it (``None``: no limit); ``{}`` when
    tracing is off, when not even ``traceparent`` fits, or when the span fails."""
    traced = _CURRENT.get()
    if traced is None:
        return {}
    try:
        return traced.context_fields(room)
    except Exception as exc:  # parked without a link
        _failed("parking_fields", exc)
        return {}


def parse_traceparent(traceparent: str, tracestate: str | None = None) -> Any:
    """A stored ``traceparent`` as a remote ``SpanContext`` (``None``: not one, or
    the API is not installed)."""
    if _trace is None:
        return None
    match = _TRACEPARENT.match(traceparent.strip().lower())
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if not trace_id or not span_id:
        return None
    state = None
    if tracestate:
        try:
            state = _trace.TraceState.from_header([tracestate])
        except Exception:  # a stored tracestate that does not parse: the link goes without
            state = None
    return _trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=_trace.TraceFlags(int(match[3], 16)),
        trace_state=state,
    )
