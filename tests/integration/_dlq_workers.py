"""Worker processes for the cross-process DLQ tests (spawned, importable)."""

from __future__ import annotations

import time
from typing import Any

import durabilis
from durabilis.dlq import DeadLetterQueue, DlqConfig, DlqRecord
from tests.support.backends import raw_client


def calls_key(namespace: str) -> str:
    """Where the tests count handler invocations (a test key, not a durabilis one)."""
    return f"{namespace}:test:calls"


def done_key(namespace: str) -> str:
    """Where the tests count handler completions."""
    return f"{namespace}:test:done"


def replay_all(
    url: str, namespace: str, claim_ttl: float, ready: Any, go: Any, out: Any, me: int
) -> None:
    """Wait for the start signal, then run ``replay_pending`` over the whole queue."""
    store = durabilis.connect(url, namespace=namespace)
    counter = raw_client(url)
    dlq = DeadLetterQueue(
        store, DlqConfig(claim_ttl_seconds=claim_ttl), replayer_id=f"replayer-{me}"
    )

    def handler(record: DlqRecord) -> None:
        counter.hincrby(calls_key(namespace), record.dlq_id, 1)

    ready.put(me)
    go.wait(timeout=30)
    summary = dlq.replay_pending(handler)
    out.put((me, summary.replayed, summary.failed, summary.skipped, summary.lost))
    store.close()
    counter.close()


def replay_and_hang_on(url: str, namespace: str, claim_ttl: float, hang_on: str) -> None:
    """Replay everything; on ``hang_on`` start the handler, then hang (to be SIGKILLed)."""
    store = durabilis.connect(url, namespace=namespace)
    counter = raw_client(url)
    dlq = DeadLetterQueue(
        store, DlqConfig(claim_ttl_seconds=claim_ttl), replayer_id="doomed-replayer"
    )

    def handler(record: DlqRecord) -> None:
        counter.hincrby(calls_key(namespace), record.dlq_id, 1)
        if record.dlq_id == hang_on:
            counter.set(f"{namespace}:test:hanging", record.dlq_id)
            time.sleep(60)
        counter.hincrby(done_key(namespace), record.dlq_id, 1)

    dlq.replay_pending(handler)
