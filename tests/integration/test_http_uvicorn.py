"""DurableIdempotencyMiddleware under real uvicorn worker processes, over loopback.

- 500 keys, each sent 3 times at once to 3 different uvicorn processes: the
  handler's side effect happens once per key and every copy gets the same bytes.
- A worker SIGKILLed mid-request (uvicorn --workers 2): the recovery in the
  surviving worker parks the request; the client's retry runs it once, or a
  replay runs it without the client and the retry gets that response.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

import durabilis
from durabilis.layer import WORKER_LOST
from tests.integration._http_app import build

ROOT = Path(__file__).resolve().parents[2]
# uvicorn processes on one plain server; serial: their timeouts are the machine's
pytestmark = [pytest.mark.standalone_only, pytest.mark.serial]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    """One uvicorn server (``workers`` processes) running tests.integration._http_app."""

    def __init__(
        self, redis_url: str, namespace: str, workers: int = 1,
        factory: str = "tests.integration._http_app:create_app", **env: str,
    ) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        environ = {**os.environ, "DURABILIS_TEST_URL": redis_url, "DURABILIS_TEST_NS": namespace,
                   "DURABILIS_REDIS_URL": redis_url, "DURABILIS_NAMESPACE": namespace,
                   "PYTHONPATH": str(ROOT), **env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", factory,
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers),
             "--log-level", "warning", "--timeout-graceful-shutdown", "2",
             # Keep pooled connections open: a server closing an idle one while
             # the client reuses it is a ReadError of the test, not of the code.
             "--timeout-keep-alive", "120"],
            cwd=ROOT, env=environ, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code < 500:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"uvicorn on port {self.port} did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


@pytest.fixture
def gateways(redis_url: str, namespace: str) -> Iterator[list[Gateway]]:
    started: list[Gateway] = []
    try:
        for _ in range(3):
            started.append(Gateway(redis_url, namespace, DURABILIS_TEST_WAIT="10"))
        yield started
    finally:
        for g in started:
            g.stop()


def test_500_keys_sent_3_times_to_3_processes_run_once(
    gateways: list[Gateway], redis_url: str, namespace: str
) -> None:
    keys = [f"order-{i}" for i in range(500)]

    async def main() -> dict[str, list[httpx.Response]]:
        limits = httpx.Limits(max_connections=64)
        clients = [httpx.AsyncClient(base_url=g.url, timeout=30, limits=limits) for g in gateways]
        gate = asyncio.Semaphore(96)

        async def send(client: httpx.AsyncClient, k: str) -> httpx.Response:
            async with gate:
                return await client.post("/orders", json={"key": k, "qty": 3},
                                         headers={"Idempotency-Key": k})

        async def one_key(k: str) -> list[httpx.Response]:
            # The 3 copies at once, each to another process.
            return list(await asyncio.gather(*(send(c, k) for c in clients)))

        try:
            answers = await asyncio.gather(*(one_key(k) for k in keys))
        finally:
            for c in clients:
                await c.aclose()
        return dict(zip(keys, answers, strict=True))

    by_key = asyncio.run(main())
    raw = redis.Redis.from_url(redis_url)
    counts = {k.decode(): int(v) for k, v in raw.hgetall(f"{namespace}:test:effects").items()}
    raw.close()
    assert counts == dict.fromkeys(keys, 1)  # the side effect once per key
    pids = set()
    for k, copies in by_key.items():
        assert [r.status_code for r in copies] == [201, 201, 201], k
        assert len({r.content for r in copies}) == 1, k  # byte-identical
        replayed = [r.headers.get("idempotent-replayed") for r in copies]
        assert replayed.count("true") == 2 and replayed.count(None) == 1, k
        pids.add(copies[0].json()["pid"])
    assert len(pids) == 3  # every process ran some of them


def _kill_mid_request(raw: redis.Redis, namespace: str, gw: Gateway, k: str) -> None:
    """Send /slow with key ``k``; SIGKILL the worker that holds it."""
    raw.delete(f"{namespace}:test:slowpid")
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        def post() -> None:
            # Its worker dies under it: the client sees a broken connection.
            with contextlib.suppress(httpx.TransportError):
                client.post("/slow", json={"k": k}, headers={"Idempotency-Key": k})

        t = threading.Thread(target=post)
        t.start()
        deadline = time.monotonic() + 20
        while (pid := raw.get(f"{namespace}:test:slowpid")) is None:
            assert time.monotonic() < deadline, "the request never reached a worker"
            time.sleep(0.02)
        os.kill(int(pid), signal.SIGKILL)
        t.join(30)


def _parked_keys(store: durabilis.Store) -> dict[str, str]:
    layer = durabilis.DurabilityLayer(store)
    listing = layer.dlq.list_all()
    return {str(r.metadata.get("idempotency_key")): r.last_error for r in listing.records}


def test_worker_sigkilled_mid_request_is_recovered_and_applied_once(
    redis_url: str, namespace: str
) -> None:
    gw = Gateway(redis_url, namespace, workers=2, DURABILIS_TEST_LEASE="1.5",
                 DURABILIS_TEST_RECOVER="0.3")
    raw = redis.Redis.from_url(redis_url)
    store = durabilis.connect(redis_url, namespace=namespace)
    try:
        _kill_mid_request(raw, namespace, gw, "victim-retried")
        _kill_mid_request(raw, namespace, gw, "victim-replayed")
        assert not raw.hgetall(f"{namespace}:test:effects")  # killed before the effect
        # The surviving worker's recovery parks both once their leases end.
        deadline = time.monotonic() + 20
        while len(parked := _parked_keys(store)) < 2:
            assert time.monotonic() < deadline, parked
            time.sleep(0.1)
        assert set(parked.values()) == {WORKER_LOST}
        assert all(k.endswith(("victim-retried", "victim-replayed")) for k in parked)
        raw.set(f"{namespace}:test:go", 1)

        # 1. The client retries: the released key runs again, once.
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            def retry(k: str) -> httpx.Response:
                return client.post("/slow", json={"k": k}, headers={"Idempotency-Key": k})

            first = retry("victim-retried")
            assert first.status_code == 201 and "idempotent-replayed" not in first.headers
            again = retry("victim-retried")
            assert again.content == first.content and again.headers["idempotent-replayed"]

            # 2. No client: a replay of the parked request runs it from its claim.
            async def replay() -> int:
                mw, _ = build(redis_url, namespace)
                try:
                    summary = await mw.layer.replay_pending(
                        mw.replay_stored, operation_type="http_request")
                    return summary.replayed
                finally:
                    await mw.layer.close()
                    await mw.layer.store.close()

            # The client's retry settled its parked record; the other one runs now.
            assert asyncio.run(replay()) == 1
            settled = {str(r.metadata.get("idempotency_key")): r.replayed_by
                       for r in durabilis.DurabilityLayer(store).dlq.list_all().records}
            assert settled == {"%raw:http:victim-retried": "a later delivery",
                               "%raw:http:victim-replayed": settled["%raw:http:victim-replayed"]}
            assert settled["%raw:http:victim-replayed"] not in (None, "a later delivery")
            late = retry("victim-replayed")
            assert late.status_code == 201 and late.headers["idempotent-replayed"] == "true"
            # Limits hold over a real socket too.
            big = client.post("/orders", content=b"x" * (1024 * 1024 + 1),
                              headers={"Idempotency-Key": "too-big"})
            assert big.status_code == 413
        counts = {k.decode(): int(v) for k, v in raw.hgetall(f"{namespace}:test:effects").items()}
        assert counts == {"victim-retried": 1, "victim-replayed": 1}
        # Each worker removes its settled claims' index entries in a batch, once
        # a second (the health check's stats() sends its own worker's at once).
        deadline = time.monotonic() + 10
        while True:
            health = httpx.get(gw.url + "/healthz", timeout=5).json()
            if health["layer"]["in_flight"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert health["layer"]["recovered"] == 2 and health["layer"]["in_flight"] == 0
    finally:
        gw.stop()
        store.close()
        raw.close()


def test_the_gateway_example_applies_every_payment_once(redis_url: str, namespace: str) -> None:
    """examples/gateway/ as its README runs it: uvicorn --workers 4, then try_it.py."""
    gw = Gateway(redis_url, namespace, workers=4, factory="examples.gateway.app:create_app")
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "gateway" / "try_it.py"), gw.url, "60"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        )
    finally:
        gw.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "60 new payments (expected 60)" in done.stdout
    assert "same key, other body -> 422; no key -> 400" in done.stdout
