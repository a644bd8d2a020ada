"""What the browser tests and ``scripts/screenshots.py`` share: the fleet config,
the namespace filler, the console and worker subprocesses, the Chromium finder.

Everything here goes through the library's public API (the layer, its DLQ,
breakers, checkpoints and ``ConfigSync``) and real processes: the console is
``durabilis web`` run as a subprocess (uvicorn on a free loopback port), the
worker that replays a requeued record is another one (``tests/browser/_worker.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import durabilis
from durabilis import CircuitBreakerConfig, OperationError, RetryExhausted, RetryPolicy
from durabilis.config import ConfigSync, parse_config
from durabilis.layer import DurabilityConfig, DurabilityLayer, OperationContext
from durabilis.testing import free_port

ROOT = Path(__file__).resolve().parents[2]

CHROMIUM_HINT = (
    "chromium not found: the browser tests of the web console (tests/browser/) need "
    "Debian's chromium. Install it with `sudo apt-get install -y chromium` "
    "(scripts/test.sh does it when it is missing), or point DURABILIS_CHROMIUM at a "
    "Chromium/Chrome binary."
)

# The strings a hostile caller could get into a record: markup that would run if
# the console ever wrote it unescaped (each sets ``window.__xss``), terminal
# control characters, and a 10 KB field.
SCRIPT_TAG = "<script>window.__xss='script'</script>"
IMG_TAG = "<img src=x onerror=\"window.__xss='img'\">"
CONTROL = "bell\x07 escape\x1b[31m nul\x00 end"
BIG = "10KB-start " + "x" * 10_240 + " 10KB-end"
HOSTILE_ERROR = f"{SCRIPT_TAG}{IMG_TAG} upstream said {CONTROL}"
HOSTILE_AGENT = "<b>agent-evil</b>"
HOSTILE_TYPE = "<svg onload=\"window.__xss='type'\">"

BULK_RECORDS = 55  # send_email records, enough for more than one page of the DLQ list
EFFECTS = "test-effects:{fx}"  # <ns>:test-effects:{fx}: field page -> runs of `job`'s effect


def effects_key(namespace: str) -> str:
    return f"{namespace}:{EFFECTS}"


def idle_key(namespace: str) -> str:
    """The replay worker's passes since it last replayed a record."""
    return f"{namespace}:test-worker-idle"


def find_chromium() -> str | None:
    """``$DURABILIS_CHROMIUM``, else ``chromium`` / ``chromium-browser`` on PATH."""
    given = os.environ.get("DURABILIS_CHROMIUM")
    if given:
        return given if Path(given).is_file() else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def fleet_toml(*, lease: float = 30) -> str:
    """The fleet's config file (the console is served with it, as an operator would):
    op type ``job`` behind breaker ``svc`` (never trips here), ``send_email`` behind
    ``mail`` (the filler trips it); quick retries."""
    return f"""
[idempotency]
in_progress_ttl_seconds = {lease}

[retry.job]
max_attempts = 2
initial_delay_ms = 1
max_delay_ms = 2
jitter = false
retryable_errors = ["NETWORK_TIMEOUT"]

[retry.send_email]
max_attempts = 2
initial_delay_ms = 1
max_delay_ms = 2
jitter = false
retryable_errors = ["SERVICE_UNAVAILABLE"]

[circuit_breaker.svc]
failure_rate_threshold = 0.99
min_request_count = 100
reset_timeout_seconds = 1
probe_success_required = 1
window_size = 100
probe_timeout_seconds = 1

[circuit_breaker.mail]
failure_rate_threshold = 0.5
min_request_count = 4
reset_timeout_seconds = 1
probe_success_required = 1
window_size = 10
probe_timeout_seconds = 30

[dependencies]
job = "svc"
send_email = "mail"
"""


def console_config(*, lease: float = 30) -> DurabilityConfig:
    """:func:`fleet_toml` as the replicas load it."""
    import tomllib
    return parse_config(tomllib.loads(fleet_toml(lease=lease)), environ={})


def effect_fn(url: str, namespace: str) -> Callable[[OperationContext], Any]:
    """``job``'s effect: adds 1 to field ``page`` of ``<ns>:test-effects:{fx}``."""
    import redis

    client = redis.Redis.from_url(url)

    def job(ctx: OperationContext) -> dict[str, Any]:
        client.hincrby(effects_key(namespace), str(ctx.payload["page"]), 1)
        return {"done": ctx.payload["page"]}

    return job


