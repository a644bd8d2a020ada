"""Small charts as numbers for inline SVG (drawn by the templates: no script, no
style attribute; only coordinates computed here, never a stored string)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise

from durabilis.breaker import BreakerInfo, BreakerState, StateTransition
from durabilis.web._data import Sample

WIDTH = 300
HEIGHT = 80
PAD = 2


@dataclass(frozen=True, slots=True)
class Chart:
    """One series: ``points`` for ``<polyline points=...>``, the last value and the max."""

    key: str
    title: str
    unit: str
    points: str
    last: float | None
    peak: float
    count: int


def _points(values: Sequence[float]) -> tuple[str, float]:
    if not values:
        return "", 0.0
    peak = max(*values, 0.0)
    scale = peak or 1.0
    n = len(values)
    step = (WIDTH - 2 * PAD) / max(n - 1, 1)
    pts = []
    for i, v in enumerate(values):
        x = PAD + i * step
        y = HEIGHT - PAD - (max(v, 0.0) / scale) * (HEIGHT - 2 * PAD)
        pts.append(f"{x:.1f},{y:.1f}")
    if n == 1:  # one sample: a flat line across
        pts.append(f"{WIDTH - PAD:.1f},{pts[0].split(',')[1]}")
    return " ".join(pts), peak


def _rates(samples: Sequence[Sample], get: Callable[[Sample], int]) -> list[float]:
    """Per second between consecutive samples (a counter that went back, as after
    its hash was deleted, counts as 0)."""
    out = []
    for a, b in pairwise(samples):
        dt = (b.at - a.at).total_seconds()
        out.append(max(get(b) - get(a), 0) / dt if dt > 0 else 0.0)
    return out


def overview_charts(samples: Sequence[Sample]) -> list[Chart]:
    series: list[tuple[str, str, str, list[float]]] = [
        ("started", "Started", "/s", _rates(samples, lambda s: s.started)),
        ("succeeded", "Succeeded", "/s", _rates(samples, lambda s: s.succeeded)),
        ("retried", "Retried", "/s", _rates(samples, lambda s: s.retries)),
        ("parked", "Parked", "/s", _rates(samples, lambda s: s.parked)),
        ("in-flight", "In flight", "", [float(s.in_flight) for s in samples]),
        ("dlq-backlog", "DLQ backlog", "", [float(max(s.backlog, 0)) for s in samples]),
    ]
    out = []
    for key, title, unit, values in series:
        points, peak = _points(values)
        out.append(Chart(key, title, unit, points, values[-1] if values else None, peak,
                         len(values)))
    return out


@dataclass(frozen=True, slots=True)
class Segment:
    x: float
    width: float
    state: str


@dataclass(frozen=True, slots=True)
class Timeline:
    segments: list[Segment]
    start: datetime | None
    end: datetime


TIMELINE_WIDTH = 600


def breaker_timeline(info: BreakerInfo, transitions: Sequence[StateTransition]) -> Timeline:
    """The breaker's state over the time its transitions cover, up to now."""
    end = info.checked_at
    if not transitions:
        return Timeline([Segment(0, TIMELINE_WIDTH, info.state.value)], None, end)
    start = transitions[0].at
    span = max((end - start).total_seconds(), 1e-3)

    def x(at: datetime) -> float:
        return min(max((at - start).total_seconds() / span, 0.0), 1.0) * TIMELINE_WIDTH

    segments = []
    for t, nxt in zip(transitions, [*transitions[1:], None], strict=True):
        x0 = x(t.at)
        x1 = x(nxt.at) if nxt is not None else TIMELINE_WIDTH
        segments.append(Segment(round(x0, 1), round(max(x1 - x0, 1.0), 1),
                                BreakerState(t.to_state).value))
    return Timeline(segments, start, end)
