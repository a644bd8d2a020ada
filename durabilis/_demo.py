"""`durabilis demo`: a fleet of gateway workers writing through a flaky wiki.

Four worker processes publish wiki pages. Each page is a three-phase task
(draft, review, publish); each phase is one durable write through the
layer, checkpointed. The simulated wiki fails at random, has an outage
window, and every page is delivered to two workers (a redelivery storm).
One worker is killed with SIGKILL mid-task. A "cron" in the parent recovers
orphaned operations; at the end the parent replays the dead-letter queue and
resumes unfinished tasks from their checkpoints.

Every number of the report is read back from Redis (the layer's counters,
the breaker's event stream, the DLQ, the checkpoints, the wiki's ledger),
none is computed on the side.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import random
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import structlog

import durabilis
from durabilis import CircuitBreakerConfig, IdempotencyConfig, OperationError, RetryPolicy
from durabilis._mask import mask_url
from durabilis.dlq import DlqStatus
from durabilis.errors import CheckpointNotFound
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext

PHASES = ("draft", "review", "publish")
AGENT = "wiki-agent"
DEPENDENCY = "wiki_service"
OUTAGE = (2.0, 4.0)  # seconds after the start: the wiki answers 503
KILL_IN_PHASE = "review"  # worker 0 is killed inside its first wiki call of this phase
# (mid-task: the task's draft is checkpointed, the review's key claimed)
FAILURE_RATE = 0.15
LEASE_SECONDS = 1.5
FIRST_SECONDS = 10.0  # the longest the other workers wait for worker 0 to hang
FINISH_SECONDS = 30.0  # the longest the end phase goes on replaying and resuming


def demo_config() -> DurabilityConfig:
    return DurabilityConfig(
        idempotency=IdempotencyConfig(in_progress_ttl_seconds=LEASE_SECONDS),
        retry_policies=(
            RetryPolicy(
                "wiki_write", max_attempts=4, initial_delay_ms=40, max_delay_ms=400,
                multiplier=2.0, jitter=True,
                retryable_errors=("NETWORK_TIMEOUT", "SERVICE_UNAVAILABLE"),
                non_retryable_errors=("PERMISSION_DENIED",),
            ),
        ),
        breakers=(CircuitBreakerConfig(DEPENDENCY, 0.5, 6, 1.5, 1, 12, 2),),
        dependencies={"wiki_write": DEPENDENCY},
    )


def _quiet_logs(directory: Path) -> None:
    """Events go to a JSON-lines file, not over the progress line."""
    directory.mkdir(parents=True, exist_ok=True)
    sink = (directory / "demo-events.log").open("a", encoding="utf-8")
    logging.getLogger("durabilis").setLevel(logging.INFO)  # every event, into the file
    structlog.configure(
        processors=[structlog.processors.TimeStamper(fmt="iso"),
                    structlog.processors.JSONRenderer()],
        logger_factory=structlog.WriteLoggerFactory(file=sink),
        cache_logger_on_first_use=False,
    )


class Wiki:
    """The simulated dependency. It keeps its ledger in Redis.

    Failures: a random share, and everything during the outage window. A
    write is applied once per forwarded idempotency key (what a real
    downstream that honours Idempotency-Key does); raw attempts are counted too.
    """

    def __init__(self, store: durabilis.Store, hang: Any = None) -> None:
        self.r = store.client
        self.hang = hang  # worker 0: an Event set when it hangs in a KILL_IN_PHASE call
        self.calls = 0
        self.ledger = store.keys.layer("demo", "wiki")
        self.start_key = store.keys.layer("demo", "start")
        self.started_at: float | None = None  # (no outage before the start: worker 0's lead)
        self.rng = random.Random()

    def __call__(self, ctx: OperationContext) -> dict[str, Any]:
        self.calls += 1
        if self.hang is not None and ctx.payload["phase"] == KILL_IN_PHASE:
            self.hang.set()  # the parent SIGKILLs this worker here: the write is claimed,
            time.sleep(60)  # its outcome unknown (what a crash mid-request leaves)
        time.sleep(self.rng.uniform(0.02, 0.06))  # network and work
        if self.started_at is None:
            start = self.r.get(self.start_key)
            self.started_at = float(start) if start else None
        elapsed = -1.0 if self.started_at is None else time.time() - self.started_at
        if OUTAGE[0] <= elapsed < OUTAGE[1]:
            raise OperationError("SERVICE_UNAVAILABLE", "wiki is down for maintenance")
        if self.rng.random() < FAILURE_RATE:
            raise OperationError("NETWORK_TIMEOUT", "wiki did not answer in time")
        applied = self.r.hsetnx(self.ledger, ctx.idempotency_key, ctx.token or "")
        self.r.hincrby(self.ledger + ":attempted", ctx.idempotency_key, 1)
        page = ctx.payload["task"]
        return {"page": page, "phase": ctx.payload["phase"], "applied": bool(applied)}


def run_task(layer: DurabilityLayer, wiki: Wiki, task_id: str) -> bool:
    """Run a task's phases from its last checkpoint; False if a phase was parked."""
    try:
        done = layer.checkpoints.restore(task_id, AGENT).phase
        start = PHASES.index(done) + 1
    except CheckpointNotFound:
        start = 0
    if 0 < start < len(PHASES):
        layer.store.client.hincrby(layer.store.keys.layer("demo", "tasks"), "resumed", 1)
    for phase in PHASES[start:]:
        try:
            layer.execute(
                AGENT, "wiki_write", {"task": task_id, "phase": phase}, wiki,
                task_id=task_id, phase=phase, park_on_open=True,
            )
        except (durabilis.RetryExhausted, durabilis.OperationInProgress):
            return False  # parked in the DLQ (or still running elsewhere): later
    return True


