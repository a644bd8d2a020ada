"""Worker processes of the interruption and fork tests (``test_layer_interrupted.py``,
``test_fork.py``): each keeps what it saw in Redis, never in the process (which
is killed)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
import warnings
from typing import Any

import durabilis
from durabilis.layer import DurabilityLayer, OperationContext
from tests.integration._layer_support import fast_config
from tests.support.backends import raw_client


def sigterm_inside_fn(url: str, namespace: str, payload: Any, marks: str) -> None:
    """A worker whose SIGTERM handler exits (a gateway's shutdown): it runs an
    operation whose effect happens, and hangs inside ``fn`` until SIGTERM."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    raw = raw_client(url)
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, fast_config(lease=5, dependencies={}))

    def fn(ctx: OperationContext) -> str:
        raw.rpush(marks, f"{ctx.idempotency_key}|{ctx.token}")  # the effect
        time.sleep(120)  # SIGTERM ends it here
        return "never"

    layer.execute("a1", "job", payload, fn)


# --- fork ------------------------------------------------------------------------------


def _forked_child(layer: DurabilityLayer, url: str, marks: str) -> None:
    """The forked child: one durable call of its own on the inherited layer,
    whose ``fn`` holds its claim (its keep-alive runs) until the child is killed."""
    raw = raw_client(url)

    def fn(ctx: OperationContext) -> str:
        raw.rpush(marks, f"child|{os.getpid()}")
        time.sleep(120)
        return "never"

    layer.execute("a1", "job", {"who": "child"}, fn)


def parent_that_forks_inside_fn(url: str, namespace: str, lease: float, marks: str) -> None:
    """Holds an in-flight claim (keep-alive running) and, inside its ``fn``,
    forks a child (``fork`` context) that makes a durable call; hangs until killed."""
    raw = raw_client(url)
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, fast_config(lease=lease, dependencies={}))

    def fn(ctx: OperationContext) -> str:
        raw.rpush(marks, f"parent|{ctx.idempotency_key}")
        # The keep-alive has renewed this claim at least once: it is running.
        deadline = time.monotonic() + 30
        key = layer.store.keys.idem(ctx.idempotency_key)
        first = raw.hget(key, "le")
        while raw.hget(key, "le") == first and time.monotonic() < deadline:
            time.sleep(0.02)
        child = multiprocessing.get_context("fork").Process(
            target=_forked_child, args=(layer, url, marks), daemon=False
        )
        with warnings.catch_warnings():  # (3.12+ warns of fork() with threads running)
            warnings.simplefilter("ignore", DeprecationWarning)
            child.start()
        time.sleep(120)
        return "never"

    layer.execute("a1", "job", {"who": "parent"}, fn)


def flush_in_child(layer: DurabilityLayer) -> None:
    """A forked child that sends what waits in its process (``stats()`` does)."""
    layer.stats()


def async_store_in_child(
    store: durabilis.aio.Store, fresh_url: str, namespace: str, marks: str
) -> None:
    """A forked child: the parent's asyncio store is refused; one of its own works."""
    import asyncio

    raw = raw_client(fresh_url)

    async def main() -> None:
        try:
            await store.ping()
        except durabilis.errors.WrongEventLoop as exc:
            raw.rpush(marks, f"refused|{exc}")
        mine = durabilis.aio.connect(fresh_url, namespace=namespace)
        raw.rpush(marks, f"own|{await mine.ping()}")
        await mine.close()

    asyncio.run(main())
