"""Durable calls under load through a failover, each run of ``fn`` counted in this
process (a failover cannot lose the count); shared by the Sentinel and the Cluster
failover tests (tests/sentinel, tests/cluster).

The load: threads run durable calls on new keys, one after another. Every fifth
operation fails for good (it is parked in the DLQ: the DLQ id it got back is
noted), every fifth after it saves a checkpoint with its record (noted once
acknowledged); the rest just run. After the fault every operation of the
successful kinds is delivered again until it answers, and the runs of each are
counted: a run twice means an acknowledged record was lost.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import durabilis
from durabilis import (
    DurabilisError,
    DurabilityLayer,
    IdempotencyConfig,
    OperationContext,
    OperationError,
    RetryExhausted,
)
from tests.integration._layer_support import fast_config
from tests.support import figures

LEASE = 15.0  # longer than a failover: a worker's record step outlasts the election
THREADS = 3
SOCKET: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 1.0}


@dataclass
class Load:
    """What a load through one failover saw."""

    runs: Counter[str] = field(default_factory=Counter)  # successful-kind key -> runs of fn
    attempted: set[str] = field(default_factory=set)
    parked: dict[str, str] = field(default_factory=dict)  # key -> dlq_id acknowledged
    saved: set[str] = field(default_factory=set)  # keys whose checkpoint was acknowledged
    errors: Counter[str] = field(default_factory=Counter)
    first_error: dict[str, str] = field(default_factory=dict)  # type -> its first message
    successes: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def longest_gap(self) -> float:
        """The longest time without a success (seconds)."""
        times = sorted(self.successes)
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def kind_of(key: str) -> str:
    """``fails`` (parked), ``checkpoint`` or ``plain``: by the key's number."""
    n = int(key.rsplit("-", 1)[1])
    return "fails" if n % 5 == 0 else "checkpoint" if n % 5 == 1 else "plain"


def call(layer: DurabilityLayer, key: str, load: Load, *, wait: float | None = None) -> None:
    kind = kind_of(key)

    def op(ctx: OperationContext) -> str:
        if kind == "fails":
            raise OperationError("NETWORK_TIMEOUT", "the dependency is down")
        with load.lock:
            load.runs[key] += 1
        return "done"

    extra: dict[str, Any] = {"task_id": f"task-{key}", "phase": "one"} if kind == "checkpoint" \
        else {}
    try:
        layer.execute("agent", "job", key, op, idempotency_key=key, wait=wait, **extra)
    except RetryExhausted as exc:
        if exc.dlq_id is not None:
            with load.lock:
                load.parked[key] = exc.dlq_id
        return
    if kind == "checkpoint":
        with load.lock:
            load.saved.add(key)
    with load.lock:
        load.successes.append(time.monotonic())


def _worker(layer: DurabilityLayer, me: int, load: Load, stop: threading.Event) -> None:
    i = 0
    while not stop.is_set():
        key = f"op-{me}-{i}"
        i += 1
        with load.lock:
            load.attempted.add(key)
        try:
            call(layer, key, load)
        except DurabilisError as exc:
            with load.lock:
                load.errors[type(exc).__name__] += 1
                load.first_error.setdefault(type(exc).__name__, str(exc)[:200])
            time.sleep(0.02)


def through_a_failover(
    url: str, namespace: str, acks: str, fault: Callable[[], Callable[[], None]]
) -> tuple[Load, DurabilityLayer, durabilis.Store]:
    """The load, ``fault()`` in its middle (it returns once the new primary serves),
    then the load until it succeeds again, plus a second; then ``fault()``'s
    clean-up (e.g. the old primary started again)."""
    store = durabilis.connect(url, namespace=namespace, **SOCKET)
    layer = DurabilityLayer(store, fast_config(
        acks=acks, idempotency=IdempotencyConfig(in_progress_ttl_seconds=LEASE),
        dependencies={}))  # (no breaker: the failing fifth must not stop the others)
    load, stop = Load(), threading.Event()
    workers = [threading.Thread(target=_worker, args=(layer, n, load, stop), daemon=True)
               for n in range(THREADS)]
    for w in workers:
        w.start()
    try:
        time.sleep(0.7)
        clean_up = fault()
        resumed = time.monotonic()
        deadline = resumed + 20
        while time.monotonic() < deadline and not any(t > resumed for t in load.successes):
            time.sleep(0.1)
        time.sleep(1.0)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=LEASE + 15)
    clean_up()
    return load, layer, store


def deliver_again(layer: DurabilityLayer, load: Load) -> int:
    """Every attempted operation of the successful kinds, delivered again until it
    answers (a claim left in progress is waited for); returns the calls that failed."""
    failed = 0
    for key in sorted(load.attempted):
        if kind_of(key) == "fails":
            continue
        for _ in range(20):
            try:
                call(layer, key, load, wait=LEASE + 5)
                break
            except DurabilisError:
                time.sleep(0.2)
        else:
            failed += 1
    return failed


def missing_acknowledged(layer: DurabilityLayer, load: Load) -> tuple[int, int]:
    """(DLQ records, checkpoints) acknowledged before the failover and not there after."""
    dlq = sum(1 for dlq_id in load.parked.values() if layer.dlq.get(dlq_id) is None)
    ckpt = sum(1 for key in load.saved
               if not layer.checkpoints.list_current(f"task-{key}", "agent"))
    return dlq, ckpt


def record(backend: str, fault: str, acks: str, load: Load, doubled: int,
           lost_acked: int) -> None:
    """Report one load through a failover: in the table of faults survived, or, for
    ``acks="primary"`` (the documented risk, doubles expected), as a note."""
    line = (f"{backend} failover ({fault}), acks={acks}: {len(load.attempted)} operations, "
            f"{doubled} ran twice, {lost_acked} acknowledged DLQ records/checkpoints lost, "
            f"errors {dict(load.errors)}, longest gap between successes "
            f"{load.longest_gap():.2f} s")
    odd = {k: v for k, v in load.first_error.items() if k != "StorageUnavailable"}
    if odd:
        line += f"; first of the other errors: {odd}"
    if acks == "primary":
        figures.note(line + " (acks=primary: the documented risk)")
        return
    figures.record(
        backend, f"{backend} failover ({fault}), acks={acks}", backend,
        ops=len(load.attempted), lost=lost_acked, doubled=doubled,
        unavailable=sum(load.errors.values()), longest_unavailable_s=load.longest_gap(),
    )
    figures.note(line)