def _worker(
    url: str | None, namespace: str, tasks: list[str], go: Any, log: str, *, hang: Any = None,
    ready: Any = None,
) -> None:
    _quiet_logs(Path(log))
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, demo_config())
    if ready is not None:
        ready.release()  # imported and connected
    go.wait(60)
    wiki = Wiki(store, hang)
    for task_id in tasks:
        run_task(layer, wiki, task_id)
    layer.close()
    store.close()


PLAIN_EVERY = 2.0
"""Seconds between two progress lines when the output is not a terminal."""


def _progress(layer: DurabilityLayer, started_at: float, alive: int, total: int) -> str:
    s = layer.stats()
    state = layer.breakers.state(DEPENDENCY).value.upper()
    return (
        f"  t={time.time() - started_at:4.1f}s  workers {alive}/{total}  ok {s.succeeded:4d}"
        f"  duplicates {s.duplicates:4d}  retries {s.retries:3d}  breaker {state:9s}"
        f"  parked {s.parked:3d} (parkings {s.parkings:3d})  recovered {s.recovered}"
    )


class _Live:
    """The progress line. On a terminal it is redrawn in place (``\r``); written
    to a file or a pipe, it is a plain line ending in a newline, every
    PLAIN_EVERY seconds (and the last one), never one long line of redraws."""

    def __init__(self, out: Any) -> None:
        self.out = out
        isatty = getattr(out, "isatty", None)
        try:
            self.tty = bool(isatty and isatty())
        except ValueError:  # (a closed stream)
            self.tty = False
        self._next = 0.0
        self._width = 0

    def show(self, text: str, *, last: bool = False) -> None:
        if self.tty:
            pad = " " * max(0, self._width - len(text))  # (what a longer line left)
            self._width = len(text)
            print(f"\r{text}{pad}", end="\n" if last else "", file=self.out, flush=True)
            return
        now = time.monotonic()
        if last or now >= self._next:
            print(text, file=self.out, flush=True)
            self._next = now + PLAIN_EVERY


