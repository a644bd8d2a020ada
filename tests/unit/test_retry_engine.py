"""The retry engines (sync and async twins), the decorator and instant retries: no Redis."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

import pytest

import durabilis
from durabilis._keys import KeySpace
from durabilis.errors import ConfigError, OperationError
from durabilis.retry import (
    DEADLINE_EXCEEDED,
    EXHAUSTED,
    NON_RETRYABLE,
    AsyncRetryEngine,
    RetryBudget,
    RetryEngine,
    RetryOutcome,
    RetryPolicy,
    retry,
)
from durabilis.testing import instant_retries
from tests.support.cancels import swallow_own_cancel
from tests.support.logs import own_logs


class FakeTime:
    """A monotonic clock that only moves when someone sleeps (or an attempt takes time)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


def script(*steps: object, cost: float = 0.0, time: FakeTime | None = None) -> Callable[[], Any]:
    """An operation that raises/returns the given steps in turn (each attempt costs ``cost`` s)."""
    queue = list(steps)
    calls: list[int] = []

    def op() -> Any:
        calls.append(1)
        if time is not None:
            time.now += cost
        step = queue.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    op.calls = calls  # type: ignore[attr-defined]
    return op


def run(
    mode: str,
    op_type: str,
    fn: Callable[[], Any],
    *,
    time: FakeTime,
    policies: Iterable[RetryPolicy] | None = None,
    **kw: Any,
) -> RetryOutcome[Any]:
    """Run ``fn`` through the sync engine, or wrapped as a coroutine through the async one."""
    if mode == "sync":
        engine = RetryEngine(policies=policies, sleep=time.sleep, clock=time.clock)
        return engine.execute(op_type, fn, **kw)

    async def afn() -> Any:
        await asyncio.sleep(0)
        return fn()

    aengine = AsyncRetryEngine(policies=policies, sleep=time.async_sleep, clock=time.clock)
    return asyncio.run(aengine.execute(op_type, afn, **kw))


MODES = pytest.mark.parametrize("mode", ["sync", "async"])
NT = OperationError("NETWORK_TIMEOUT", "slow")
NO_JITTER = [
    RetryPolicy(
        "mcp_call", 3, 500, 10_000, jitter=False,
        retryable_errors=("NETWORK_TIMEOUT", "SERVICE_UNAVAILABLE", "RATE_LIMITED"),
        non_retryable_errors=("PERMISSION_DENIED", "INVALID_SCHEMA", "NOT_FOUND"),
    ),
]


# --- must show 2 ---------------------------------------------------------------------


@MODES
def test_success_on_the_first_try_is_one_attempt_and_no_sleep(mode: str) -> None:
    t = FakeTime()
    outcome = run(mode, "mcp_call", script("done"), time=t)
    assert outcome == RetryOutcome(True, "done", 1)
    assert (outcome.final_error, outcome.stop_reason, outcome.sent_to_dlq) == (None, None, False)
    assert t.sleeps == []


@MODES
def test_a_transient_failure_then_success_is_two_attempts(mode: str) -> None:
    t = FakeTime()
    outcome = run(mode, "mcp_call", script(NT, "done"), time=t, policies=NO_JITTER)
    assert (outcome.success, outcome.result, outcome.attempts) == (True, "done", 2)
    assert t.sleeps == [0.5]


@MODES
def test_a_non_retryable_error_stops_at_once_without_dlq(mode: str) -> None:
    t = FakeTime()
    denied = OperationError("PERMISSION_DENIED", "no")
    fn = script(denied, "never")
    outcome = run(mode, "mcp_call", fn, time=t)
    assert (outcome.success, outcome.attempts, outcome.sent_to_dlq) == (False, 1, False)
    assert (outcome.final_error, outcome.stop_reason) == ("PERMISSION_DENIED", NON_RETRYABLE)
    assert outcome.last_exception is denied
    assert len(fn.calls) == 1 and t.sleeps == []  # type: ignore[attr-defined]


@MODES
def test_exhaustion_runs_max_attempts_and_flags_the_dlq(mode: str) -> None:
    t = FakeTime()
    last = OperationError("SERVICE_UNAVAILABLE")
    outcome = run(mode, "mcp_call", script(NT, NT, last), time=t, policies=NO_JITTER)
    assert (outcome.success, outcome.attempts, outcome.sent_to_dlq) == (False, 3, True)
    assert (outcome.final_error, outcome.stop_reason) == ("SERVICE_UNAVAILABLE", EXHAUSTED)
    assert outcome.last_exception is last
    assert t.sleeps == [0.5, 1.0]  # never a sleep after the last attempt


