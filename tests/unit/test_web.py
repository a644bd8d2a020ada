"""The web console's pure parts: the DLQ filter as the query string gives it, the
charts' numbers (rates from cumulative counters, a breaker's timeline)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durabilis.breaker import BreakerInfo, BreakerState, StateTransition
from durabilis.web import BulkTarget
from durabilis.web._charts import TIMELINE_WIDTH, breaker_timeline, overview_charts
from durabilis.web._data import BadInput, DlqFilter, Sample, error_code, parse_age

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def sample(at: float, started: int, backlog: int = 0) -> Sample:
    return Sample(T0 + timedelta(seconds=at), started, 0, 0, 0, 1, 0, backlog)


def test_the_filter_takes_what_dlq_requeue_takes_and_refuses_the_rest() -> None:
    flt = DlqFilter.parse({"status": "all", "operation_type": " job ", "reason": "",
                           "older_than": "15m"})
    assert flt == DlqFilter("all", "job", None, None, "15m")
    assert flt.query() == {"status": "all", "operation_type": "job", "older_than": "15m"}
    assert DlqFilter.parse({}) == DlqFilter()  # pending, no filter
    assert parse_age("90s") == 90 and parse_age("2h") == 7200 and parse_age("7d") == 604800
    for bad in ({"status": "done"}, {"older_than": "soon"}, {"agent": "x" * 300},
                {"reason": "a\x00b"}):
        with pytest.raises(BadInput):
            DlqFilter.parse(bad)
    assert error_code("NETWORK_TIMEOUT: ReadTimeout: down") == "NETWORK_TIMEOUT"


def test_rates_come_from_differences_between_samples_and_a_counter_reset_counts_zero() -> None:
    charts = {c.key: c for c in overview_charts([
        sample(0, 100), sample(2, 110), sample(4, 110), sample(5, 3, backlog=7)])}
    started = charts["started"]
    assert started.count == 3 and started.last == 0.0 and started.peak == 5.0  # 10 in 2 s
    assert charts["dlq-backlog"].last == 7.0 and charts["in-flight"].count == 4
    ys = [float(p.split(",")[1]) for p in started.points.split()]
    assert ys[0] < ys[1] == ys[2]  # the peak drawn highest, zero at the bottom
    assert overview_charts([])[0].points == ""
    assert overview_charts([sample(0, 1)])[4].points.count(",") == 2  # one sample: a flat line


def _transition(at: float, to: BreakerState) -> StateTransition:
    return StateTransition("db", BreakerState.CLOSED, to, T0 + timedelta(seconds=at), None, 0,
                           30, "r", "forced", 1)


def _info(state: BreakerState, at: float) -> BreakerInfo:
    return BreakerInfo("db", state, 1, True, False, 0, 0, 0, 0, 0, None, None, 0, None, 0,
                       T0 + timedelta(seconds=at))


def test_a_breaker_timeline_spans_its_transitions_up_to_now() -> None:
    timeline = breaker_timeline(_info(BreakerState.CLOSED, 100), [
        _transition(0, BreakerState.OPEN), _transition(50, BreakerState.HALF_OPEN),
        _transition(75, BreakerState.CLOSED)])
    assert [(s.x, s.width, s.state) for s in timeline.segments] == [
        (0.0, 300.0, "open"), (300.0, 150.0, "half_open"), (450.0, 150.0, "closed")]
    assert sum(s.width for s in timeline.segments) == TIMELINE_WIDTH
    alone = breaker_timeline(_info(BreakerState.OPEN, 1), [])
    assert [(s.width, s.state) for s in alone.segments] == [(TIMELINE_WIDTH, "open")]


def test_a_bulk_targets_fields_are_the_filters_and_the_ids_and_its_str_names_the_filter(
) -> None:
    flt = DlqFilter.parse({"status": "all", "reason": "RATE_LIMITED", "older_than": "2h"})
    target = BulkTarget.of(flt, ("a1", "b2"))
    assert target == BulkTarget("all", None, "RATE_LIMITED", None, "2h", ("a1", "b2"))
    assert str(target) == "filter:status=all, reason=RATE_LIMITED, older_than=2h"
    with pytest.raises(AttributeError):
        target.dlq_ids = ()  # type: ignore[misc]  # frozen: the hook cannot change it


def test_identifiers_ending_in_a_newline_are_refused_where_they_are_validated() -> None:
    # ``^...$`` with ``re.match`` lets "x\n" through (``$`` matches before a final
    # newline): every such check uses ``fullmatch``.
    from durabilis._keys import validate_namespace
    from durabilis._url import check_url
    from durabilis.core.dlq.records import sort_key
    from durabilis.doctor._checks import namespace_of
    from durabilis.errors import DurabilisError

    with pytest.raises(DurabilisError):
        validate_namespace("ns\n")
    with pytest.raises(DurabilisError):
        sort_key("1-1\n")
    with pytest.raises(DurabilisError):
        check_url("redis://localhost\n:6379/0")
    assert namespace_of("ns\n:cb-names") is None
    assert namespace_of("ns:cb-names") == "ns"
    assert DlqFilter("pending", reason="X, agent=bob").canonical() != DlqFilter(
        "pending", reason="X", agent="bob").canonical()
