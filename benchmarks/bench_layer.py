"""The durable call: the full layer's happy path, sync and async, alone and under contention.

Workloads (factories for :mod:`benchmarks._harness`):

- ``durable_sync``: ``DurabilityLayer.execute(agent, "memory_write", payload, fn)``,
  ``fn`` a no-op returning a small dict; every call a new payload, so a new
  idempotency key (claim, breaker admission and in-flight index in one round
  trip; record, breaker report and index in a second). ``memory_write`` is
  guarded by the ``memory_service`` breaker: every process of a run shares it.
- ``durable_sync_checkpoint``: the same with ``task_id``/``phase``: the result
  is also saved as a checkpoint in the second round trip.
- ``durable_async``: ``AsyncDurabilityLayer.execute``, one call in flight.
- ``durable_async_x16``, ``durable_async_x64``: the same with 16 / 64 calls in
  flight in one event loop (their scripts auto-pipelined, standalone).
- ``durable_duplicate``: a call whose operation already completed (a retry of
  a finished write): the stored result comes back, ``fn`` does not run.
- ``durable_scripts_raw``: the floor of the durable call's design: the very two
  scripts a durable call sends (the fused claim, then the record, captured from
  a real call and sent for a new key each time) through the store's own
  ``Store.run``, with no layer around them: key derivation, plan, envelopes,
  reply decoding, breaker and counters all left out (1 process and N). The durable call over
  this figure is the share of its rate the layer's own Python costs.
- ``durable_contention``: every process walks the SAME sequence of payloads, so
  the processes race for the same keys: one wins each key ("new"), the others
  get its stored result ("duplicate") or, while the winner runs,
  ``OperationInProgress`` ("in_progress").

The payload is a small JSON-compatible dict (about 150 bytes), hashed into the
key as the layer does by default.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import durabilis
from benchmarks._harness import Workload
from durabilis import DurabilityLayer, OperationInProgress
from durabilis._scripts import ScriptCall, fuse
from durabilis.layer import AsyncDurabilityLayer

NAMESPACE = "bench"
TEXT = "x" * 100


def payload(tag: str, index: int, i: int) -> dict[str, Any]:
    """The operation's payload (distinct per tag, process and call)."""
    return {"page": f"Page-{i}", "text": TEXT, "tag": tag, "w": index, "i": i}


def _result(ctx: durabilis.OperationContext) -> dict[str, Any]:
    return {"ok": True, "attempt": ctx.attempt}


async def _aresult(ctx: durabilis.OperationContext) -> dict[str, Any]:
    return {"ok": True, "attempt": ctx.attempt}


class DurableSync(Workload):
    def __init__(self, url: str, index: int, *, checkpoint: bool = False) -> None:
        self.store = durabilis.connect(url, namespace=NAMESPACE)
        self.layer = DurabilityLayer(self.store)
        self.index = index
        self.checkpoint = checkpoint
        self.tag = "-"
        self.counter = itertools.count()

    def start(self, tag: str) -> None:
        self.tag = tag
        self.counter = itertools.count()

    def call(self) -> object:
        i = next(self.counter)
        if self.checkpoint:
            self.layer.execute(
                "agent-1", "memory_write", payload(self.tag, self.index, i), _result,
                task_id=f"task-{self.tag}-{self.index}-{i}", phase="write",
            )
        else:
            self.layer.execute("agent-1", "memory_write", payload(self.tag, self.index, i), _result)
        return None

    def close(self) -> None:
        self.layer.close()
        self.store.close()


class DurableAsync(Workload):
    is_async = True

    def __init__(self, url: str, index: int, *, concurrency: int = 1) -> None:
        self.store = durabilis.aio.connect(url, namespace=NAMESPACE)
        self.layer = AsyncDurabilityLayer(self.store)
        self.index = index
        self.concurrency = concurrency
        self.tag = "-"
        self.counter = itertools.count()

    def start(self, tag: str) -> None:
        self.tag = tag
        self.counter = itertools.count()

    async def acall(self) -> object:
        i = next(self.counter)
        await self.layer.execute(
            "agent-1", "memory_write", payload(self.tag, self.index, i), _aresult
        )
        return None

    async def aclose(self) -> None:
        await self.layer.close()
        await self.store.close()


class DurableContention(DurableSync):
    """Every process walks the same payloads: most calls are duplicates or in progress."""

    def call(self) -> object:
        i = next(self.counter)
        ran = False

        def fn(ctx: durabilis.OperationContext) -> dict[str, Any]:
            nonlocal ran
            ran = True
            return _result(ctx)

        try:
            self.layer.execute("agent-1", "memory_write", payload(self.tag, -1, i), fn)
        except OperationInProgress:
            return "in_progress"
        return "new" if ran else "duplicate"


class DurableDuplicate(Workload):
    """A durable call whose operation already completed: answered from the stored result."""

    def __init__(self, url: str, index: int) -> None:
        self.inner = DurableSync(url, index)

    def start(self, tag: str) -> None:
        self.inner.start(tag)
        self.inner.call()  # the one real run; every later call is its duplicate

    def call(self) -> object:
        self.inner.counter = itertools.count()  # the same payload again
        return self.inner.call()

    def close(self) -> None:
        self.inner.close()