@MODES
def test_an_unknown_operation_type_gets_exactly_one_attempt(mode: str) -> None:
    t = FakeTime()
    fn = script(NT, "never")
    outcome = run(mode, "no_such_type", fn, time=t)
    assert (outcome.success, outcome.attempts, outcome.sent_to_dlq) == (False, 1, True)
    assert (outcome.final_error, outcome.stop_reason) == ("NETWORK_TIMEOUT", EXHAUSTED)
    assert len(fn.calls) == 1 and t.sleeps == []  # type: ignore[attr-defined]


@MODES
def test_the_wildcard_policy_covers_types_without_their_own(mode: str) -> None:
    t = FakeTime()
    star = RetryPolicy("*", 4, 100, 100, jitter=False)
    outcome = run(mode, "anything", script(ValueError(), NT, "ok"), time=t, policies=[star])
    assert (outcome.success, outcome.attempts) == (True, 3)
    assert t.sleeps == [0.1, 0.1]


@MODES
def test_the_deadline_is_never_slept_past(mode: str) -> None:
    t = FakeTime()
    policy = RetryPolicy("op", 10, 1000, 60_000, jitter=False)
    fn = script(*[NT] * 10, cost=0.2, time=t)
    outcome = run(mode, "op", fn, time=t, policies=[policy], deadline_seconds=5.0)
    # Attempts start at 0, 1.2, 3.4; after the third (t = 3.6) a 4 s sleep would pass 5 s.
    assert t.sleeps == [1.0, 2.0]
    assert (outcome.attempts, outcome.stop_reason, outcome.sent_to_dlq) == (
        3, DEADLINE_EXCEEDED, True,
    )
    assert t.now <= 5.0


@MODES
def test_the_policy_deadline_applies_and_a_slow_attempt_ends_the_call(mode: str) -> None:
    t = FakeTime()
    policy = RetryPolicy("op", 10, 10, 10, jitter=False, deadline_ms=1000)
    fn = script(NT, NT, cost=1.5, time=t)
    outcome = run(mode, "op", fn, time=t, policies=[policy])
    assert (outcome.attempts, outcome.stop_reason) == (1, DEADLINE_EXCEEDED)
    assert t.sleeps == []


@MODES
def test_retry_after_is_honoured_and_capped_at_max_delay(mode: str) -> None:
    t = FakeTime()
    hinted = OperationError("RATE_LIMITED", retry_after=3.0)
    greedy = OperationError("RATE_LIMITED", retry_after=3600)
    outcome = run(mode, "mcp_call", script(hinted, greedy, "ok"), time=t, policies=NO_JITTER)
    assert outcome.success and outcome.attempts == 3
    assert t.sleeps == [3.0, 10.0]


# --- arguments, events, propagation --------------------------------------------------------


@MODES
@pytest.mark.parametrize(
    ("op_type", "deadline", "field"),
    [("", None, "operation_type"), (3, None, "operation_type"), ("mcp_call", 0, "deadline_seconds"),
     ("mcp_call", float("nan"), "deadline_seconds")],
)
def test_bad_arguments_raise_before_anything_runs(
    mode: str, op_type: Any, deadline: Any, field: str
) -> None:
    fn = script("never")
    with pytest.raises(ConfigError) as info:
        run(mode, op_type, fn, time=FakeTime(), deadline_seconds=deadline)
    assert info.value.field == field
    assert fn.calls == []  # type: ignore[attr-defined]


def test_a_non_callable_operation_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="callable"):
        RetryEngine().execute("mcp_call", 42)  # type: ignore[arg-type]


def test_a_plain_function_on_the_async_engine_runs_once_and_is_a_type_error() -> None:
    ran: list[int] = []

    def write() -> str:  # not async: its effect happens when it is called
        ran.append(1)
        return "written"

    engine = AsyncRetryEngine(policies=[RetryPolicy("*", 3, 1, 1, retryable_errors=())])
    with pytest.raises(TypeError, match="not an awaitable"):
        asyncio.run(engine.execute("mcp_call", write))  # type: ignore[arg-type]
    assert ran == [1]  # never retried (a retry-everything policy would have run it 3 times)


def test_a_coroutine_function_on_the_sync_engine_is_a_type_error_and_never_starts() -> None:
    ran: list[int] = []

    async def write() -> str:
        ran.append(1)
        return "written"

    with pytest.raises(TypeError, match="AsyncRetryEngine"):
        RetryEngine().execute("mcp_call", write)
    assert ran == []


