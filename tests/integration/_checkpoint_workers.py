"""Worker processes of the checkpoint multi-process tests (spawned, so importable).

Each worker connects itself. Side effects the tests count live in Redis under
``<namespace>:test:*`` (not durabilis keys), so they survive a SIGKILL.
"""

from __future__ import annotations

import time
from typing import Any

import durabilis
from durabilis.checkpoint import CheckpointConfig, CheckpointManager
from durabilis.errors import CheckpointConflict
from tests.support.backends import raw_client

PHASES = 5


def side_effects(namespace: str) -> str:
    return f"{namespace}:test:side-effects"


def in_phase_marker(namespace: str) -> str:
    return f"{namespace}:test:in-phase"


def outcomes(namespace: str) -> str:
    return f"{namespace}:test:outcomes"


def run_five_phases(url: str, namespace: str, task_id: str, hang_in_phase: int) -> None:
    """Run a 5-phase task through the resume helper; hang inside ``hang_in_phase``."""
    store = durabilis.connect(url, namespace=namespace)
    raw = raw_client(url)
    manager = CheckpointManager(store)

    def phase_fn(n: int) -> Any:
        def fn() -> Any:
            raw.hincrby(side_effects(namespace), f"phase-{n}", 1)
            if n == hang_in_phase:
                raw.set(in_phase_marker(namespace), n)
                time.sleep(60)  # the test SIGKILLs us here
            return {"phase": n, "value": n * 10}

        return fn

    with manager.task(task_id, "agent-1") as run:
        for n in range(1, PHASES + 1):
            run.phase(f"phase-{n}", phase_fn(n))
    raw.rpush(outcomes(namespace), "finished")


def race_expected(
    url: str, namespace: str, task_id: str, name: str, barrier: Any, rounds: int
) -> None:
    """Each round: read the latest, meet the other process, both save on that same latest.

    The loser (CheckpointConflict) re-reads and saves again, so no update is lost.
    """
    store = durabilis.connect(url, namespace=namespace)
    raw = raw_client(url)
    manager = CheckpointManager(store)
    for r in range(rounds):
        barrier.wait(timeout=15)
        latest = manager.restore(task_id, "agent")
        barrier.wait(timeout=15)
        state = {"n": latest.state["n"] + 1, "by": name}
        try:
            manager.save(task_id, "agent", "counter", state,
                         expected_checkpoint_id=latest.checkpoint_id)
            outcome = "won"
        except CheckpointConflict as exc:
            outcome = "conflict" if exc.expected == latest.checkpoint_id else "bad-conflict"
            while True:
                latest = manager.restore(task_id, "agent")
                try:
                    manager.save(task_id, "agent", "counter",
                                 {"n": latest.state["n"] + 1, "by": name},
                                 expected_checkpoint_id=latest.checkpoint_id)
                    break
                except CheckpointConflict:
                    continue
        raw.rpush(outcomes(namespace), f"{r}:{name}:{outcome}")


def cap_writer(
    url: str, namespace: str, writer: int, max_checkpoints: int, saves: int, barrier: Any
) -> None:
    """Save ``saves`` checkpoints of distinct tasks under a small cap, checking the count."""
    store = durabilis.connect(url, namespace=namespace)
    raw = raw_client(url)
    manager = CheckpointManager(store, CheckpointConfig(max_checkpoints=max_checkpoints))
    barrier.wait(timeout=15)
    peak = 0
    for i in range(saves):
        manager.save(f"w{writer}-task-{i}", f"agent-{writer}", "phase", {"w": writer, "i": i})
        peak = max(peak, manager.count())
    raw.rpush(outcomes(namespace), f"{writer}:{peak}")