@dataclasses.dataclass
class Filled:
    """The ids the filler made, for the tests to look for."""

    namespace: str
    hostile_id: str  # job, agent-1: HTML, control characters and 10 KB in its fields
    evil_agent_id: str  # job, agent HOSTILE_AGENT
    evil_type_id: str  # operation type HOSTILE_TYPE (enqueued directly: no policy for it)
    requeue_id: str  # job, agent-2, payload {"page": 7}: the one the UI requeues
    abandoned_id: str
    replayed_id: str
    bulk_ids: list[str]  # send_email records, oldest first
    checkpoint_ids: dict[str, str]  # phase -> id of task-1's checkpoints
    fork_id: str  # task-1's "publish" forked into task-1-retry
    config_version: int


def _park(layer: DurabilityLayer, agent: str, op: str, payload: Any, error: OperationError) -> str:
    def fail(ctx: OperationContext) -> Any:
        raise error

    try:
        layer.execute(agent, op, payload, fail)
    except RetryExhausted as exc:
        assert exc.dlq_id is not None
        return exc.dlq_id
    raise AssertionError("the failing operation was not parked")


def fill(url: str, namespace: str) -> Filled:
    """Fill ``namespace`` as a fleet would, through the library's API (no raw writes)."""
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, console_config(), replica_id="filler")
    try:
        hostile_id = _park(
            layer, "agent-1", "job",
            {"text": SCRIPT_TAG, "img": IMG_TAG, "control": CONTROL, "big": BIG, "page": 1},
            OperationError("NETWORK_TIMEOUT", HOSTILE_ERROR + " " + BIG),
        )
        evil_agent_id = _park(layer, HOSTILE_AGENT, "job", {"page": 2, "who": IMG_TAG},
                              OperationError("NETWORK_TIMEOUT", "evil agent timed out"))
        evil_type_id = layer.dlq.enqueue("agent-1", HOSTILE_TYPE, {"page": 3}, 1,
                                         f"UNKNOWN_TYPE: {SCRIPT_TAG}")
        requeue_id = _park(layer, "agent-2", "job", {"page": 7},
                           OperationError("NETWORK_TIMEOUT", "upstream timed out"))
        abandoned_id = _park(layer, "agent-2", "job", {"page": 8},
                             OperationError("NETWORK_TIMEOUT", "gave up on it"))
        assert layer.dlq.abandon(abandoned_id)
        replayed_id = _park(layer, "agent-3", "job", {"page": 9},
                            OperationError("NETWORK_TIMEOUT", "replayed later"))
        assert layer.dlq.mark_replayed(replayed_id)
        bulk_ids = [
            layer.dlq.enqueue(f"agent-{i % 3 + 1}", "send_email", {"to": f"user{i}@example.com"},
                              2, f"SERVICE_UNAVAILABLE: smtp refused #{i}")
            for i in range(BULK_RECORDS)
        ]

        # Breaker "mail": Closed -> Open (4 failures), Open -> HalfOpen (after the
        # 1 s reset timeout, a probe), HalfOpen -> Open (the probe fails).
        breakers = layer.breakers
        for _ in range(4):
            breakers.after_call("mail", False, breakers.before_call("mail"))
        deadline = time.monotonic() + 10
        while True:
            try:
                probe = breakers.before_call("mail")
                break
            except durabilis.CircuitOpen:
                assert time.monotonic() < deadline, "breaker mail never half-opened"
                time.sleep(0.1)
        breakers.after_call("mail", False, probe)
        breakers.after_call("svc", True, breakers.before_call("svc"))

        cps = layer.checkpoints
        checkpoint_ids: dict[str, str] = {}
        for phase, state in (("fetch", {"rows": 3}), ("transform", {"note": SCRIPT_TAG}),
                             ("publish", {"url": "https://example.com/r/1"})):
            checkpoint_ids[phase] = cps.save("task-1", "agent-1", phase, state).checkpoint_id
        fork_id = cps.fork(checkpoint_ids["publish"], "task-1-retry").checkpoint_id

        sync = ConfigSync(layer)
        sync.publish_policy(RetryPolicy("job", 3, 5, 50, retryable_errors=("NETWORK_TIMEOUT",)))
        version = sync.publish_breaker(CircuitBreakerConfig("svc", 0.9, 50, 2, 1, 100, 5))
        return Filled(namespace, hostile_id, evil_agent_id, evil_type_id, requeue_id, abandoned_id,
                      replayed_id, bulk_ids, checkpoint_ids, fork_id, version)
    finally:
        layer.close()
        store.close()


def _wait_line(proc: subprocess.Popen[str], want: str, timeout: float) -> None:
    """Wait (``timeout`` seconds at most) for a line ``want`` on ``proc``'s stdout
    (the child says it is ready); read by a thread, so the deadline holds even
    when the child prints nothing."""
    assert proc.stdout is not None
    stdout = proc.stdout
    found = threading.Event()
    lines: list[str] = []

    def read() -> None:
        for line in iter(stdout.readline, ""):
            lines.append(line)
            if line.strip() == want:
                found.set()
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if found.wait(timeout):
        reader.join(timeout)
        return
    proc.kill()
    reader.join(5)
    err = proc.stderr.read() if proc.stderr else ""
    raise AssertionError(f"{proc.args!r} never printed {want!r}: {lines!r} {err[-2000:]}")