@MODES
def test_base_exceptions_are_not_retried_or_swallowed(mode: str) -> None:
    t = FakeTime()
    with pytest.raises(KeyboardInterrupt):
        run(mode, "mcp_call", script(KeyboardInterrupt(), "x"), time=t)
    assert t.sleeps == []


def test_async_cancellation_propagates() -> None:
    async def main() -> None:
        async def op() -> None:
            raise asyncio.CancelledError

        await AsyncRetryEngine().execute("mcp_call", op)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


@MODES
def test_each_retry_logs_an_event_and_exhaustion_logs_one_too(mode: str) -> None:
    t = FakeTime()
    with own_logs() as logs:
        run(mode, "mcp_call", script(NT, NT, NT), time=t, policies=NO_JITTER)
    assert [e["event"] for e in logs] == [
        "durability_retry_attempt", "durability_retry_attempt", "durability_retry_exhausted",
    ]
    first = logs[0]
    assert {k: first[k] for k in (
        "attempt_number", "max_attempts", "delay_ms", "error_code", "operation_type",
    )} == {
        "attempt_number": 1, "max_attempts": 3, "delay_ms": 500.0,
        "error_code": "NETWORK_TIMEOUT", "operation_type": "mcp_call",
    }
    assert (logs[2]["reason"], logs[2]["attempts"], logs[2]["sent_to_dlq"]) == (
        EXHAUSTED, 3, True,
    )


@MODES
def test_success_logs_nothing(mode: str) -> None:
    with own_logs() as logs:
        run(mode, "mcp_call", script("ok"), time=FakeTime())
    assert logs == []


@MODES
def test_a_non_retryable_stop_logs_its_own_event(mode: str) -> None:
    with own_logs() as logs:
        run(mode, "mcp_call", script(OperationError("NOT_FOUND")), time=FakeTime())
    assert [(e["event"], e["reason"]) for e in logs] == [
        ("durability_retry_non_retryable", NON_RETRYABLE),
    ]


# --- policy table ------------------------------------------------------------------------------


def test_engine_ships_the_seed_policies_and_empty_ships_none() -> None:
    assert set(RetryEngine().policies) == {
        "mcp_call", "memory_write", "wiki_write", "message_send", "external_api",
    }
    assert RetryEngine.empty().policies == {}
    assert AsyncRetryEngine.empty().get_policy("mcp_call") is None


def test_upsert_replaces_a_policy_and_get_policy_falls_back_to_the_wildcard() -> None:
    engine = RetryEngine.empty()
    engine.upsert_policy(RetryPolicy("*", 2, 1, 1))
    engine.upsert_policy(RetryPolicy("a", 3, 1, 1))
    engine.upsert_policy(RetryPolicy("a", 7, 1, 1))
    got_a, got_b = engine.get_policy("a"), engine.get_policy("b")
    assert got_a is not None and got_a.max_attempts == 7
    assert got_b is not None and got_b.operation_type == "*"


def test_upsert_refuses_what_is_not_a_valid_policy() -> None:
    engine = RetryEngine.empty()
    with pytest.raises(ConfigError):
        engine.upsert_policy({"operation_type": "x"})  # type: ignore[arg-type]
    policy = RetryPolicy("x", 2, 1, 1)
    object.__setattr__(policy, "max_attempts", 0)  # bypassing the frozen dataclass
    with pytest.raises(ConfigError) as info:
        engine.upsert_policy(policy)
    assert info.value.field == "max_attempts"


def test_a_budget_without_a_store_is_refused() -> None:
    budgeted = RetryPolicy("x", 2, 1, 1, budget=RetryBudget())
    with pytest.raises(ConfigError) as info:
        RetryEngine(policies=[budgeted])
    assert info.value.field == "budget"
    with pytest.raises(ConfigError):
        AsyncRetryEngine.empty().upsert_policy(budgeted)


class _NoIoStore:
    """Stands in for a store and fails the test if the engine does any I/O with it."""

    keys = KeySpace("noio")

    def run(self, call: object) -> Any:
        raise AssertionError(f"unexpected Redis I/O: {call!r}")


def test_without_a_budget_an_engine_with_a_store_does_no_io() -> None:
    t = FakeTime()
    engine = RetryEngine(_NoIoStore(), sleep=t.sleep)  # type: ignore[arg-type]
    assert engine.execute("mcp_call", script(NT, NT, "ok")).attempts == 3
    assert engine.execute("memory_write", script("ok")).success


# --- the decorator -------------------------------------------------------------------------------


