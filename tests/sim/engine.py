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
  unstorable result, or its worker dying inside it;
- an operator forcing the breaker open or closed;
- time passing (the server clock is the simulation's, through
  ``durabilis.testing.offset_server_clock``): small steps, and jumps past leases
  during which live actors' keep-alives renew, unless an actor is *stalled*
  (then its lease may lapse: the one case where two workers may legitimately
  run one operation at once).

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
import itertools
import logging
import random
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
)
from durabilis._keys import bucket_tag
from durabilis._scripts import Replies, ScriptCall, unfuse
from durabilis._steps import (
    IO,
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
from durabilis.dlq import DlqConfig
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext, _plans
from durabilis.testing import offset_server_clock

LEASE = 10.0  # virtual seconds
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
        self.now = 0.0
        self.step_no = 0
        self.trace: list[str] = []
        self.violations: list[str] = []
        self.executions: list[Execution] = []
        self.submissions: list[Submission] = []
        self.unrespected: set[tuple[str, str]] = set()  # (key, claim nonce) whose lease lapsed
        self.probe_owner: dict[str, tuple[str, int]] = {}  # probe nonce -> (actor, plan)
        self.graveyard: list[Any] = []  # abandoned plans (kept: no GeneratorExit cleanup)
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
        self.observer = durabilis.CheckpointManager(self.store, self.config.checkpoint)
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

    def _layer(self, name: str) -> DurabilityLayer:
        layer = DurabilityLayer(self.store, self.config, replica_id=name)
        layer._core.clock = lambda: self.now
        layer._core.on_wait = None  # (its keep-alive is simulated: _flush at its ticks)
        core = layer._core
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
        return layer

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
        for _ in range(rng.randint(0, 2)):
            replayer.queue.append(lambda r=replayer: r.layer.dlq._ops.replay_pending_steps(
                None, 3, None, r.layer._core.replay_plan(self._fn(r))))
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
        except durabilis.CheckpointNotFound:
            return False
        return True

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
            return layer._core.execute_plan(req, self._fn(actor))

        return start

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
            limit = self.step_no + 2000
            while self.step_no < limit:
                if not self._tick(events=False):
                    break
            else:
                self.violations.append("stuck: live actors did not finish (2000 steps)")
            for a in self.actors:  # the survivors close; the dead lost what waited in them
                if not a.crashed:
                    self._flush(a)
            self._advance(LEASE * 2.5)
            self._recover_all()

    def _tick(self, *, events: bool = True) -> bool:
        self.step_no += 1
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
                    replies = self.store.run_many(a.layer._core.renew_calls(held))
                    back = a.layer._core.reindex_calls(held, replies)
                    if back:
                        self.store.run_many(back)
                    for item in a.leases.deferred():  # outcomes the keep-alive still sends
                        replies = self.store.run_step(item.step.calls, item.step.gates)
                        a.layer._core.deferred_sent(a.leases, item, replies)
                        self.log(f"{a.name} keep-alive records a deferred outcome")
                    self._flush(a)
        self.log(f"time -> {self.now:.3f}")

    def _flush(self, actor: Actor) -> None:
        """What the keep-alive's tick (or stats(), close()) sends of the counts and
        the index removals waiting in a process (Cluster: _LayerCore._leave)."""
        drive(actor.layer._core.flush_plan(), self.store)

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
                error, (DurabilisError, asyncio.CancelledError, SimUserError)):
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
        if isinstance(sub.error, (durabilis.LeaseLost, durabilis.OutcomeUnrecorded)):
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
        if sub.outcome == "ok" and state != b"d":
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
                    replies[i] = self.store.run(calls[i])
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
                    replies[i] = self.store.run(calls[i])
                if applies and i != lost and self.rng.random() < 0.5:
                    refused_now = bool(gates and i in gates and gates[i](replies[i]))
                    status[i] = "r" if refused_now else "c"
                else:
                    replies[i], status[i] = None, "?"
            break
        return Replies(replies, "".join(status)), None

    def _io(self, actor: Actor, step: Any) -> None:  # noqa: PLR0912  (a branch per fault)
        assert actor.run is not None
        calls = list(step.calls) if type(step) is IO else [] if type(step) is Command else [step]
        gates = step.gates if type(step) is IO else None
        self._note_probes(actor, calls)
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
                reply = self.store.run(step)
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
            rkey = self.store.keys.idem(key)
            if self.raw.hget(rkey, "s") == b"d" and (key, nonce) not in self.unrespected:
                self.violations.append(f"{actor.name} runs {key} although it has a record")
            for other in self.actors:
                ex = other.inside
                if (other is not actor and ex is not None and ex.key == key
                        and (key, ex.nonce) not in self.unrespected
                        and (key, nonce) not in self.unrespected):
                    self.violations.append(
                        f"{actor.name} and {other.name} inside fn for {key} at once")
            # An earlier run's effect (or a run interrupted or killed inside fn)
            # is never hidden from the next run: it is told (ctx.recovered, or a
            # replay), with the same key and a higher token.
            # (A worker paused past its lease runs on a claim taken from it: the
            # stale run the token fences, not a delivery.)
            running = {id(a.inside) for a in self.actors if a.inside is not None}
            stale = (key, nonce) in self.unrespected
            for ex in self.executions:
                if (ex.key == key and ex.effect and id(ex) not in running and not stale
                        and (key, ex.nonce) not in self.unrespected
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
        allowed = (DurabilisError, OperationError, SimUserError, asyncio.CancelledError)
        for sub in self.submissions:
            if sub.outcome == "error" and not isinstance(sub.error, allowed):
                out.append(f"{sub.actor} {sub.label}: escaped {sub.error!r}")
            if isinstance(sub.error, durabilis.StorageUnavailable) and sub.runs:
                # StorageUnavailable means "nothing ran": once fn ran, the caller
                # gets its outcome, RetryExhausted (parked) or OutcomeUnrecorded.
                out.append(f"{sub.actor} {sub.label}: StorageUnavailable after fn ran")
            if isinstance(sub.error, durabilis.OutcomeUnrecorded) and not sub.stalled:
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
        for sub in self.submissions:
            if sub.key is None:
                continue
            state = self.raw.hget(self.store.keys.idem(sub.key), "s")
            if sub.outcome == "ok":
                answers[sub.key].add(repr(sub.value))
                if state != b"d":
                    out.append(f"{sub.actor} got a result for {sub.key} but it is not recorded")
            error = sub.error
            if isinstance(error, durabilis.RetryExhausted) and error.dlq_id not in (
                    None, *dlq_ids):
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
                    durabilis.KeyReuseMismatch, durabilis.InvalidPayload, durabilis.InvalidKey,
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
                    self.raw.hget(self.store.keys.idem(sub.key), "s") != b"d"):
                out.append(f"{what}: ran, yet not recorded as completed")
        return out

    def _check_effects(self, parked: dict[str, list[dict[bytes, bytes]]]) -> list[str]:
        """Nothing that ran is lost; fencing tokens of one key only increase."""
        out: list[str] = []
        last_run: dict[str, int] = {}
        for ex in self.executions:
            last_run[ex.key] = max(last_run.get(ex.key, -1), ex.start_step)
        for ex in self.executions:
            # A cancellation inside fn is answered to its caller (CancelledError)
            # and releases the claim, as fn raising would (docs/layer.md). An
            # effect followed by another run of the operation (a takeover told
            # ctx.recovered, a replay) is that run's to settle: the window by nature.
            if (not ex.effect or ex.cancelled or last_run[ex.key] > ex.start_step
                    or (ex.key, ex.nonce) in self.unrespected):
                continue
            state = self.raw.hget(self.store.keys.idem(ex.key), "s")
            if state != b"d" and not parked.get(ex.key):
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
        for key, entries in parked.items():
            if not key or self.raw.hget(self.store.keys.idem(key), "s") != b"d":
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
        if self.knobs.fault_rate > 0 or any(a.crashed for a in self.actors):
            return []
        raw = self.raw.hgetall(self.store.keys.layer("stats"))
        stored = {k.decode(): int(v) for k, v in raw.items()}
        return [
            f"counter {name}: {stored.get(name, 0)} in Redis, {self.batched[name]} batched"
            for name in ("duplicates", "succeeded")
            if stored.get(name, 0) != self.batched[name]
        ]

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
        if self.knobs.breaker:
            for probe in self.raw.hkeys(keys.breaker_probes(DEP)):
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
    original = _plans._nonce
    random.seed(seed)
    _plans._nonce = lambda: f"{rng.getrandbits(64):016x}"
    try:
        yield
    finally:
        _plans._nonce = original
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
