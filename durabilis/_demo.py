"""`durabilis demo`: several worker processes, one shared view in Redis.

The demo runs on the embedded default (no server to install). Every number
it prints is read back from Redis, none is computed on the side.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
import uuid
from typing import Any

import durabilis


def _worker(url: str | None, namespace: str, operations: int, me: int) -> None:
    store = durabilis.connect(url, namespace=namespace)
    guard = durabilis.IdempotencyGuard(store)
    counters = store.keys.layer("demo", "counters")
    for i in range(operations):
        # Every worker is handed the same edits (a redelivery storm): each must land once.
        key = durabilis.IdempotencyKey.new("demo-agent", "wiki_write", {"page": i, "text": "v1"})
        claim = guard.check_and_record(key, placeholder={"by": me})
        if isinstance(claim, durabilis.New):
            store.client.hincrby(counters, "edits_applied", 1)
            guard.record(key, {"page": i, "applied_by": me}, token=claim.token)
        else:
            store.client.hincrby(counters, "duplicates_suppressed", 1)
        store.client.hincrby(counters, "submissions", 1)
    store.close()


def run(url: str | None = None, *, workers: int = 4, operations: int = 25) -> int:
    """Run the demo; returns the process exit code (0 when every edit landed once)."""
    namespace = f"demo-{uuid.uuid4().hex[:8]}"
    store = durabilis.connect(url, namespace=namespace)
    print(f"durabilis demo: {workers} worker processes, {operations} edits each, "
          f"store {store.url} namespace {namespace}")
    started = time.monotonic()
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_worker, args=(url, namespace, operations, i)) for i in range(workers)
    ]
    for p in procs:
        p.start()
    counters = store.keys.layer("demo", "counters")
    while any(p.is_alive() for p in procs):
        done = int(store.client.hget(counters, "submissions") or 0)
        sys.stdout.write(f"\r  submissions {done}/{workers * operations}")
        sys.stdout.flush()
        time.sleep(0.1)
    for p in procs:
        p.join()
    read: dict[str, Any] = {
        k.decode(): int(v) for k, v in store.client.hgetall(counters).items()
    }
    records = durabilis.IdempotencyGuard(store).record_count()
    print(f"\r  submissions {read.get('submissions', 0)}/{workers * operations}")
    print("report (read back from Redis):")
    print(f"  edits applied          {read.get('edits_applied', 0)}")
    print(f"  duplicates suppressed  {read.get('duplicates_suppressed', 0)}")
    print(f"  idempotency records    {records}")
    print(f"  took                   {time.monotonic() - started:.1f}s")
    store.close()
    ok = read.get("edits_applied") == operations == records and all(p.exitcode == 0 for p in procs)
    print("OK: every edit applied exactly once" if ok else "FAILED: an edit was lost or doubled")
    return 0 if ok else 1
