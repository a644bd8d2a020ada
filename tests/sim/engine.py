"""The deterministic fault simulator: every plan, every step boundary, every fault.

One *run* (one seed) builds a small fleet on a real redis-server: worker
actors executing durable operations (sync or asyncio flavoured), a recoverer
(``recover_orphans``) and a replayer (DLQ replay through the layer), each with
its own ``DurabilityLayer``, all stepped one plan step at a time by the
library's own :class:`~durabilis._steps.Stepper` under a seeded scheduler. At
each boundary the scheduler picks who steps next and may inject a fault:

- a crash before or after the server applied the step (the plan is abandoned;
  the actor's keep-alive stops);
- a lost reply (applied, then ``StorageUnavailable``), a timeout (not applied),
  a failure or a crash in the middle of a Cluster step (the waves before it
  applied; of the wave in flight, each call applied or not, its reply lost or not);
- a cancellation (asyncio actors), before or after the server applied the step,
  and during ``fn``; shielded steps defer it as the asyncio driver does;
- ``fn`` succeeding, raising a retryable or non-retryable error, returning an
  unstorable result, or its worker dying inside it; for sync actors,
  ``SystemExit`` or ``KeyboardInterrupt`` raised inside ``fn`` after its effect
  (the claim goes back touched: the next delivery must run ``ctx.recovered``);
- an operator forcing the breaker open or closed;
- time passing (the server clock is the simulation's, through
  ``durabilis.testing.offset_server_clock``): small steps, and jumps past leases
  during which live actors' keep-alives renew, unless an actor is *stalled*
  (then its lease may lapse: the one case where two workers may legitimately
  run one operation at once).

The seams (each drawn for about a fifth of the runs, from a stream of its own,
so that a run without them is the run it was before them):

- a **fork**: a worker forks mid-run (preferably while it holds a claim). The
  child starts with a deep copy of the parent's in-process state (its layer,
  its lease book, locks copied unheld, the store shared), on which the
  library's own fork hook (``durabilis._fork._after_fork_in_child``) runs, for
  the copies only; the parent then dies (60 %) or goes on; the child submits
  operations of its own, and its keep-alive ticks in time jumps. It must never
  renew, record, release or unlist a claim of its parent (checked at each of
  its steps and ticks; a claim of a dead parent must age out and be recovered:
  "nothing stuck"), nor send its parent's batched counts (the counters check);
- a **key secret rotation** (content keys, HMAC'd under the secret): every
  replica starts on (S1, previous S2), the runbook's step 1; at one step some
  switch to (S2, previous S1), later all (step 2, a rolling deploy: a replica
  switches at its next plan, a restart). Checks are per *logical operation*
  (a content key under each secret is one operation); at the end every record
  still parked is replayed without faults (again, up to three rounds, while a
  replay's own failures opened the breaker and deferred the others: as an
  operator would), so that a record parked under one key of an operation
  completed under another must be settled;
- **outcomes left to the keep-alive**: a record or park step that fails once
  is handed to the process's keep-alive at once (an ``OutcomeUnrecorded``
  for its caller, as after a whole lease without Redis), and while the run
  has faults the keep-alive's own steps get them too: a step failing midway
  (its first calls applied, the failing one applied or not, its reply
  lost), a fused step's reply lost (applied or not), a round of
  side-by-side steps losing some calls' replies. The checks above must hold
  once the survivors' keep-alives have sent what was left;
- **budget settings that differ between replicas**: a ``RetryBudget`` per
  replica (its own window, ratio and minimum), changed mid-run by a restart.
  Every budget script applied is logged with its server time (bracketed by
  reads before and after); no retry may be granted beyond what any setting
  used within its window allows, counted on exact sliding windows
  (:meth:`Simulation._check_budget`).

Half of the runs fuse each step into one script (standalone Redis), half run
the scripts of a step one by one, as on Redis Cluster, where other actors
interleave between them. After the schedule ends, the survivors finish
without faults, time jumps past every lease, recovery runs to completion, and
the invariants are checked (:meth:`Simulation.check`). A violation raises
:class:`Counterexample` with the seed and the step trace; the run replays
from its seed.
"""

from __future__ import annotations

import asyncio
import copy
import copyreg
import dataclasses
import itertools
import logging
import random
import threading
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
import structlog

import durabilis
from durabilis import (
    CircuitBreakerConfig,
    DurabilisError,
    IdempotencyConfig,
    IdempotencyKey,
    OperationError,
    RetryPolicy,
    StorageUnavailable,
    _fork,
)
from durabilis._keys import bucket_tag
from durabilis._scripts import Replies, ScriptCall, unfuse
from durabilis._steps import (
    IO,
    Batch,
    Command,
    Defer,
    Hold,
    LeaseBook,
    Run,
    Sleep,
    Stepper,
    async_shielded,
    drive,
    shielded,
)
from durabilis._store import _waves as _store_waves
from durabilis.checkpoint import _RunPlan
from durabilis.core import layer as _plans
from durabilis.core.layer import base as _plans_base
from durabilis.dlq import DlqConfig, DlqStatus
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext
from durabilis.layer._direct import lean_call
from durabilis.retry import RetryBudget
from durabilis.testing import offset_server_clock
from tests.sim.threaded import Threads, threaded_plan

LEASE = 10.0  # virtual seconds
SECRET_1 = "sim-key-secret-one-0123456789"
SECRET_2 = "sim-key-secret-two-0123456789"
RENEW = 3.0
DEP = "svc"


class Counterexample(AssertionError):
    """An invariant broke: the message holds the seed, the violation and the trace."""


class SimUserError(Exception):
    """An exception of the user's own (not an OperationError, not durabilis')."""


def _sim_fn(ctx: OperationContext) -> Any:  # pragma: no cover - the simulator runs fn itself
    raise AssertionError("the simulator performs Run steps itself")


async def _sim_async_fn(ctx: OperationContext) -> Any:  # pragma: no cover
    raise AssertionError("the simulator performs Run steps itself")


@dataclass(frozen=True)
class Phase:
    """The fn of one checkpointed task phase (the simulator runs it itself)."""

    task: str
    name: str

    def __call__(self) -> Any:  # pragma: no cover - the simulator runs fn itself
        raise AssertionError("the simulator performs Run steps itself")


PHASES = ("p1", "p2", "p3")


@dataclass
class Execution:
    """One run of ``fn`` (one attempt)."""

    actor: str
    key: str
    token: str | None
    start_step: int
    nonce: str = ""  # the claim it runs under
    end_step: int | None = None
    effect: bool = False  # the side effect happened (or may have: a worker died inside)
    cancelled: bool = False  # cancelled inside fn: the caller got CancelledError


@dataclass
class Submission:
    """One call of execute by a worker, and how it ended."""

    actor: str
    label: str
    key: str | None = None  # the idempotency key (None: refused before one existed)
    outcome: str = "pending"  # ok | error | crashed | pending
    value: Any = None
    error: BaseException | None = None
    nonces: set[str] = field(default_factory=set)  # the claims it made
    runs: int = 0  # how many times its fn started
    faulted: bool = False  # a fault was injected while it ran
    stalled: bool = False  # its process was paused past its lease


def _kept(plan: Any, into: list[Any]) -> Any:
    """``plan``, its returned value also appended to ``into`` (no step added)."""
    value = yield from plan
    into.append(value)
    return value


@dataclass
class Actor:
    name: str
    kind: str  # worker | recoverer | replayer
    layer: DurabilityLayer
    flavour: str  # sync | async
    queue: list[Callable[[], Any]] = field(default_factory=list)
    run: Stepper | None = None
    submission: Submission | None = None
    wake: float = 0.0
    crashed: bool = False
    stalled: bool = False
    inside: Execution | None = None
    leases: LeaseBook = field(default_factory=LeaseBook)
    next_renew: float = 0.0
    plan_no: int = 0
    faulted_plans: set[int] = field(default_factory=set)
    nonces: dict[str, str] = field(default_factory=dict)  # record key -> its latest claim
    plan_holds: list[Any] = field(default_factory=list)  # what the running plan holds
    restart: bool = False  # its settings changed: a new layer before its next plan
    fork_of: str | None = None  # a forked child: its parent's name
    parent_claims: set[str] = field(default_factory=set)  # (child) the parent's claim nonces

    @property
    def active(self) -> bool:
        return not self.crashed and (self.run is not None or bool(self.queue))