def run(
    url: str | None = None,
    *,
    workers: int = 4,
    tasks_per_worker: int = 12,
    as_json: bool = False,
    namespace: str | None = None,
) -> int:
    """Run the demo; returns the exit code (0: every page published exactly once)."""
    namespace = namespace or f"demo-{uuid.uuid4().hex[:8]}"
    log_dir = Path(".durabilis")
    _quiet_logs(log_dir)
    out = sys.stderr if as_json else sys.stdout
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, demo_config())
    total_tasks = workers * tasks_per_worker
    tasks = [f"page-{i:03d}" for i in range(total_tasks)]
    print(
        f"durabilis demo: {workers} workers publish {total_tasks} wiki pages "
        f"({len(PHASES)} phases each) through a flaky wiki\n"
        f"  store {mask_url(store.url)}  namespace {namespace}\n"
        f"  wiki: {int(FAILURE_RATE * 100)}% random timeouts, outage from "
        f"t={OUTAGE[0]:.0f}s to t={OUTAGE[1]:.0f}s; every page is delivered to two workers;"
        " worker 0 is killed mid-task",
        file=out,
    )
    live = _Live(out)
    procs, started_at, killed_at = _run_workers(
        url, store, layer=layer, tasks=tasks, workers=workers, log_dir=log_dir, live=live
    )
    _finish(
        store, layer, tasks=tasks, started_at=started_at, killed_at=killed_at,
        workers=workers, live=live,
    )
    live.show(_progress(layer, started_at, 0, workers), last=True)
    report = read_report(store, tasks)
    report["killed_worker_exit_code"] = procs[0].exitcode
    report["seconds"] = round(time.time() - started_at, 1)
    killed = report["killed_worker_exit_code"] == -signal.SIGKILL
    if not killed:  # (what the demo shows did not happen: not a success)
        print("durabilis demo: worker 0 was never killed mid-task (it did not reach its "
              f"{KILL_IN_PHASE} call within {FIRST_SECONDS:g} s: is the machine overloaded?)",
              file=sys.stderr)
    ok = report["pages_published"] == total_tasks and report["exactly_once"] and killed
    report["ok"] = ok
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    layer.close()
    store.close()
    return 0 if ok else 1


def _run_workers(
    url: str | None,
    store: durabilis.Store,
    *,
    layer: DurabilityLayer,
    tasks: list[str],
    workers: int,
    log_dir: Path,
    live: _Live,
) -> tuple[list[Any], float, float | None]:
    """Start the workers, kill worker 0 mid-task, run the recovery cron until they end."""
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    go_first = ctx.Event()  # worker 0's start: ahead of the others (below)
    ready = ctx.Semaphore(0)  # one release per worker that is imported and connected
    hung = ctx.Event()  # worker 0 is inside a wiki call, mid-task: kill it now
    own = [tasks[w::workers] for w in range(workers)]
    procs = []
    for w in range(workers):
        redelivered = own[(w - 1) % workers]
        mine = [t for pair in zip(own[w], redelivered, strict=True) for t in pair]
        procs.append(ctx.Process(
            target=_worker,
            args=(url, store.namespace, mine, go_first if w == 0 else go, str(log_dir)),
            kwargs={"hang": hung if w == 0 else None, "ready": ready},
        ))
    for p in procs:
        p.start()
    # None starts before all are imported and connected: on a loaded machine,
    # a worker still importing while the others ran would find its tasks done
    # by them.
    for _ in procs:
        ready.acquire(timeout=60)
    # Worker 0 starts first and the others once it hangs in its KILL_IN_PHASE
    # call (its first task's draft done: a few wiki calls), and the clock of
    # the outage starts then. Started together, a worker 0 slowed down by a
    # loaded machine could find each of its tasks' reviews done by the worker
    # they are redelivered to, or parked while the breaker was open, and never
    # be killed mid-task.
    go_first.set()
    hung.wait(FIRST_SECONDS)
    started_at = time.time()
    store.client.set(store.keys.layer("demo", "start"), repr(started_at), ex=3600)
    go.set()
    killed_at: float | None = None
    next_cron = time.time() + 0.5
    while any(p.is_alive() for p in procs):
        now = time.time()
        if killed_at is None and hung.is_set():
            os.kill(procs[0].pid, signal.SIGKILL)  # type: ignore[arg-type]
            killed_at = now
        if now >= next_cron:
            layer.recover_orphans()  # what a cron job of the fleet does
            next_cron = now + 0.5
        alive = sum(p.is_alive() for p in procs)
        live.show(_progress(layer, started_at, alive, workers))
        time.sleep(0.1)
    for p in procs:
        p.join()
    return procs, started_at, killed_at


def _finish(
    store: durabilis.Store,
    layer: DurabilityLayer,
    *,
    tasks: list[str],
    started_at: float,
    killed_at: float | None,
    workers: int,
    live: _Live,
) -> None:
    """Recover the dead worker's orphans, replay the DLQ (once the wiki is back),
    resume what is left from the checkpoints."""
    wiki = Wiki(store)
    # Past the outage, and past the killed worker's lease: its orphan is recoverable.
    until = max(started_at + OUTAGE[1], (killed_at or started_at) + LEASE_SECONDS) + 0.3
    while time.time() < until:
        layer.recover_orphans()
        live.show(_progress(layer, started_at, 0, workers))
        time.sleep(0.1)
    # Replay what is parked and resume what is unfinished until both are done.
    # The wiki still fails at random, so the breaker can open again meanwhile:
    # then writes are parked again, and a later round (after its reset
    # timeout, through its probe) takes them up. Bounded: FINISH_SECONDS.
    deadline = time.time() + FINISH_SECONDS
    while time.time() < deadline:
        layer.recover_orphans()
        if layer.dlq.pending_count():
            layer.replay_pending(wiki)
        unfinished = [t for t in tasks if _phase_of(layer, t) != PHASES[-1]]
        for task_id in unfinished:
            run_task(layer, wiki, task_id)
        live.show(_progress(layer, started_at, 0, workers))
        if not unfinished and layer.dlq.pending_count() == 0:
            break
        time.sleep(0.25)


