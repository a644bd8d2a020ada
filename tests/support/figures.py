"""The figures the fault suites report: faults injected and survived, ops lost/doubled.

Tests call :func:`record`; ``tests/conftest.py`` prints the table at the end
of the run (``pytest_terminal_summary``), so CI logs carry the figures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FaultFigure:
    test: str
    fault: str
    backend: str
    ops: int
    lost: int
    doubled: int
    unavailable: int
    longest_unavailable_s: float
    ran_during_fault: int
    reruns: int = 0


FIGURES: list[FaultFigure] = []
NOTES: list[str] = []


def note(line: str) -> None:
    """A figure that is not one fault (e.g. the totals of the layer's SIGKILL loop)."""
    NOTES.append(line)


def record(
    test: str,
    fault: str,
    backend: str,
    *,
    ops: int,
    lost: int,
    doubled: int,
    unavailable: int,
    longest_unavailable_s: float = 0.0,
    ran_during_fault: int = 0,
    reruns: int = 0,
) -> None:
    """Note one injected fault that the test survived (call it after the asserts).

    ``reruns``: re-runs the layer's contract allows (an ``fn`` whose outcome could
    not be recorded because Redis failed, run again under the same key).
    """
    FIGURES.append(FaultFigure(test, fault, backend, ops, lost, doubled, unavailable,
                               round(longest_unavailable_s, 3), ran_during_fault, reruns))


def table() -> list[str]:
    if not FIGURES:
        return list(NOTES)
    lines = [f"{'fault':<52} {'backend':<10} {'ops':>5} {'during':>6} {'lost':>4} "
             f"{'doubled':>7} {'rerun':>5} {'unavail':>7} {'longest':>7}"]
    for f in FIGURES:
        lines.append(f"{f.fault:<52} {f.backend:<10} {f.ops:>5} {f.ran_during_fault:>6} "
                     f"{f.lost:>4} {f.doubled:>7} {f.reruns:>5} {f.unavailable:>7} "
                     f"{f.longest_unavailable_s:>6.2f}s")
    lines.append("(during: operations that ran while the fault was going on; unavail: calls "
                 "that raised StorageUnavailable, longest: the longest of them; rerun: layer "
                 "operations run again because Redis failed before their outcome was stored, "
                 "same key: allowed, counted apart from doubled)")
    lines.append(f"faults injected and survived: {len(FIGURES)}; operations lost: "
                 f"{sum(f.lost for f in FIGURES)}; doubled: {sum(f.doubled for f in FIGURES)}")
    return lines + NOTES
