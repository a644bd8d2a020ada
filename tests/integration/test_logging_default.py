"""A library that does not talk unless asked: with logging unconfigured, durable
calls print nothing at INFO; warnings still reach stderr; one switch turns INFO on."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKLOAD = textwrap.dedent('''
    import logging, sys
    import durabilis
    from durabilis import CircuitBreakerConfig, IdempotencyConfig, OperationError, RetryPolicy
    from durabilis.layer import DurabilityConfig, DurabilityLayer
    from durabilis.testing import instant_retries

    if sys.argv[3] == "info":  # what docs/production.md tells an application to do
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)

    store = durabilis.connect(sys.argv[1], namespace=sys.argv[2])
    layer = DurabilityLayer(store, DurabilityConfig(
        retry_policies=(RetryPolicy("job", 2, 1, 2, retryable_errors=("NETWORK_TIMEOUT",)),),
    ))
    for i in range(300):  # each saves a checkpoint: an INFO event
        layer.execute("a1", "job", {"n": i}, lambda ctx: i, task_id=f"t{i}", phase="send")

    def down(ctx):
        raise OperationError("NETWORK_TIMEOUT", "upstream timed out")

    with instant_retries():  # one parked (DLQ enqueue: INFO; retry attempt: WARNING)
        try:
            layer.execute("a1", "job", {"n": "parked"}, down)
        except durabilis.RetryExhausted:
            pass
    summary = layer.replay_pending(lambda ctx: "ok")  # replayed: INFO
    assert summary.replayed == 1, summary
    layer.close()
    store.close()
''')

INFO_EVENTS = ("durability_checkpoint_saved", "durability_dlq_enqueued",
               "durability_dlq_replayed")


def run(redis_url: str, namespace: str, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WORKLOAD, redis_url, namespace, mode],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )


def test_300_durable_calls_with_logging_unconfigured_print_nothing_at_info(
    redis_url: str, namespace: str
) -> None:
    done = run(redis_url, namespace, "default")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # a library never writes to stdout
    for event in INFO_EVENTS:
        assert event not in done.stderr, event
    # Warnings are still seen (Python's last-resort handler, on stderr).
    assert "durability_retry_attempt" in done.stderr
    assert len(done.stderr.splitlines()) <= 5, done.stderr


def test_info_events_appear_once_the_application_asks(redis_url: str, namespace: str) -> None:
    done = run(redis_url, namespace, "info")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    saved = [line for line in done.stderr.splitlines() if "durability_checkpoint_saved" in line]
    assert len(saved) == 300
    assert saved[0].startswith("INFO:durabilis:durability_checkpoint_saved checkpoint_id=")
    for event in INFO_EVENTS[1:]:
        assert event in done.stderr, event