def _phase_of(layer: DurabilityLayer, task_id: str) -> str | None:
    try:
        return layer.checkpoints.restore(task_id, AGENT).phase
    except CheckpointNotFound:
        return None


def read_report(store: durabilis.Store, tasks: list[str]) -> dict[str, Any]:
    """Everything the report says, read from Redis (also used by the tests)."""
    layer = DurabilityLayer(store, demo_config())
    stats = layer.stats()
    ledger = store.keys.layer("demo", "wiki")
    applied = int(store.client.hlen(ledger))
    attempts = [int(v) for v in store.client.hvals(ledger + ":attempted")]
    dlq = layer.dlq.stats()
    transitions = layer.breakers.transitions(DEPENDENCY, limit=100)
    start = float(store.client.get(store.keys.layer("demo", "start")) or 0)
    phases = {t: _phase_of(layer, t) for t in tasks}
    resumed = store.client.hget(store.keys.layer("demo", "tasks"), "resumed")
    layer.close()
    return {
        "namespace": store.namespace,
        "operations_succeeded": stats.succeeded,
        "duplicates_suppressed": stats.duplicates,
        "retries": stats.retries,
        # The layer's counts: operations parked (a new DLQ record each), and
        # every parking (re-deliveries of a pending operation merge into its record).
        "parked": stats.parked,
        "parkings": stats.parkings,
        "parked_in_dlq": dlq.total,  # the DLQ's records: one per parked operation
        "orphans_recovered": stats.recovered,
        "in_flight": stats.in_flight,
        "dlq_replayed": dlq.by_status[DlqStatus.REPLAYED],
        "dlq_pending": dlq.pending,
        "breaker_transitions": [
            {
                "at": round(t.at.timestamp() - start, 2),
                "from": t.from_state.value,
                "to": t.to_state.value,
                "reason": t.reason,
                "replica": t.replica_id,
            }
            for t in transitions
        ],
        "tasks_resumed_from_checkpoint": int(resumed or 0),
        "pages_published": sum(1 for p in phases.values() if p == PHASES[-1]),
        "writes_applied_by_wiki": applied,
        "writes_attempted_on_wiki": sum(attempts),
        "exactly_once": applied == len(tasks) * len(PHASES) and stats.in_flight == 0,
    }


def print_report(r: dict[str, Any]) -> None:
    print("\nreport (every number read back from Redis):")
    rows = [
        ("pages published", r["pages_published"]),
        ("durable writes succeeded", r["operations_succeeded"]),
        ("duplicates suppressed", r["duplicates_suppressed"]),
        ("retries", r["retries"]),
        ("operations parked in the DLQ (parked)", r["parked"]),
        ("  of which orphans of the killed worker", r["orphans_recovered"]),
        ("  parkings (every delivery parked)", r["parkings"]),
        ("DLQ records (one per parked operation)", r["parked_in_dlq"]),
        ("  replayed", r["dlq_replayed"]),
        ("  still pending", r["dlq_pending"]),
        ("tasks resumed from a checkpoint", r["tasks_resumed_from_checkpoint"]),
        ("writes applied by the wiki", r["writes_applied_by_wiki"]),
        ("writes the wiki received (with re-runs)", r["writes_attempted_on_wiki"]),
    ]
    for label, value in rows:
        print(f"  {label:40s} {value}")
    print("  breaker wiki_service timeline (t = seconds after the start):")
    for t in r["breaker_transitions"]:
        print(f"    t={t['at']:5.2f}s  {t['from']:>9s} -> {t['to']:9s} ({t['reason']})")
    verdict = "every page published, every write applied exactly once"
    print(f"{'OK' if r['ok'] else 'FAILED'}: {verdict if r['ok'] else 'see above'}"
          f"  ({r['seconds']}s)")


if __name__ == "__main__":  # pragma: no cover
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(run())
