"""The fleet's processes of the browser tests, run as ``python -m tests.browser._worker``:

- ``replay URL NAMESPACE``: a gateway replica that has ``job``'s fn and runs the
  layer's ``replay_requeued`` loop (what ``OrphanRecovery(requeue_handlers=...)``
  schedules); prints ``ready``, then ``<outcome> <id>`` per record it replayed,
  until stdin closes or SIGTERM, then ``idle passes N`` (passes since the last;
  also kept at ``<ns>:test-worker-idle``);
- ``hold URL NAMESPACE``: an operation in flight (its fn waits for stdin to close;
  the keep-alive renews its lease meanwhile); prints ``ready`` inside the fn;
- ``die URL NAMESPACE``: an operation with a 1 s lease whose fn prints ``ready``
  and hangs: the test SIGKILLs it, leaving an orphan for recovery.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import durabilis
from durabilis.layer import DurabilityLayer, OperationContext
from tests.browser._support import console_config, effect_fn, idle_key


def replay(url: str, namespace: str) -> None:
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, console_config(), replica_id="replay-worker")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    handlers = {"job": effect_fn(url, namespace)}

    idle = [0]  # passes since the last record replayed

    def done(result: Any) -> None:
        idle[0] = -1
        print(f"{result.outcome.value} {result.dlq_id}", flush=True)

    print("ready", flush=True)
    while not stop.wait(0.05):
        layer.replay_requeued(handlers, on_result=done)
        idle[0] += 1
        store.client.set(idle_key(namespace), idle[0])  # (the test waits on it)
    print(f"idle passes {idle[0]}", flush=True)
    layer.close()
    store.close()


def hold(url: str, namespace: str, lease: float) -> None:
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, console_config(lease=lease), replica_id=f"hold-{lease}")

    def wait_for_stdin(ctx: OperationContext) -> str:
        print("ready", flush=True)
        sys.stdin.read()
        return "held"

    layer.execute(f"agent-{'hold' if lease > 1 else 'dies'}", "job",
                  {"page": 100 if lease > 1 else 101}, wait_for_stdin)
    layer.close()
    store.close()


if __name__ == "__main__":
    role, url, namespace = sys.argv[1:4]
    if role == "replay":
        replay(url, namespace)
    elif role == "hold":
        hold(url, namespace, 30)
    elif role == "die":
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        hold(url, namespace, 1)
        time.sleep(3600)  # (never reached: SIGKILLed inside the fn)
    else:
        raise SystemExit(f"unknown role {role!r}")