@dataclass
class Knobs:
    """What one run draws: the fleet's shape and how hostile the schedule is."""

    fused: bool
    dedup: bool
    breaker: bool
    fault_rate: float
    workers: int
    ops_per_worker: int
    labels: int
    max_steps: int
    jumps: float  # chance per step that time jumps by about a lease
    # The seams (drawn from their own stream: a run without them is the run it was)
    fork: bool = False  # a worker forks mid-run; the child takes part, the parent may die
    rotation: bool = False  # content keys under a key secret rotated mid-run (rolling)
    budgets: bool = False  # a retry budget whose setting differs between replicas
    keepalive: bool = False  # outcomes left to the keep-alive at once, its steps faulted
    purge: bool = False  # an operator purges the replayed DLQ records now and then


class Simulation:
    """One seeded run. ``run()`` then ``check()``; ``trace`` tells the story."""

    def __init__(self, seed: int, redis_url: str) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.url = redis_url
        self.namespace = f"sim-{seed}-{self.rng.getrandbits(32):08x}"
        rng = self.rng
        self.knobs = Knobs(
            fused=rng.random() < 0.5,
            dedup=rng.random() < 0.9,
            breaker=rng.random() < 0.8,
            fault_rate=rng.choice((0.0, 0.03, 0.08, 0.15)),
            workers=rng.randint(2, 3),
            ops_per_worker=rng.randint(1, 4),
            labels=rng.randint(1, 3),
            max_steps=200,
            jumps=rng.choice((0.02, 0.02, 0.08)),
        )
        # The seams' actions (fork, key secret rotation, budget settings) draw
        # from their own stream: a run without them replays as it did before.
        x = self.xrng = random.Random(f"seams-{seed}")
        self.knobs.fork = x.random() < 0.2
        self.knobs.rotation = self.knobs.dedup and x.random() < 0.2
        self.knobs.budgets = x.random() < 0.2
        # (its own stream too: drawn from x, it would change the seams above)
        self.krng = random.Random(f"keepalive-{seed}")
        self.knobs.keepalive = self.krng.random() < 0.2
        self.prng = random.Random(f"purge-{seed}")  # (and its own, for the same reason)
        self.purged: set[str] = set()  # the DLQ records the operator purged
        self.knobs.purge = self.knobs.dedup and self.prng.random() < 0.2
        # Rotation: every replica starts on (S1, previous S2) (the runbook's step 1
        # done); at rotate_at some switch to (S2, previous S1), at rotate_all_at
        # the rest (step 2, a rolling deploy). Names not listed follow the fleet.
        self.rotate_at = x.randint(1, 40)
        self.rotate_all_at = self.rotate_at + x.randint(1, 30)
        self.secrets: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.fleet_secrets = (SECRET_1, (SECRET_2,))
        # Budgets: each replica's own setting (window and cap), changed mid-run
        # by a restart; every budget script applied, bracketed by server time.
        self.budget_of: dict[str, RetryBudget] = {}
        self.budget_log: list[tuple[int, int, str, int, int, int, bool]] = []
        # Idempotency key -> its logical operation (a content key has one per
        # secret); and each operation's keys. Without a rotation, one key each.
        self.op_of: dict[str, str] = {}
        self.keys_of: dict[str, set[str]] = defaultdict(set)
        self.now = 0.0
        self.step_no = 0
        self.trace: list[str] = []
        self.violations: list[str] = []
        self.executions: list[Execution] = []
        self.submissions: list[Submission] = []
        self.unrespected: set[tuple[str, str]] = set()  # (key, claim nonce) whose lease lapsed
        self.probe_owner: dict[str, tuple[str, int]] = {}  # probe nonce -> (actor, plan)
        self.graveyard: list[Any] = []  # abandoned plans (kept: no GeneratorExit cleanup)
        self.lean_calls = 0  # sync operations run by the layer's own lean_call (threaded_plan)
        self.threads = Threads()  # (their threads: those of crashed calls end at close)
        self.faults = True
        # The counts the layers put in their per-process batches (_leave, and a
        # duplicate's): in a run without faults, every one lands exactly once.
        self.batched: Counter[str] = Counter()
        # One client and one set of registered scripts serve every run (runs
        # follow one another; the clock key is shared, set afresh by each run).
        shared = _shared(redis_url)
        self.raw = shared.raw
        self.clock_key = shared.clock_key
        self.store = durabilis.Store(
            shared.store.client, url=redis_url, namespace=self.namespace, is_cluster=False
        )
        self.store.scripts = shared.store.scripts
        self.store._fuse = self.knobs.fused
        self.config = self._config()
        self.saved_before_run: set[str] = set()
        self.observer = durabilis.checkpoint.CheckpointManager(self.store, self.config.checkpoint)
        self.actors = self._actors()

    # -- setup ------------------------------------------------------------------

    def _config(self) -> DurabilityConfig:
        rng = self.rng
        policy = RetryPolicy(
            "job", max_attempts=rng.randint(1, 3), initial_delay_ms=20, max_delay_ms=200,
            multiplier=2.0, jitter=True,
            retryable_errors=("NETWORK_TIMEOUT",), non_retryable_errors=("PERMISSION_DENIED",),
        )
        breakers = (
            (CircuitBreakerConfig(
                DEP, failure_rate_threshold=0.5, min_request_count=2,
                reset_timeout_seconds=2, probe_success_required=rng.randint(1, 2),
                window_size=10, probe_timeout_seconds=3,
            ),)
            if self.knobs.breaker else ()
        )
        if self.knobs.budgets:  # retries to spend (a budget with one attempt is idle)
            policy = dataclasses.replace(policy, max_attempts=3)
        return DurabilityConfig(
            idempotency=IdempotencyConfig(
                enabled=self.knobs.dedup, in_progress_ttl_seconds=LEASE,
                dedup_window_seconds=3600, max_value_bytes=2048,
            ),
            retry_policies=(policy,),
            breakers=breakers,
            dependencies={"job": DEP} if self.knobs.breaker else {},
            dlq=DlqConfig(claim_ttl_seconds=5, max_payload_bytes=4096),
            renew_every_seconds=RENEW,
        )

    def _config_for(self, name: str) -> DurabilityConfig:
        """The configuration a replica runs with now (its secrets, its budget)."""
        cfg = self.config
        if self.knobs.rotation:
            current, previous = self.secrets.get(name, self.fleet_secrets)
            cfg = dataclasses.replace(cfg, idempotency=dataclasses.replace(
                cfg.idempotency, key_secret=current, previous_key_secrets=previous))
        if self.knobs.budgets:
            budget = self.budget_of.get(name)
            if budget is None:
                budget = self.budget_of[name] = self._draw_budget()
            cfg = dataclasses.replace(cfg, retry_policies=tuple(
                dataclasses.replace(p, budget=budget) for p in cfg.retry_policies or ()))
        return cfg

    def _draw_budget(self) -> RetryBudget:
        x = self.xrng
        return RetryBudget(ratio=x.choice((0.0, 0.1, 0.5, 1.0)), min_retries=x.randint(0, 2),
                           window_seconds=x.choice((0.5, 2.0, 5.0, 20.0)))

    def _layer(self, name: str) -> DurabilityLayer:
        layer = DurabilityLayer(self.store, self._config_for(name), replica_id=name)
        layer._core.clock = lambda: self.now
        layer._core.on_wait = None  # (its keep-alive is simulated: _flush at its ticks)
        if self.knobs.keepalive:  # a record or park step that fails once is deferred
            layer._core._lease_s = 0.0
            layer._core._late_tries = 1
        self._tally(layer)
        return layer

    def _tally(self, layer: DurabilityLayer) -> None:
        """Count what the layer batches in its process (see ``batched``)."""
        core = layer._core
        for name in ("_leave", "_count_duplicate"):  # (a fork's copy: its parent's tallies)
            vars(core).pop(name, None)
        leave, count_duplicate = core._leave, core._count_duplicate

        def tallied_leave(members: Any, counts: Any) -> None:
            for counter, n in counts.items():
                self.batched[counter] += n
            leave(members, counts)

        def tallied_duplicate() -> int:
            self.batched["duplicates"] += 1
            return count_duplicate()

        core._leave = tallied_leave  # type: ignore[method-assign]
        core._count_duplicate = tallied_duplicate  # type: ignore[method-assign]

    def _actors(self) -> list[Actor]:
        rng = self.rng
        actors = []
        labels = [f"op{i}" for i in range(self.knobs.labels)]
        for w in range(self.knobs.workers):
            actor = Actor(f"w{w}", "worker", self._layer(f"w{w}"),
                          rng.choice(("sync", "async")))
            for _ in range(self.knobs.ops_per_worker):
                actor.queue.append(self._operation(actor, rng.choice(labels)))
            actors.append(actor)
        tasker = Actor("task", "tasker", self._layer("task"), rng.choice(("sync", "async")))
        for _ in range(rng.randint(0, 3)):
            tasker.queue.append(lambda t=tasker: self._task_run(t))
        actors.append(tasker)
        recoverer = Actor("rec", "recoverer", self._layer("rec"), "sync")
        for _ in range(rng.randint(1, 3)):
            recoverer.queue.append(lambda r=recoverer: r.layer._core.recover_plan(
                self.rng.choice((1, 2, 100))))
        actors.append(recoverer)
        replayer = Actor("rep", "replayer", self._layer("rep"), rng.choice(("sync", "async")))
        for i in range(rng.randint(0, 2)):
            # (the second pass: an operator's requeue, then the fleet's requeued pass)
            replayer.queue.append(
                (lambda r=replayer: self._requeue_pass(r)) if i else
                (lambda r=replayer: r.layer.dlq._ops.replay_pending_steps(
                    None, 3, None, r.layer._core.replay_plan(self._fn(r)))))
        actors.append(replayer)
        for a in actors:  # the recoverer and the replayer start a little later
            a.wake = 0.0 if a.kind == "worker" else rng.uniform(0.0, 2.0)
        return actors

    def _task_run(self, actor: Actor) -> Any:
        """One run of the task: its three phases, resumed from its checkpoints."""
        ops = actor.layer.checkpoints._ops
        run = _RunPlan(ops, "task-1", "agent", None, exclusive=True)
        # What a run that starts now must never run again: phases already saved.
        self.saved_before_run = {p for p in PHASES if self._phase_saved(p)}

        def plan() -> Any:
            for name in PHASES:
                yield from run.phase_plan(name, Phase("task-1", name))
            return "task done"

        return plan()

    def _phase_saved(self, phase: str) -> bool:
        try:
            self.observer.restore("task-1", "agent", phase)
        except durabilis.errors.CheckpointNotFound:
            return False
        return True

    def _requeue_pass(self, actor: Actor) -> Any:
        """An operator marks up to 5 pending records for redelivery (no handler),
        then the fleet's requeued pass replays those of type ``job``."""
        ops = actor.layer.dlq._ops
        pending = yield from ops.list_pending_steps(None, 5, None)
        yield from ops.requeue_steps([r.dlq_id for r in pending], "sim-operator")
        return (yield from ops.replay_requeued_steps(
            {"job": actor.layer._core.replay_plan(self._fn(actor))}, 3, None))

    def _fn(self, actor: Actor) -> Callable[[OperationContext], Any]:
        if actor.flavour == "async" and self.rng.random() < 0.5:
            return _sim_async_fn  # cancellable inside fn
        return _sim_fn  # sync, or a plain function in a worker thread (shielded)

    def _operation(self, actor: Actor, label: str) -> Callable[[], Any]:
        rng = self.rng
        raw_key = rng.random() < 0.3
        task = rng.random() < 0.3
        payload: Any = {"op": label}
        bad = rng.random()
        if bad < 0.03:
            payload = {"op": label, "blob": "x" * 5000}  # over the claim's and the DLQ's caps
        elif bad < 0.05:
            payload = {"op": label, "obj": object()}  # not encodable
        wait = rng.choice((None, None, 0.0, 0.5))
        park_on_open = rng.random() < 0.2

        def start() -> Any:
            sub = Submission(actor.name, label)
            self.submissions.append(sub)
            actor.submission = sub
            layer = actor.layer
            req = layer._core.request(
                "agent", "job", payload, dependency=None,
                idempotency_key=(IdempotencyKey.from_raw(f"raw-{label}", payload={"op": label})
                                 if raw_key else None),
                task_id=f"t-{label}" if task else None, phase="p1" if task else None,
                wait=wait, park_on_open=park_on_open, deadline_seconds=None,
            )
            sub.key = req.key.value
            self._register(req.key.value, payload, content=not raw_key)
            fn = self._fn(actor)
            core = layer._core
            lean = core.lean_entry(req) if actor.flavour == "sync" else None
            if lean is not None:  # the sync layer's lean path itself, as DurabilityLayer runs it
                self.lean_calls += 1
                return threaded_plan(
                    lambda port: lean_call(core, req, fn, lean[0], lean[1], port), self.threads
                )
            return core.execute_plan(req, fn)

        return start

    # -- logical operations: a content key under each secret is one operation --

    def _register(self, key: str, payload: Any, *, content: bool) -> None:
        if key in self.op_of:
            return
        keys = {key}
        if content and self.knobs.rotation:
            for secret in (SECRET_1, SECRET_2):
                keys.add(IdempotencyKey.new("agent", "job", payload, secret=secret).value)
        op = min(keys)
        for k in keys:
            self.op_of[k] = op
            self.keys_of[op].add(k)

    def _op(self, key: str) -> str:
        return self.op_of.get(key, key)

    def _aliases(self, key: str) -> set[str]:
        """Every key of ``key``'s operation (itself included)."""
        return self.keys_of.get(self._op(key)) or {key}

    def _recorded(self, key: str) -> bool:
        """The operation is completed under one of its keys."""
        return any(self.raw.hget(self.store.keys.idem(k), "s") == b"d"
                   for k in sorted(self._aliases(key)))

    # -- the schedule -------------------------------------------------------------

    def log(self, text: str) -> None:
        self.trace.append(f"{self.step_no:4d} t={self.now:7.3f} {text}")

    def run(self) -> None:
        with _quiet_logs(), _seeded(self.seed, self.rng):
            self._set_clock()
            while self.step_no < self.knobs.max_steps:
                if not self._tick():
                    break
            self.faults = False
            self.log("-- quiesce: the survivors finish without faults")
            self._until_idle("live actors did not finish")
            for a in self.actors:  # the survivors close; the dead lost what waited in them
                if not a.crashed:
                    self._flush(a)
            self._advance(LEASE * 2.5)
            self._recover_all()
            if self.knobs.rotation and self.knobs.dedup:
                self._replay_all()

    def _replay_all(self) -> None:
        """Rotation runs: what is still parked is replayed without faults (again
        while the breaker, reopened by a replay's failures, deferred some),
        by a replica on the final secrets (a record parked under one key of an
        operation completed under another is settled by its replay: docs/
        production.md, "Rotating the key secret"); then recovery again."""
        for rounds in range(3):
            if self.knobs.breaker:  # (an operator's forced open would defer every replay)
                self.violations += [v for v in self._held_probes() if v not in self.violations]
                self.actors[0].layer.breakers.force_close(DEP)
            name = "final-rep" if not rounds else f"final-rep{rounds + 1}"
            rep = Actor(name, "replayer", self._layer(name), "sync")
            summaries: list[Any] = []
            if not rounds:
                rep.queue.append(lambda rep=rep: self._requeue_pass(rep))  # the fleet's first
            rep.queue.append(lambda rep=rep, into=summaries: _kept(
                rep.layer.dlq._ops.replay_pending_steps(
                    None, None, None, rep.layer._core.replay_plan(self._fn(rep))), into))
            self.actors.append(rep)
            self.log("-- final replay of what is parked" + (" (again)" if rounds else ""))
            self._until_idle("the final replay did not finish")
            self._flush(rep)
            # A replay's own failures can open the breaker again, deferring the
            # records after it (as an operator would, close it and replay again).
            if not (summaries and summaries[-1].breakers_open and summaries[-1].deferred):
                break
        self._advance(LEASE * 2.5)
        self._recover_all()

    def _until_idle(self, what: str) -> None:
        """Steps without faults until no actor is left, at most 2,000 (else stuck)."""
        limit = self.step_no + 2000
        while self.step_no < limit:
            if not self._tick(events=False):
                return
        self.violations.append(f"stuck: {what} (2000 steps)")

    def _tick(self, *, events: bool = True) -> bool:
        self.step_no += 1
        if any(a.active for a in self.actors):  # (a fork may add an actor, kill one)
            self._seams(events=events and self.faults)
        live = [a for a in self.actors if a.active]
        if not live:
            return False
        if events and self.faults:
            self._event()
        ready = [a for a in live if a.wake <= self.now]
        if not ready:
            self._advance(min(a.wake for a in live) - self.now)
            return True
        self._step(self.rng.choice(ready))
        return True

    def _event(self) -> None:
        r = self.rng.random()
        jumps = self.knobs.jumps
        if r < 0.04:
            self._advance(self.rng.uniform(0.001, 0.5))
        elif r < 0.04 + jumps:
            holders = [a for a in self.actors if a.active and len(a.leases)]
            if holders and self.rng.random() < 0.3:
                victim = self.rng.choice(holders)
                victim.stalled = True
                if victim.submission is not None:
                    victim.submission.faulted = victim.submission.stalled = True
                self.log(f"{victim.name} stalls (its keep-alive will not run)")
            self._advance(LEASE * self.rng.uniform(0.4, 1.6))
            for a in self.actors:
                a.stalled = False
        elif r < 0.05 + jumps and self.knobs.breaker:
            op = self.rng.choice(("open", "close"))
            registry = self.actors[0].layer.breakers
            (registry.force_open if op == "open" else registry.force_close)(DEP)
            self.log(f"operator forces the breaker {op}")

    def _seams(self, *, events: bool) -> None:
        """The actions at the seams: a rolling key secret rotation (a deploy: in
        any phase), a replica restarted with another budget setting, a fork."""
        x = self.xrng
        if self.knobs.rotation and self.step_no in (self.rotate_at, self.rotate_all_at):
            switched = []
            for a in self.actors:
                if self.secrets.get(a.name, self.fleet_secrets)[0] == SECRET_2:
                    continue
                if self.step_no == self.rotate_all_at or x.random() < 0.5:
                    self.secrets[a.name] = (SECRET_2, (SECRET_1,))
                    a.restart = True
                    switched.append(a.name)
            if self.step_no == self.rotate_all_at:
                self.fleet_secrets = (SECRET_2, (SECRET_1,))
            self.log(f"key secret rotation: {switched} switch to (S2, previous S1)")
        if not events:
            return
        if self.knobs.purge and self.prng.random() < 0.05:
            self._purge_replayed()
        if self.knobs.budgets and x.random() < 0.03:
            a = x.choice(self.actors)
            self.budget_of[a.name] = self._draw_budget()
            a.restart = True
            self.log(f"{a.name} will restart with budget {self.budget_of[a.name]}")
        if self.knobs.fork and not any(a.fork_of for a in self.actors) and x.random() < 0.05:
            parents = [a for a in self.actors if a.kind == "worker" and not a.crashed]
            holders = [a for a in parents if len(a.leases)]
            if holders or (parents and x.random() < 0.2):
                self._fork(x.choice(holders or parents))

    def _purge_replayed(self) -> None:
        """An operator's housekeeping (``dlq purge --status replayed``): the settled
        records go for good, so a parking sent late can no longer find itself in
        its record (the parking's guard must hold: the fourth review of stop 39)."""
        dlq = self.actors[0].layer.dlq
        records, _ = dlq.list_all(limit=1000)
        done = [r.dlq_id for r in records if r.status is DlqStatus.REPLAYED]
        if done:
            out = dlq.purge(done, status="replayed")
            self.purged.update(i for i, what in out.items() if what == "purged")
            self.log(f"operator purges {len(done)} replayed DLQ records")

    def _restart(self, actor: Actor) -> None:
        """A replica redeployed with its new settings, between two plans: its old
        layer closes (what waits in it is sent), a new one starts."""
        actor.restart = False
        self._flush(actor)
        actor.layer = self._layer(actor.name)
        current = self.secrets.get(actor.name, self.fleet_secrets)[0]
        self.log(f"{actor.name} restarts (secret {'S2' if current == SECRET_2 else 'S1'}, "
                 f"budget {self.budget_of.get(actor.name)})")

    def _fork(self, parent: Actor) -> None:
        """``parent`` forks: the child starts with a copy of the parent's
        in-process state (its layer, its lease book: copied as fork copies
        memory, the store and its connections shared), on which the library's
        fork hook (``durabilis._fork``) runs, for the copies only. The child
        submits operations of its own; the parent may die right after."""
        memo: dict[int, Any] = {id(self.store): self.store, id(self): self}
        with _locks_copied_unheld():
            layer, leases = copy.deepcopy((parent.layer, parent.leases), memo)
        # The child's copies of what the parent registered for the hook.
        copies = [memo[id(obj)] for obj in list(_fork._LIVE)
                  if id(obj) in memo and memo[id(obj)] is not obj]
        live, hooks = _fork._LIVE, _fork._HOOKS
        _fork._LIVE, _fork._HOOKS = weakref.WeakSet(copies), []  # (module state is shared)
        try:
            _fork._after_fork_in_child()
        finally:
            _fork._LIVE, _fork._HOOKS = live, hooks
        for obj in copies:  # registered in the child as in its parent (a grandchild)
            _fork.reset_in_child(obj)
        self._tally(layer)
        child = Actor(f"{parent.name}f", "worker", layer, parent.flavour, leases=leases,
                      fork_of=parent.name)
        child.parent_claims = {nonce for _, nonce, _ in parent.leases.held()} | set(
            parent.nonces.values())
        for _ in range(self.xrng.randint(1, 2)):
            label = f"op{self.xrng.randrange(self.knobs.labels)}"
            child.queue.append(self._operation(child, label))
        child.wake = self.now
        self.actors.append(child)
        self.log(f"{parent.name} FORKS {child.name} (holding {len(parent.leases)} claim(s))")
        if self.xrng.random() < 0.6:
            self._crash(parent, "after forking")

    def _set_clock(self) -> None:
        self.raw.set(self.clock_key, int(self.now * 1_000_000))

    def _advance(self, seconds: float) -> None:
        """Let time pass; live actors' keep-alives renew every RENEW seconds."""
        target = self.now + max(0.0, seconds)
        for a in self.actors:  # overslept a lease: as good as a paused process
            if a.active and a.wake + LEASE / 2 < target and a.submission is not None:
                a.submission.stalled = a.submission.faulted = True
        while self.now < target:
            self.now = min(target, self.now + RENEW * 0.9)
            self._set_clock()
            for a in self.actors:
                if a.crashed or not len(a.leases):
                    continue
                if a.stalled:
                    for key, nonce, _ in a.leases.held():
                        self.unrespected.add((key, nonce))
                    continue
                if self.now >= a.next_renew:
                    a.next_renew = self.now + RENEW
                    held = a.leases.held()
                    self._not_the_parents(a, "renews", [nonce for _, nonce, _ in held])
                    deferred = a.leases.deferred()  # outcomes the keep-alive still sends
                    self._not_the_parents(a, "records", [item.item[1] for item in deferred])
                    # The layer's own keep-alive plan (what both twins drive).
                    plan = a.layer._core.keep_alive_plan(a.leases)
                    if self.knobs.keepalive and self.faults:
                        self._keep_alive_faulted(plan)
                    else:
                        drive(plan, self.store)
                        if a.leases.deferred():  # (no fault here: each one lands)
                            raise AssertionError(
                                "a deferred outcome was not sent by the keep-alive"
                            )
                    for _ in deferred:
                        self.log(f"{a.name} keep-alive records a deferred outcome")
                    self._flush(a)
        self.log(f"time -> {self.now:.3f}")

    def _keep_alive_faulted(self, plan: Any) -> None:
        """A keep-alive tick whose deferred outcomes' steps may fail (the seam
        "outcomes left to the keep-alive"); its renewals and notes run clean."""
        rng, store = self.krng, self.store
        try:
            step = next(plan)
            while True:
                renewal = type(step) is Batch and any(
                    c.name == "idem_renew" or (c.name == "layer_note" and c.args[0] in (
                        "renew", "back")) for c in step.calls
                )
                if renewal or rng.random() >= 0.5:
                    try:
                        reply = (store.run_step(step.calls, step.gates, step.waves)
                                 if type(step) is IO else store.run_many(step.calls))
                    except DurabilisError as exc:
                        step = plan.throw(exc)
                        continue
                    step = plan.send(reply)
                    continue
                failed = self._deferred_fault(step)
                if isinstance(failed, Replies):
                    step = plan.send(failed)
                else:
                    self.log(f"keep-alive fault: {failed}")
                    step = plan.throw(failed)
        except StopIteration:
            return

    def _deferred_fault(self, step: Any) -> DurabilisError | Replies:
        """A fault in a deferred outcome's step (see :meth:`_keep_alive_faulted`);
        the replies themselves when its calls happen to end it first."""
        rng, store, calls = self.krng, self.store, list(step.calls)
        if type(step) is IO and (store.fuses or len(calls) == 1):
            if rng.random() < 0.5:  # applied, its reply lost; else not applied
                store.run_step(calls, step.gates, step.waves)
            failed = StorageUnavailable("sim: a deferred step's reply lost")
            failed.partial = Replies([None] * len(calls), "?" * len(calls))
            return failed
        if type(step) is IO:  # one by one: its first k calls applied, the next lost
            k = rng.randrange(len(calls))
            replies, status = [None] * len(calls), ["n"] * len(calls)
            for i in range(k):
                replies[i] = store.run(calls[i])
                refused = bool(step.gates and i in step.gates and step.gates[i](replies[i]))
                status[i] = "r" if refused else "c"
                if refused:
                    return Replies(replies, "".join(status))
            if rng.random() < 0.5:
                store.run(calls[k])
            status[k] = "?"
            failed = StorageUnavailable(f"sim: a deferred step failed at call {k}")
            failed.partial = Replies(replies, "".join(status))
            return failed
        # A round of side-by-side steps (a Batch): each call applied or not, some lost.
        outs: list[Any] = []
        for call in calls:
            applied = rng.random() < 0.6
            reply = store.run(call) if applied else None
            outs.append(reply if applied and rng.random() < 0.6
                        else StorageUnavailable("sim: lost in a round"))
        lost = [o for o in outs if isinstance(o, DurabilisError)]
        if not lost:
            return Replies(outs, "c" * len(outs))
        lost[0].partial = Replies(
            outs, "".join("?" if isinstance(o, DurabilisError) else "c" for o in outs)
        )
        return lost[0]

    def _flush(self, actor: Actor) -> None:
        """What the keep-alive's tick (or stats(), close()) sends of the counts and
        the index removals waiting in a process (Cluster: _LayerCore._leave)."""
        self._not_the_parents(actor, "removes the index entry of",
                              [m.rpartition("|")[2] for m in self._waiting(actor.name)])
        drive(actor.layer._core.flush_plan(), self.store)

    def _not_the_parents(self, actor: Actor, what: str, nonces: list[str]) -> None:
        """A forked child never acts on a claim of its parent (its keep-alive does
        not renew it, nothing of the child records or releases it): a parent that
        dies has its claims age out and recovered."""
        if actor.fork_of is None:
            return
        for nonce in sorted(set(nonces) & actor.parent_claims):
            self.violations.append(f"forked child {actor.name} {what} its parent "
                                   f"{actor.fork_of}'s claim {nonce}")

    def _fault(self, step: Any, actor: Actor) -> str | None:
        if not self.faults or self.rng.random() >= self.knobs.fault_rate:
            return None
        kinds = ["crash_before", "crash_after", "lost_reply", "timeout"]
        if not self.store.fuses and type(step) is IO and len(step.calls) > 1:
            kinds += ["mid_step", "crash_mid"]
        if actor.flavour == "async":
            kinds += ["cancel_before", "cancel_after"]
        return self.rng.choice(kinds)

    def _crash(self, actor: Actor, why: str) -> None:
        self.log(f"{actor.name} CRASHES ({why})")
        actor.crashed = True
        if actor.run is not None:
            self.graveyard.append(actor.run)
        if actor.inside is not None:
            actor.inside.end_step = self.step_no
            actor.inside.effect = actor.inside.effect or self.rng.random() < 0.5
            actor.inside = None
        if actor.submission is not None:
            actor.submission.outcome = "crashed"

    def _step(self, actor: Actor) -> None:
        if actor.run is None:
            if actor.restart:
                self._restart(actor)
            factory = actor.queue.pop(0)
            actor.plan_no += 1
            try:
                actor.run = Stepper(
                    factory(), async_shielded if actor.flavour == "async" else shielded
                )
            except BaseException as exc:  # refused before any I/O (or at the first step)
                self._ended(actor, exc)
                return
            self._after(actor)
            return
        step = actor.run.step
        kind = type(step)
        try:
            if kind in (IO, ScriptCall, Command):
                self._io(actor, step)
            elif kind is Run:
                self._run_fn(actor, step)
            elif kind is Sleep:
                self._sleep(actor, step)
            elif kind is Hold:
                actor.plan_holds.append(actor.leases.hold(step))
                actor.next_renew = self.now + RENEW
                actor.run.send(None)
            else:
                raise AssertionError(f"unknown step {step!r}")
        except BaseException as exc:  # the plan ended by raising
            self._ended(actor, exc)
            return
        self._after(actor)

    def _after(self, actor: Actor) -> None:
        run = actor.run
        # A Hold follows its claim's reply with no I/O in between (as in the
        # real drivers): nothing can run between them.
        while run is not None and not run.done and type(run.step) in (Hold, Defer):
            if type(run.step) is Defer:
                actor.leases.defer(run.step)
            else:
                actor.plan_holds.append(actor.leases.hold(run.step))
            actor.next_renew = self.now + RENEW
            try:
                run.send(None)
            except BaseException as exc:
                self._ended(actor, exc)
                return
        if run is not None and run.done and not actor.crashed:
            self._ended(actor, None, run.value)

    def _ended(self, actor: Actor, error: BaseException | None, value: Any = None) -> None:
        if actor.crashed:
            return
        sub = actor.submission
        what = f"raised {type(error).__name__}: {error}" if error else f"returned {value!r}"
        self.log(f"{actor.name} plan ends: {what}"[:300])
        if actor.kind == "worker" and sub is not None:
            sub.outcome = "error" if error is not None else "ok"
            sub.error, sub.value = error, value
            self._nothing_left(sub)
        elif error is not None and not isinstance(
                error, (DurabilisError, asyncio.CancelledError, SimUserError, SystemExit,
                        KeyboardInterrupt)):
            self.violations.append(f"{actor.name} ({actor.kind}) raised {error!r}")
        actor.run = None
        actor.submission = None
        for item in actor.plan_holds:
            actor.leases.drop(item)
        actor.plan_holds.clear()
        actor.wake = self.now + self.rng.uniform(0.0, 1.0)

    def _nothing_left(self, sub: Submission) -> None:
        """When a caller gets its answer, its own claim is settled: recorded,
        released or parked, and its in-flight entry gone (unless a fault hit it,
        or its lease was lost: then recovery settles them)."""
        if sub.faulted or not sub.key or not self.knobs.dedup:
            return
        if isinstance(sub.error, (durabilis.errors.LeaseLost, durabilis.OutcomeUnrecorded)):
            return
        rkey = self.store.keys.idem(sub.key)
        state, cn = self.raw.hmget(rkey, "s", "cn")
        for nonce in sub.nonces:
            if state == b"p" and cn == nonce.encode():
                answer = type(sub.error).__name__ if sub.error else "ok"
                self.violations.append(
                    f"{sub.actor} {sub.label} answered ({answer}) but left its claim {nonce}"
                    " in progress")
            member = f"{sub.key}|{nonce}"
            if member in self._waiting(sub.actor):
                continue  # removed later by its process (Cluster: _LayerCore._leave)
            if self.raw.zscore(self.store.keys.layer("inflight"), member) is not None:
                self.violations.append(
                    f"{sub.actor} {sub.label} answered but left its in-flight entry {member}")
        if sub.outcome == "ok" and state != b"d" and not self._recorded(sub.key):
            self.violations.append(f"{sub.actor} {sub.label} got a result that is not recorded")

    def _waiting(self, name: str) -> list[str]:
        actor = next((a for a in self.actors if a.name == name), None)
        if actor is None:
            return []
        core = actor.layer._core
        return [*core._gone, *(m for gone, _ in core._unsure for m in gone)]

    def _note_probes(self, actor: Actor, calls: list[ScriptCall]) -> None:
        for call in (part for fused in calls for part in unfuse(fused)):
            if call.name == "cb_before" and len(call.args) > 1 and call.args[1]:
                nonce = str(call.args[1]).split(".", 1)[0]
                self.probe_owner[nonce] = (actor.name, actor.plan_no)
            if call.name == "idem_claim":
                actor.nonces[str(call.keys[0])] = str(call.args[5])
                if actor.submission is not None:
                    actor.submission.nonces.add(str(call.args[5]))

    def _partly(
        self, calls: list[ScriptCall], gates: Any, waves: Any
    ) -> tuple[Replies | None, Replies | None]:
        """Run part of an unfused step, as a Cluster step that fails midway: the
        waves before a failing wave apply; in the failing wave (its calls sent
        at once) each call applies or not, and its reply comes back or not, at
        least one unknown; the waves after it are not sent. Returns ``(partial,
        None)``, or ``(None, replies)`` when a gated refusal ended the step
        before the failing wave (no fault then)."""
        groups = _store_waves(len(calls), waves)
        failing = self.rng.randrange(len(groups))
        replies: list[Any] = [None] * len(calls)
        status = ["n"] * len(calls)
        for w, wave in enumerate(groups):
            if w < failing:
                refused = False
                for i in wave:
                    replies[i] = self._run_noted(calls[i])
                    refused_now = bool(gates and i in gates and gates[i](replies[i]))
                    status[i] = "r" if refused_now else "c"
                    refused = refused or refused_now
                if refused:  # the step ended here, as run_step ends it
                    return None, Replies(replies, "".join(status))
                continue
            lost = self.rng.choice(wave)  # at least this one is unknown
            for i in wave:
                applies = self.rng.random() < 0.5
                if applies:
                    replies[i] = self._run_noted(calls[i])
                if applies and i != lost and self.rng.random() < 0.5:
                    refused_now = bool(gates and i in gates and gates[i](replies[i]))
                    status[i] = "r" if refused_now else "c"
                else:
                    replies[i], status[i] = None, "?"
            break
        return Replies(replies, "".join(status)), None

    # -- the retry budget's log: every budget script applied, and when --

    def _server_ms(self) -> int:
        """The scripts' clock now (the server's, offset by the simulation's)."""
        sec, us = self.raw.time()
        return int(sec * 1_000_000 + us + int(self.now * 1_000_000)) // 1000

    def _run_noted(self, call: ScriptCall) -> Any:
        if not (self.knobs.budgets and call.name == "retry_budget"):
            return self.store.run(call)
        lo = self._server_ms()
        reply = self.store.run(call)
        self._note_budget(call, reply, lo, self._server_ms())
        return reply

    def _note_budget(self, call: ScriptCall, reply: Any, lo: int, hi: int) -> None:
        """A ``retry_budget`` call applied between server times ``lo`` and ``hi``
        (ms): its mode, its setting, and whether a retry was granted."""
        if call.name != "retry_budget":
            return
        mode, window, ratio_ppm, least = call.args[:4]
        tag = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if tag not in ("ok", "denied"):  # (foreign data at the key: nothing written)
            return
        self.budget_log.append((lo, hi, str(mode), int(window), int(ratio_ppm), int(least),
                                mode == "retry" and tag == "ok"))

    def _io(self, actor: Actor, step: Any) -> None:  # noqa: PLR0912  (a branch per fault)
        assert actor.run is not None
        calls = list(step.calls) if type(step) is IO else [] if type(step) is Command else [step]
        gates = step.gates if type(step) is IO else None
        self._note_probes(actor, calls)
        if actor.fork_of is not None:  # what acts as a claim's owner: its nonce
            self._not_the_parents(actor, "records or releases", [
                str(arg) for call in calls for part in unfuse(call)
                if part.name in ("idem_record", "idem_release") for arg in part.args])
        fault = self._fault(step, actor)
        names = "+".join(c.name for c in calls) if type(step) is not Command else step.args[0]
        self.log(f"{actor.name} io {names}" + (f" FAULT {fault}" if fault else ""))
        if fault and not fault.startswith("cancel"):
            # A storage fault or a crash may leave what recovery settles later.
            # A cancellation may not: the plan compensates it, shielded.
            actor.faulted_plans.add(actor.plan_no)
            if actor.submission is not None:
                actor.submission.faulted = True
        if fault == "crash_before":
            self._crash(actor, "before the step")
            return
        if fault == "timeout":
            actor.run.throw(_unavailable("timeout, not applied", len(calls)))
            return
        if fault == "cancel_before" and not async_shielded(step):
            actor.run.throw(asyncio.CancelledError())
            return
        if fault in ("mid_step", "crash_mid") and len(calls) > 1:
            done, ended = self._partly(calls, gates, step.waves if type(step) is IO else None)
            if done is None:  # refused before the failing wave: the step ended there
                self.log(f"{actor.name} step refused before its fault ({ended and ended.status})")
                actor.run.send(ended)
                return
            if fault == "crash_mid":
                self._crash(actor, f"in the middle of the step ({done.status})")
                return
            exc = _unavailable(f"failed in the middle ({done.status})", len(calls))
            exc.partial = done
            actor.run.throw(exc)
            return
        try:
            if type(step) is Command:
                reply: Any = self.store.command(*step.args)
            elif type(step) is ScriptCall:
                reply = self._run_noted(step)
            elif self.knobs.budgets and any(c.name == "retry_budget" for c in calls):
                lo = self._server_ms()
                reply = self.store.run_step(calls, gates, step.waves)
                hi = self._server_ms()
                for call, one, status in zip(calls, reply, reply.status, strict=True):
                    if status == "c":  # (a call refused before ready() wrote nothing)
                        self._note_budget(call, one, lo, hi)
            else:
                reply = self.store.run_step(calls, gates, step.waves)
        except DurabilisError as exc:
            self.violations.append(f"unexpected storage error without a fault: {exc!r}")
            actor.run.throw(exc)
            return
        if fault == "crash_after":
            self._crash(actor, "after the step applied")
            return
        if fault == "lost_reply":
            actor.run.throw(_unavailable("reply lost after the step applied", len(calls)))
            return
        if fault in ("cancel_before", "cancel_after"):
            if async_shielded(step):
                actor.run.defer(asyncio.CancelledError())
            else:
                actor.run.throw(asyncio.CancelledError())
                return
        actor.run.send(reply)

    def _sleep(self, actor: Actor, step: Sleep) -> None:
        assert actor.run is not None
        if (self.faults and actor.flavour == "async" and not step.shield
                and self.rng.random() < self.knobs.fault_rate / 2):
            self.log(f"{actor.name} cancelled while sleeping")
            actor.run.throw(asyncio.CancelledError())
            return
        actor.wake = self.now + step.seconds
        actor.run.send(None)

    def _run_phase(self, actor: Actor, phase: Phase) -> None:
        assert actor.run is not None
        self.log(f"{actor.name} runs task phase {phase.name}")
        if phase.name in self.saved_before_run:
            self.violations.append(f"task phase {phase.name} ran again although it was saved "
                                   "before this run started")
        if self.faults and self.rng.random() < self.knobs.fault_rate:
            self._crash(actor, f"inside task phase {phase.name}")
            return
        if self.rng.random() < 0.1:
            actor.run.send((False, SimUserError(f"phase {phase.name} failed")))
            return
        actor.run.send((True, {"phase": phase.name, "step": self.step_no}))

    def _run_fn(self, actor: Actor, step: Run) -> None:
        assert actor.run is not None
        if isinstance(step.arg, Phase):
            self._run_phase(actor, step.arg)
            return
        ctx: OperationContext = step.arg
        if actor.inside is None:  # fn starts
            self._enter(actor, ctx)
            return
        execution, actor.inside = actor.inside, None
        execution.end_step = self.step_no
        r = self.rng.random()
        cancel_ok = self.faults and actor.flavour == "async"
        if self.faults and r < self.knobs.fault_rate / 2:
            execution.effect = self.rng.random() < 0.5
            actor.inside = execution
            self._crash(actor, "inside fn")
            return
        if cancel_ok and r < self.knobs.fault_rate:
            if async_shielded(step):  # a plain function in a thread: it finishes first
                execution.effect = True
                self.log(f"{actor.name} fn ok, cancelled meanwhile (deferred)")
                actor.run.defer(asyncio.CancelledError())
                actor.run.send((True, {"by": actor.name, "n": self.step_no}))
            else:
                execution.effect = self.rng.random() < 0.5
                execution.cancelled = True
                self.log(f"{actor.name} fn cancelled (effect={execution.effect})")
                actor.run.throw(asyncio.CancelledError())
            return
        if self.faults and actor.flavour == "sync" and r < self.knobs.fault_rate:
            # The process is interrupted inside fn after its effect (sys.exit()
            # in fn or a signal handler, Ctrl-C): its caller gets the interruption.
            interruption = self.rng.choice((SystemExit, KeyboardInterrupt))
            execution.effect = execution.cancelled = True
            self.log(f"{actor.name} fn has its effect, then {interruption.__name__}")
            actor.run.throw(interruption())
            return
        roll = self.rng.random()
        if roll < 0.55:
            execution.effect = True
            value: Any = {"by": actor.name, "n": self.step_no}
            self.log(f"{actor.name} fn ok {value}")
            actor.run.send((True, value))
        elif roll < 0.60:
            execution.effect = True
            self.log(f"{actor.name} fn ok, result unstorable")
            actor.run.send((True, {"blob": "y" * 4000}))
        elif roll < 0.85:
            self.log(f"{actor.name} fn fails, retryable")
            actor.run.send((False, OperationError("NETWORK_TIMEOUT", "sim")))
        elif roll < 0.95:
            self.log(f"{actor.name} fn fails, non-retryable")
            actor.run.send((False, OperationError("PERMISSION_DENIED", "sim")))
        else:
            self.log(f"{actor.name} fn raises the user's own error")
            actor.run.send((False, SimUserError("boom")))

    def _enter(self, actor: Actor, ctx: OperationContext) -> None:
        key, token = ctx.idempotency_key, ctx.token
        self.log(f"{actor.name} fn starts key={key} token={token} attempt={ctx.attempt}"
                 f"{' replay' if ctx.replay else ''}{' recovered' if ctx.recovered else ''}")
        nonce = actor.nonces.get(self.store.keys.idem(key), "")
        if self.knobs.dedup:
            # Per logical operation: a content key under each secret is one
            # operation (a rotation); an alias recorded by a worker whose lease
            # lapsed meanwhile (nobody took that key from it) is that stall's.
            op, stale = self._op(key), (key, nonce) in self.unrespected
            lapsed = {k for k, _ in self.unrespected}
            for k in sorted(self._aliases(key)):
                if (self.raw.hget(self.store.keys.idem(k), "s") == b"d" and not stale
                        and (k == key or k not in lapsed)):
                    self.violations.append(f"{actor.name} runs {key} although it has a record"
                                           + (f" (under {k})" if k != key else ""))
            for other in self.actors:
                ex = other.inside
                if (other is not actor and ex is not None and self._op(ex.key) == op
                        and (ex.key, ex.nonce) not in self.unrespected and not stale):
                    self.violations.append(
                        f"{actor.name} and {other.name} inside fn for {key} at once"
                        + (f" (under {ex.key})" if ex.key != key else ""))
            # An earlier run's effect (or a run interrupted or killed inside fn)
            # is never hidden from the next run: it is told (ctx.recovered, or a
            # replay), with the same key and a higher token.
            # (A worker paused past its lease runs on a claim taken from it: the
            # stale run the token fences, not a delivery.)
            running = {id(a.inside) for a in self.actors if a.inside is not None}
            for ex in self.executions:
                if (self._op(ex.key) == op and ex.effect and id(ex) not in running
                        and not stale and (ex.key, ex.nonce) not in self.unrespected
                        and not (ctx.recovered or ctx.replay)):
                    self.violations.append(
                        f"{actor.name} runs {key} unflagged after {ex.actor}'s run (token "
                        f"{ex.token}) may have had its effect")
                    break
        execution = Execution(actor.name, key, token, self.step_no, nonce)
        self.executions.append(execution)
        actor.inside = execution
        if actor.submission is not None:
            actor.submission.runs += 1

    def _recover_all(self) -> None:
        recoverer = self._layer("final-recoverer")
        for _ in range(5):
            run = Stepper(recoverer._core.recover_plan(1000))
            while not run.done:
                step = run.step
                calls = list(step.calls)
                run.send(self.store.run_step(calls, step.gates))
            self.log(f"final recovery parked {run.value}")
            if not run.value:
                return

    # -- the invariants -----------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`Counterexample` if any invariant broke."""
        problems = list(self.violations)
        problems += self._check_outcomes()
        problems += self._check_nothing_stuck()
        problems += self._check_batched_counts()
        problems += self._check_budget()
        if problems:
            raise Counterexample(self.report(problems))

    def report(self, problems: list[str]) -> str:
        head = (f"seed {self.seed} ({self.knobs}) broke {len(problems)} invariant(s):\n  "
                + "\n  ".join(problems))
        return (head + "\nreplay: pytest tests/sim --sim-seed " + str(self.seed)
                + "\ntrace:\n" + "\n".join(self.trace[-400:]))

    def _dlq_records(self) -> dict[str, list[dict[bytes, bytes]]]:
        by_key: dict[str, list[dict[bytes, bytes]]] = defaultdict(list)
        stream = self.store.keys.dlq("stream")
        for _, fields in self.raw.xrange(stream):
            key = fields.get(b"meta:idempotency_key", b"").decode()
            by_key[key].append(fields)
        return by_key

    def _check_outcomes(self) -> list[str]:
        out: list[str] = []
        allowed = (DurabilisError, OperationError, SimUserError, asyncio.CancelledError,
                   SystemExit, KeyboardInterrupt)
        for sub in self.submissions:
            if sub.outcome == "error" and not isinstance(sub.error, allowed):
                out.append(f"{sub.actor} {sub.label}: escaped {sub.error!r}")
            if isinstance(sub.error, durabilis.StorageUnavailable) and sub.runs:
                # StorageUnavailable means "nothing ran": once fn ran, the caller
                # gets its outcome, RetryExhausted (parked) or OutcomeUnrecorded.
                out.append(f"{sub.actor} {sub.label}: StorageUnavailable after fn ran")
            if (isinstance(sub.error, durabilis.OutcomeUnrecorded) and not sub.stalled
                    and not self.knobs.keepalive):  # (that seam defers at the first failure)
                # Faults here last one step; a lease outlasts them by far.
                out.append(f"{sub.actor} {sub.label}: gave up recording its outcome "
                           "while Redis answered")
        if not self.knobs.dedup:
            return out
        parked = self._dlq_records()
        return out + self._check_answers(parked) + self._check_refusals(parked) + (
            self._check_effects(parked) + self._check_settled(parked)
        )

    def _check_answers(self, parked: dict[str, list[dict[bytes, bytes]]]) -> list[str]:
        """Callers that got a result find it recorded; duplicates got one answer."""
        out: list[str] = []
        dlq_ids = {f.get(b"dlq_id", b"").decode() for fs in parked.values() for f in fs}
        answers: dict[str, set[str]] = defaultdict(set)
        lapsed = {k for k, _ in self.unrespected}
        for sub in self.submissions:
            if sub.key is None:
                continue
            if sub.outcome == "ok":
                # (a rotation: a stalled worker records its key, nobody having taken
                # it, while the operation ran under another: two answers, the stall's)
                aliases = self._aliases(sub.key)
                if len(aliases) == 1 or not aliases & lapsed:
                    answers[self._op(sub.key)].add(repr(sub.value))
                if not self._recorded(sub.key):
                    out.append(f"{sub.actor} got a result for {sub.key} but it is not recorded")
            error = sub.error
            if isinstance(error, durabilis.RetryExhausted) and error.dlq_id not in (
                    None, *dlq_ids, *self.purged):  # (settled, then purged by the operator)
                out.append(f"{sub.key}: RetryExhausted names {error.dlq_id}, not parked")
        out += [f"{key}: duplicates got different answers {sorted(seen)}"
                for key, seen in answers.items() if len(seen) > 1]
        return out

    def _check_refusals(self, parked: dict[str, list[dict[bytes, bytes]]]) -> list[str]:
        """A caller refused (or failed for good) without a fault: nothing ran or stays."""
        out: list[str] = []
        # A refused call that had taken over a dead owner's claim parks that owner's
        # operation (WORKER_LOST): allowed; anything else parked for it is not.
        claims = {f.get(b"meta:claim", b"").decode() for fs in parked.values() for f in fs
                  if f.get(b"meta:reason") != b"WORKER_LOST"}
        refusals = (durabilis.CircuitOpen, durabilis.OperationInProgress,
                    durabilis.errors.KeyReuseMismatch, durabilis.errors.InvalidPayload,
                    durabilis.errors.InvalidKey,
                    durabilis.ConfigError)
        for sub in self.submissions:
            if sub.faulted or sub.outcome != "error":
                continue
            what = f"{sub.actor} {sub.label} ({type(sub.error).__name__})"
            if isinstance(sub.error, refusals) and sub.runs:
                out.append(f"{what}: refused, yet its fn ran {sub.runs} time(s)")
            if isinstance(sub.error, (*refusals, OperationError, SimUserError)) and (
                    sub.nonces & claims):
                out.append(f"{what}: refused or failed for good, yet parked in the DLQ")
            if isinstance(sub.error, durabilis.ResultNotStored) and sub.key and (
                    not self._recorded(sub.key)):
                out.append(f"{what}: ran, yet not recorded as completed")
        return out

    def _check_effects(self, parked: dict[str, list[dict[bytes, bytes]]]) -> list[str]:
        """Nothing that ran is lost; fencing tokens of one key only increase."""
        out: list[str] = []
        last_run: dict[str, int] = {}  # per logical operation
        for ex in self.executions:
            op = self._op(ex.key)
            last_run[op] = max(last_run.get(op, -1), ex.start_step)
        for ex in self.executions:
            # A cancellation inside fn is answered to its caller (CancelledError)
            # and releases the claim, as fn raising would (docs/layer.md). An
            # effect followed by another run of the operation (a takeover told
            # ctx.recovered, a replay) is that run's to settle: the window by nature.
            if (not ex.effect or ex.cancelled or last_run[self._op(ex.key)] > ex.start_step
                    or (ex.key, ex.nonce) in self.unrespected):
                continue
            if not self._recorded(ex.key) and not any(
                    parked.get(k) for k in self._aliases(ex.key)):
                out.append(f"LOST: {ex.key} ran ({ex.actor}, token {ex.token}) but is neither "
                           "recorded nor parked")
        by_key: dict[str, list[Execution]] = defaultdict(list)
        for ex in self.executions:
            if ex.token and (ex.key, ex.nonce) not in self.unrespected:
                by_key[ex.key].append(ex)
        for key, runs in by_key.items():
            tokens = [int(ex.token) for ex in sorted(runs, key=lambda e: e.start_step)
                      if ex.token]
            if any(b < a for a, b in itertools.pairwise(tokens)):
                out.append(f"{key}: fencing tokens went backwards {tokens}")
        return out

    def _check_settled(self, parked: dict[str, list[dict[bytes, bytes]]]) -> list[str]:
        """A completed operation leaves no pending DLQ record behind (a replay
        after the dedup window would run it again). Fused runs only: on Cluster
        the settle is its own round trip after the record, and a worker that
        dies between the two leaves the record pending (docs/layer.md)."""
        if not self.knobs.fused:
            return []
        out: list[str] = []
        for key, entries in parked.items():  # (completed under any of its keys)
            if not key or not self._recorded(key):
                continue
            for dlq_id in {f.get(b"dlq_id", b"").decode() for f in entries}:
                status = self.raw.hget(self.store.keys.dlq("rec", dlq_id), "st")
                if status == b"pending":
                    out.append(f"{key}: completed, yet its DLQ record {dlq_id} is pending")
        return out

    def _check_batched_counts(self) -> list[str]:
        """Without faults (no crash, no lost reply), the counts batched in the
        processes reach the fleet's counters, each once: ``duplicates`` (only
        ever batched) equals what was batched, and ``succeeded`` too (only the
        record step's batch carries it, and no record step fails here)."""
        if self.knobs.fault_rate > 0:
            return []
        raw = self.raw.hgetall(self.store.keys.layer("stats"))
        stored = {k.decode(): int(v) for k, v in raw.items()}
        # A process that died lost what waited in it (a parent dead after a
        # fork, the only crash without faults): fewer, never more (a forked
        # child never sends its parent's counts).
        died = any(a.crashed for a in self.actors)
        return [
            f"counter {name}: {stored.get(name, 0)} in Redis, {self.batched[name]} batched"
            for name in ("duplicates", "succeeded")
            if stored.get(name, 0) > self.batched[name]
            or (stored.get(name, 0) != self.batched[name] and not died)
        ]

    def _check_budget(self) -> list[str]:
        """The fleet never grants more retries than the strictest setting in use
        allows (docs/retry.md, "Replicas that disagree"): at each granted retry,
        for every setting used within its window W before it, the retries granted
        in ``(t - W, t]`` (this one included) are at most ``ratio * calls + min``
        with the calls recorded in ``[t - W, t]``. Exact sliding windows of the
        true log (the script's bucket counting is conservative: a retry counts for
        at least W, a call for at most W), each call's server time bracketed by
        reads before and after it: a retry counts only if surely in the window,
        a call if possibly, a setting binds only if surely live."""
        out: list[str] = []
        log = self.budget_log
        for i, (lo, hi, _mode, _w, _r, _m, granted) in enumerate(log):
            if not granted:
                continue
            seen = log[:i + 1]
            for window, ratio_ppm, least in sorted({(e[3], e[4], e[5]) for e in seen
                                                     if e[0] > hi - e[3]}):
                retries = sum(1 for e in seen if e[6] and e[0] > hi - window)
                calls = sum(1 for e in seen if e[2] == "call" and e[1] >= lo - window)
                if retries * 1_000_000 > ratio_ppm * calls + least * 1_000_000:
                    out.append(
                        f"retry budget: retry #{i} at {lo}..{hi} ms granted although setting "
                        f"(ratio {ratio_ppm / 1e6}, min {least}, window {window} ms) allows "
                        f"{(ratio_ppm * calls) / 1e6 + least} with {calls} call(s); {retries} "
                        "retries in its window")
                    break
        return out

    def _check_nothing_stuck(self) -> list[str]:
        out: list[str] = []
        keys = self.store.keys
        index = keys.layer("inflight")
        members = self.raw.zrange(index, 0, -1)
        if members:
            out.append(f"in-flight index not empty after recovery: {members[:5]}")
        # Unfused runs: the birth index's buckets (read by name: a SCAN per seed
        # walks the shared server's whole keyspace).
        pipe = self.raw.pipeline(transaction=False)
        buckets = [keys.inflight_bucket(bucket_tag(i, _plans.SIM_BUCKETS))
                   for i in range(_plans.SIM_BUCKETS)]
        for bucket in buckets:
            pipe.zrange(bucket, 0, -1)
        for bucket, members in zip(buckets, pipe.execute(), strict=True):
            if members:
                out.append(f"birth index {bucket!r} not empty after recovery: {members[:5]}")
        for rkey in self.raw.scan_iter(match=keys.idem_pattern(), count=1000):
            if self.raw.type(rkey) == b"hash" and self.raw.hget(rkey, "s") == b"p":
                out.append(f"claim {rkey!r} still in progress after recovery")
        out += self._held_probes()
        return out

    def _held_probes(self) -> list[str]:
        """Probe slots still held by plans that ended unfaulted (read before each
        forced close too: closing a breaker deletes its probe slots)."""
        out: list[str] = []
        if self.knobs.breaker:
            for probe in self.raw.hkeys(self.store.keys.breaker_probes(DEP)):
                nonce = probe.decode().split(".", 1)[0]
                owner = self.probe_owner.get(nonce)
                actor = next((a for a in self.actors if owner and a.name == owner[0]), None)
                if owner is None or actor is None:
                    continue  # not a layer probe (none are taken otherwise)
                if not actor.crashed and owner[1] not in actor.faulted_plans:
                    out.append(f"probe slot {probe!r} of {owner} held after its plan ended")
        return out

    def close(self) -> None:
        pipe = self.raw.pipeline(transaction=False)
        for rkey in self.raw.scan_iter(match=f"{self.namespace}:*", count=1000):
            pipe.unlink(rkey)
        pipe.execute()
        self.threads.end()
        self.graveyard.clear()