def test_the_decorator_retries_a_sync_function_and_returns_its_result() -> None:
    t = FakeTime()
    fn = script(NT, "ok")

    @retry("mcp_call", engine=RetryEngine(policies=NO_JITTER, sleep=t.sleep))
    def call(a: int, *, b: int) -> tuple[int, int, Any]:
        """Docs."""
        return a, b, fn()

    assert call(1, b=2) == (1, 2, "ok")
    assert t.sleeps == [0.5]
    assert call.__name__ == "call" and call.__doc__ == "Docs."


def test_the_decorator_retries_an_async_function() -> None:
    t = FakeTime()
    fn = script(NT, NT, "ok")

    @retry("mcp_call", engine=AsyncRetryEngine(policies=NO_JITTER, sleep=t.async_sleep))
    async def call(x: int) -> Any:
        return x, fn()

    assert asyncio.run(call(5)) == (5, "ok")
    assert t.sleeps == [0.5, 1.0]


def test_the_decorator_reraises_the_last_exception_unchanged() -> None:
    last = OperationError("SERVICE_UNAVAILABLE")
    fn = script(NT, NT, last)

    @retry("mcp_call", engine=RetryEngine(sleep=lambda s: None))
    def call() -> Any:
        return fn()

    with pytest.raises(OperationError) as info:
        call()
    assert info.value is last


def test_the_decorator_uses_the_default_engine_and_instant_retries() -> None:
    fn = script(NT, "ok")

    @retry("mcp_call")
    def call() -> Any:
        return fn()

    with instant_retries():
        assert call() == "ok"


def test_the_decorator_refuses_an_engine_of_the_wrong_kind() -> None:
    with pytest.raises(TypeError, match="AsyncRetryEngine"):
        @retry("mcp_call", engine=RetryEngine())
        async def a() -> None: ...

    with pytest.raises(TypeError, match="RetryEngine"):
        @retry("mcp_call", engine=AsyncRetryEngine())
        def b() -> None: ...

    with pytest.raises(ConfigError):
        retry("")


# --- durabilis.testing.instant_retries -----------------------------------------------------------


@MODES
def test_instant_retries_skip_sleeping_but_keep_the_decisions(mode: str) -> None:
    t = FakeTime()
    with own_logs() as logs, instant_retries():
        outcome = run(mode, "mcp_call", script(NT, NT, "ok"), time=t, policies=NO_JITTER)
    assert outcome.attempts == 3 and t.sleeps == []
    assert [e["delay_ms"] for e in logs] == [500.0, 1000.0]


@MODES
def test_instant_retries_count_skipped_delays_against_the_deadline(mode: str) -> None:
    t = FakeTime()
    policy = RetryPolicy("op", 10, 1000, 60_000, jitter=False)
    with instant_retries():
        outcome = run(mode, "op", script(*[NT] * 10), time=t, policies=[policy],
                      deadline_seconds=5.0)
    assert (outcome.attempts, outcome.stop_reason) == (3, DEADLINE_EXCEEDED)  # 1 + 2, then 4 > 5
    assert t.sleeps == []


def test_instant_retries_can_cap_attempts_and_restore_on_exit() -> None:
    t = FakeTime()
    engine = RetryEngine(policies=NO_JITTER, sleep=t.sleep)
    with instant_retries(max_attempts=1):
        outcome = engine.execute("mcp_call", script(NT, "ok"))
        assert (outcome.attempts, outcome.stop_reason) == (1, EXHAUSTED)
        with instant_retries(enabled=False):
            assert engine.execute("mcp_call", script(NT, "ok")).attempts == 2
        assert engine.execute("mcp_call", script(NT, "ok")).attempts == 1
    assert t.sleeps == [0.5]
    assert engine.execute("mcp_call", script(NT, "ok")).attempts == 2
    assert t.sleeps == [0.5, 0.5]


def test_instant_retries_as_a_plain_call_lasts_until_restored() -> None:
    t = FakeTime()
    engine = RetryEngine(policies=NO_JITTER, sleep=t.sleep)
    switch = instant_retries()
    try:
        assert engine.execute("mcp_call", script(NT, "ok")).attempts == 2
        assert t.sleeps == []
    finally:
        switch.restore()
    engine.execute("mcp_call", script(NT, "ok"))
    assert t.sleeps == [0.5]


def test_instant_retries_refuses_a_cap_below_one() -> None:
    with pytest.raises(ConfigError) as info:
        instant_retries(max_attempts=0)
    assert info.value.field == "max_attempts"


def test_an_engine_refuses_a_store_of_the_other_kind() -> None:
    sync_store = durabilis.connect("redis://127.0.0.1:1/0")  # no I/O until first use
    async_store = durabilis.aio.connect("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(TypeError, match="AsyncRetryEngine"):
            RetryEngine(async_store)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="RetryEngine"):
            AsyncRetryEngine(sync_store)  # type: ignore[arg-type]
    finally:
        sync_store.close()