class DurableScriptsRaw(Workload):
    """The durable call's two scripts, sent bare: what the layer costs at least.

    One real durable call (in a namespace of its own, so that no layer of the
    run ever recovers the in-flight entries this workload leaves) is captured
    at the store's steps: its fused claim step and its record. Each timed call sends
    both again for a new key (the captured key's hash replaced by one of this
    workload's own), the record with the token the claim returned, through
    ``Store.run``. The in-flight entries it adds are never removed (the layer's
    batched removal, once a second, is left out with the rest of the layer).
    """

    def __init__(self, url: str, index: int) -> None:
        self.store = durabilis.connect(url, namespace=f"{NAMESPACE}-raw")
        captured: list[ScriptCall] = []
        run_step = self.store.run_step

        def capture(calls: Any, gates: Any = None, waves: Any = None) -> Any:
            # (a step of several calls is sent as their fused script: that one)
            captured.append(calls[0] if len(calls) == 1 else fuse(
                calls, [bool(gates and i in gates) for i in range(len(calls))]))
            return run_step(calls, gates, waves)

        layer = DurabilityLayer(self.store)
        # A first call warms the breaker's cached admission (as in any timed
        # durable call): the captured one sends no breaker script.
        once = uuid.uuid4().hex  # every workload built captures a new key of its own
        layer.execute("agent-1", "memory_write", payload(f"warm-up-{once}", index, 0), _result)
        self.store.run_step = capture  # type: ignore[method-assign]
        try:
            layer.execute(
                "agent-1", "memory_write", payload(f"template-{once}", index, 0), _result
            )
        finally:
            del self.store.run_step
            layer.close()
        claims = [c for c in captured if "idem_claim" in c.name]
        records = [c for c in captured if c.name == "idem_record"]
        if len(claims) != 1 or len(records) != 1:
            raise RuntimeError(f"expected one claim and one record, captured {captured!r}")
        self.claim, self.record = claims[0], records[0]
        key = self.record.keys[0]
        self.hash = key[key.rindex(":") + 1:key.rindex("}")]
        self.once = once
        self.tag = "-"
        self.counter = itertools.count()

    def start(self, tag: str) -> None:
        self.tag = tag
        self.counter = itertools.count()

    def _fresh(self, call: ScriptCall, new: str, token: Any = None) -> ScriptCall:
        def swap(v: Any) -> Any:
            return v.replace(self.hash, new) if isinstance(v, str) else v

        args = [swap(a) for a in call.args]
        if token is not None:
            args[1] = token  # the record's ARGV[2]: the claim's fencing token
        return ScriptCall(call.name, [swap(k) for k in call.keys], args)

    def call(self) -> object:
        new = f"{self.once}-{self.tag}-{next(self.counter)}"
        reply = self.store.run(self._fresh(self.claim, new))
        claimed = reply[-1]  # the fused step's last reply is the claim's {"new", token, ...}
        if claimed[0] != b"new":
            raise RuntimeError(f"the claim was not new: {claimed!r}")
        token = claimed[1]
        done = self.store.run(self._fresh(self.record, new, token))
        if done[0] != b"ok":
            raise RuntimeError(f"the record was refused: {done!r}")
        return None

    def close(self) -> None:
        self.store.close()


def durable_scripts_raw(url: str, index: int) -> Workload:
    return DurableScriptsRaw(url, index)


def durable_sync(url: str, index: int) -> Workload:
    return DurableSync(url, index)


def durable_sync_checkpoint(url: str, index: int) -> Workload:
    return DurableSync(url, index, checkpoint=True)


def durable_async(url: str, index: int) -> Workload:
    return DurableAsync(url, index)


def durable_async_x16(url: str, index: int) -> Workload:
    return DurableAsync(url, index, concurrency=16)


def durable_async_x64(url: str, index: int) -> Workload:
    return DurableAsync(url, index, concurrency=64)


def durable_contention(url: str, index: int) -> Workload:
    return DurableContention(url, index)


def durable_duplicate(url: str, index: int) -> Workload:
    return DurableDuplicate(url, index)


SINGLE = {
    "durable call (sync)": "benchmarks.bench_layer:durable_sync",
    "durable call's 2 scripts, no layer (sync)": "benchmarks.bench_layer:durable_scripts_raw",
    "durable call + checkpoint (sync)": "benchmarks.bench_layer:durable_sync_checkpoint",
    "durable call (async, 1 in flight)": "benchmarks.bench_layer:durable_async",
    "durable call (async, 16 in flight)": "benchmarks.bench_layer:durable_async_x16",
    "durable call (async, 64 in flight)": "benchmarks.bench_layer:durable_async_x64",
    "durable call, completed duplicate (sync)": "benchmarks.bench_layer:durable_duplicate",
}
"""In-process figures (1 process)."""

PROCESSES = {
    "durable call (sync)": "benchmarks.bench_layer:durable_sync",
    "durable call's 2 scripts, no layer (sync)": "benchmarks.bench_layer:durable_scripts_raw",
    "durable call (async)": "benchmarks.bench_layer:durable_async",
    "contention: same keys (sync)": "benchmarks.bench_layer:durable_contention",
}
"""Multi-process figures (1..8 processes sharing one breaker)."""