@dataclass
class _Shared:
    raw: Any
    store: durabilis.Store
    clock_key: str


_SHARED: dict[str, _Shared] = {}


def _shared(redis_url: str) -> _Shared:
    shared = _SHARED.get(redis_url)
    if shared is None:
        store = durabilis.connect(redis_url, namespace="sim")
        clock_key = "sim:{clock}"
        offset_server_clock(store, clock_key)
        shared = _SHARED[redis_url] = _Shared(redis.Redis.from_url(redis_url), store, clock_key)
    return shared


def _unavailable(why: str, n: int) -> StorageUnavailable:
    exc = StorageUnavailable(f"simulated: {why}")
    exc.partial = Replies([None] * n, "?" * n)
    return exc


@contextmanager
def _locks_copied_unheld() -> Iterator[None]:
    """``copy.deepcopy`` copies a lock as a lock nobody holds (as fork copies one
    that no thread held: none is held between the simulator's steps)."""
    kinds = {type(threading.Lock()): threading.Lock, type(threading.RLock()): threading.RLock}
    saved = {kind: copyreg.dispatch_table.get(kind) for kind in kinds}
    def unheld(make: Callable[[], Any]) -> Callable[[Any], tuple[Any, tuple[()]]]:
        return lambda _lock: (make, ())

    for kind, make in kinds.items():
        copyreg.dispatch_table[kind] = unheld(make)
    try:
        yield
    finally:
        for kind, old in saved.items():
            if old is None:
                copyreg.dispatch_table.pop(kind, None)
            else:
                copyreg.dispatch_table[kind] = old


@contextmanager
def _quiet_logs() -> Iterator[None]:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
        cache_logger_on_first_use=False,
    )
    try:
        yield
    finally:
        structlog.reset_defaults()


@contextmanager
def _seeded(seed: int, rng: random.Random) -> Iterator[None]:
    """Everything random in the library draws from the seed (nonces, jitter)."""
    state = random.getstate()
    original = _plans_base.nonce  # (the plans draw every claim nonce from it)
    random.seed(seed)
    _plans_base.nonce = lambda: f"{rng.getrandbits(64):016x}"
    try:
        yield
    finally:
        _plans_base.nonce = original
        random.setstate(state)


def run_seed(seed: int, redis_url: str) -> Simulation:
    """Run one seed and check it; raises :class:`Counterexample`."""
    sim = Simulation(seed, redis_url)
    try:
        sim.run()
        sim.check()
        return sim
    finally:
        sim.close()