# --- what fn, a classifier or a logging hook may do wrong (review: retry findings 3, 4, 8) ---


@pytest.mark.parametrize("ending", ["raises", "returns"])
def test_an_async_fn_that_turns_its_cancellation_into_an_outcome_is_not_retried(
    ending: str,
) -> None:
    """fn swallows the caller's cancellation (a client maps it to its own error, as
    redis-py's wait_for loses it on 3.11): the engine raises it, never retries."""
    calls: list[int] = []

    async def fn() -> str:
        calls.append(1)
        return await swallow_own_cancel(ending)

    engine = AsyncRetryEngine(policies=[RetryPolicy("op", 5, 1, 1, jitter=False)])
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(engine.execute("op", fn))
    assert calls == [1]


def test_fn_s_own_timeout_stays_an_ordinary_failure_and_is_retried() -> None:
    """A timeout fn sets itself (a cancellation it asked for, and took back) is
    its failure, not the caller's cancellation."""
    calls: list[int] = []

    async def fn() -> str:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.wait_for(asyncio.Event().wait(), 0.001)
        return "ok"

    engine = AsyncRetryEngine(policies=[RetryPolicy("op", 3, 1, 1, jitter=False)])
    outcome = asyncio.run(engine.execute("op", fn))
    assert (outcome.success, outcome.attempts) == (True, 2)


@MODES
def test_a_retry_after_too_large_for_a_float_is_capped_at_max_delay(mode: str) -> None:
    t = FakeTime()
    huge = OperationError("RATE_LIMITED", retry_after=10**400)  # int(a 400-digit header)
    outcome = run(mode, "mcp_call", script(huge, "ok"), time=t, policies=NO_JITTER)
    assert (outcome.success, outcome.attempts) == (True, 2)
    assert t.sleeps == [10.0]


class _UnhashableMeta(type):
    __hash__ = None  # type: ignore[assignment]

    def __eq__(cls, other: object) -> bool:
        return cls is other


class _UnhashableClass(Exception, metaclass=_UnhashableMeta):
    pass


class _LenRaises(str):
    def __len__(self) -> int:
        raise RuntimeError("len")


class _OddCode(Exception):
    code = _LenRaises("NETWORK_TIMEOUT")


@MODES
@pytest.mark.parametrize(
    ("make", "code"),
    [(_UnhashableClass, "_UnhashableClass"), (_OddCode, "NETWORK_TIMEOUT")],
    ids=["unhashable-class", "code-len-raises"],
)
def test_an_error_the_classifier_cannot_hash_or_measure_is_reported_not_raised(
    mode: str, make: type[Exception], code: str
) -> None:
    star = [RetryPolicy("*", 2, 1, 1, jitter=False)]
    outcome = run(mode, "op", script(make(), make()), time=FakeTime(), policies=star)
    assert (outcome.success, outcome.attempts, outcome.final_error) == (False, 2, code)


class _RaisingFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.seen.append(record.getMessage().split()[0])
        raise RuntimeError("a buggy logging filter")


@MODES
def test_a_logging_filter_that_raises_on_a_retry_event_never_breaks_the_call(mode: str) -> None:
    bad = _RaisingFilter()
    logger = logging.getLogger("durabilis")
    logger.addFilter(bad)
    try:
        t = FakeTime()
        outcome = run(mode, "mcp_call", script(NT, "ok"), time=t, policies=NO_JITTER)
        assert (outcome.success, outcome.attempts) == (True, 2)
        stopped = run(mode, "mcp_call", script(NT, NT, NT), time=t, policies=NO_JITTER)
        assert (stopped.success, stopped.stop_reason) == (False, EXHAUSTED)
    finally:
        logger.removeFilter(bad)
    assert "durability_retry_attempt" in bad.seen  # the filter did run, and raised
    assert "durability_retry_exhausted" in bad.seen


def test_the_decorator_names_a_partial_in_its_type_error_and_wraps_a_sync_one() -> None:
    async def fetch(url: str) -> str:
        return url

    with pytest.raises(TypeError, match="AsyncRetryEngine"):
        retry("mcp_call", engine=RetryEngine())(functools.partial(fetch, "u"))

    def get(url: str) -> str:
        return url

    with pytest.raises(TypeError, match="RetryEngine"):
        retry("mcp_call", engine=AsyncRetryEngine())(functools.partial(get, "u"))
    wrapped = retry("mcp_call", engine=RetryEngine())(functools.partial(get, "u"))
    assert wrapped() == "u"