def _python(
    *args: str, stdin: int | IO[Any] | None = subprocess.PIPE, log: IO[Any] | None = None
) -> subprocess.Popen[str]:
    """``python ARGS`` from the repository's root; its stdout is piped (for the
    ready line) unless ``log`` is given, its stderr goes to ``log`` or is piped."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=env, text=True, stdin=stdin,
        stdout=log or subprocess.PIPE, stderr=log or subprocess.PIPE,
    )


def _stop(proc: subprocess.Popen[str], timeout: float = 10) -> None:
    """Close its stdin (the workers' signal to finish), then SIGTERM, then SIGKILL."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


@contextlib.contextmanager
def in_flight_and_orphan(url: str, namespace: str) -> Iterator[None]:
    """One operation in flight (its worker alive, lease renewed) and one orphan
    (its worker SIGKILLed, lease ended, not yet recovered), while the block runs."""
    holder = _python("-m", "tests.browser._worker", "hold", url, namespace)
    dier = _python("-m", "tests.browser._worker", "die", url, namespace)
    try:
        _wait_line(holder, "ready", 30)
        _wait_line(dier, "ready", 30)
        dier.kill()
        dier.wait(10)
        store = durabilis.connect(url, namespace=namespace)
        layer = DurabilityLayer(store, console_config())
        try:
            deadline = time.monotonic() + 15
            while layer.stats().lease_ended < 1:  # the dead worker's 1 s lease runs out
                assert time.monotonic() < deadline, "the orphan's lease never ended"
                time.sleep(0.1)
        finally:
            layer.close()
            store.close()
        yield
    finally:
        _stop(dier)
        _stop(holder)


@contextlib.contextmanager
def console(url: str, namespace: str, *extra: str) -> Iterator[str]:
    """``durabilis web --config <fleet_toml()>`` as a subprocess on a free loopback
    port: its base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # Its output (uvicorn's access log) goes to a file: a pipe nobody reads would
    # fill up and block the server.
    with tempfile.TemporaryFile("w+") as log, tempfile.NamedTemporaryFile(
        "w", suffix=".toml", prefix="fleet-"
    ) as toml:
        toml.write(fleet_toml())
        toml.flush()
        proc = _python("-m", "durabilis", "web", "--url", url, "--namespace", namespace,
                       "--config", toml.name, "--host", "127.0.0.1", "--port", str(port),
                       *extra, stdin=subprocess.DEVNULL, log=log)
        try:
            deadline = time.monotonic() + 30
            while not _answers(base + "/static/console.css"):  # (the overview writes a sample)
                if proc.poll() is not None:
                    log.seek(0)
                    raise AssertionError(f"durabilis web exited {proc.returncode}: "
                                         f"{log.read()[-3000:]}")
                assert time.monotonic() < deadline, "durabilis web did not answer within 30 s"
                time.sleep(0.1)
            yield base
        finally:
            _stop(proc)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def finish(proc: subprocess.Popen[str], timeout: float = 15) -> str:
    """Close a worker's stdin (it finishes its pass and exits): all it printed."""
    out, _ = proc.communicate(timeout=timeout)  # (closes stdin first)
    return out


@contextlib.contextmanager
def replay_worker(url: str, namespace: str) -> Iterator[subprocess.Popen[str]]:
    """A worker process running the layer's ``replay_requeued`` loop with ``job``'s fn."""
    proc = _python("-m", "tests.browser._worker", "replay", url, namespace)
    try:
        _wait_line(proc, "ready", 30)
        yield proc
    finally:
        _stop(proc)


class Page:
    """A Playwright page that fails the test on any dialog (``alert(...)`` from an
    injected script) and, at the end, on any ``window.__xss`` or ``<script>``."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.dialogs: list[str] = []
        page.on("dialog", self._dialog)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def check_nothing_ran(self) -> None:
        """No dialog, no ``window.__xss``, no ``<script>`` in the page now shown."""
        assert self.dialogs == [], f"an injected script opened a dialog: {self.dialogs}"
        assert self.page.evaluate("typeof window.__xss") == "undefined", "an injected script ran"
        assert self.page.evaluate("document.scripts.length") == 0, "the console serves no script"


def by_id(page: Any, name: str) -> Any:
    """The elements of ``page`` (or of an element) with ``data-testid=name``."""
    return page.get_by_test_id(name)


def texts(page: Any, name: str) -> list[str]:
    """The inner texts of :func:`by_id`'s elements, stripped."""
    return [t.strip() for t in by_id(page, name).all_inner_texts()]
