"""DurableIdempotencyMiddleware in one process: the Idempotency-Key contract.

Driven through httpx's ASGI transport (and raw ASGI calls where the transport
cannot show a detail: streamed request bodies, the lifespan), against the
session's real Redis. The cross-process claims (uvicorn workers, SIGKILL) are
in test_http_uvicorn.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

import durabilis
from durabilis import ConfigError
from durabilis.http import DurableIdempotencyMiddleware, OrphanRecovery
from durabilis.layer import AsyncDurabilityLayer, DurabilityConfig
from tests.integration._http_app import build

Body = Callable[[httpx.AsyncClient, DurableIdempotencyMiddleware, Any], Awaitable[None]]


async def serve(mw: DurableIdempotencyMiddleware, body: Any, *extra: Any) -> None:
    """``body(client, mw, *extra)`` through httpx's ASGI transport; closes the layer."""
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                     base_url="http://gw") as client:
            await body(client, mw, *extra)
    finally:
        await mw.layer.close()
        await mw.layer.store.close()


def drive(redis_url: str, namespace: str, body: Body, **options: Any) -> None:
    async def main() -> None:
        mw, raw = build(redis_url, namespace, **options)
        await serve(mw, body, raw)

    asyncio.run(main())


async def effects(raw: Any, namespace: str) -> dict[str, int]:
    got = await raw.hgetall(f"{namespace}:test:effects")
    return {k.decode(): int(v) for k, v in got.items()}


def key(k: str) -> dict[str, str]:
    return {"Idempotency-Key": k}


def problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    doc: dict[str, Any] = response.json()
    assert doc["type"] == f"urn:durabilis:problem:{slug}"
    assert doc["status"] == status
    return doc


def test_duplicate_replays_the_stored_response_byte_for_byte(
    redis_url: str, namespace: str
) -> None:
    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware, raw: Any) -> None:
        first = await c.post("/orders", json={"item": 7}, headers=key("k-1"))
        assert first.status_code == 201
        assert "idempotent-replayed" not in first.headers
        assert first.headers["set-cookie"].startswith("s=")  # its own client gets all
        # The draft writes the key as an sf-string: the quoted form is the same key.
        for again in (key("k-1"), {"Idempotency-Key": '"k-1"'}):
            dup = await c.post("/orders", json={"item": 7}, headers=again)
            assert dup.status_code == 201
            assert dup.content == first.content
            assert dup.headers["idempotent-replayed"] == "true"
            assert dup.headers["location"] == first.headers["location"]
            assert dup.headers["content-type"] == "application/json"
            # Never another client's session cookie.
            assert "set-cookie" not in dup.headers
        assert await effects(raw, namespace) == {"k-1": 1}
        # Another key runs; no key at all passes through unguarded.
        assert (await c.post("/orders", json={"item": 7}, headers=key("k-2"))).status_code == 201
        await c.post("/orders", json={"item": 7})
        await c.post("/orders", json={"item": 7})
        assert await effects(raw, namespace) == {"k-1": 1, "k-2": 1, "-": 2}

    drive(redis_url, namespace, body)


def test_same_key_with_another_request_is_422_and_runs_nothing(
    redis_url: str, namespace: str
) -> None:
    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware, raw: Any) -> None:
        assert (await c.post("/orders", json={"a": 1}, headers=key("m"))).status_code == 201
        variants = [
            c.post("/orders", json={"a": 2}, headers=key("m")),  # another body
            c.post("/orders?x=1", json={"a": 1}, headers=key("m")),  # another query
            c.put("/orders", json={"a": 1}, headers=key("m")),  # another method
            c.post("/orders", content=b'{"a":1}',  # another content type
                   headers={**key("m"), "content-type": "text/plain"}),
        ]
        mw.methods = frozenset({"POST", "PUT"})
        for sent in variants:
            problem(await sent, 422, "idempotency-key-reused")
        assert await effects(raw, namespace) == {"m": 1}

    drive(redis_url, namespace, body)


def test_concurrent_duplicate_gets_409_or_waits(redis_url: str, namespace: str) -> None:
    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware, raw: Any) -> None:
        first = asyncio.ensure_future(c.post("/slow", json={}, headers=key("s")))
        while not await raw.exists(f"{namespace}:test:slowpid"):
            await asyncio.sleep(0.01)
        busy = await c.post("/slow", json={}, headers=key("s"))
        problem(busy, 409, "request-in-progress")
        assert busy.headers["retry-after"] == "1"
        # With wait_seconds, a duplicate waits for the first one's response.
        mw.wait_seconds = 5.0
        waiting = asyncio.ensure_future(c.post("/slow", json={}, headers=key("s")))
        await asyncio.sleep(0.2)
        await raw.set(f"{namespace}:test:go", 1)
        done, waited = await first, await waiting
        assert done.status_code == waited.status_code == 201
        assert waited.content == done.content
        assert waited.headers["idempotent-replayed"] == "true"
        assert await effects(raw, namespace) == {"s": 1}

    drive(redis_url, namespace, body)


def test_bad_or_missing_keys_are_400_and_nothing_runs(redis_url: str, namespace: str) -> None:
    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware, raw: Any) -> None:
        problem(await c.post("/orders", json={}, headers=key("x" * 256)),
                400, "idempotency-key-invalid")
        problem(await c.post("/orders", json={}, headers={"Idempotency-Key": '"a\\b"'}),
                400, "idempotency-key-invalid")
        problem(await c.post("/orders", json={}, headers={"Idempotency-Key": '""'}),
                400, "idempotency-key-invalid")
        problem(await c.post("/orders", json={}, headers=[("Idempotency-Key", "a"),
                                                          ("Idempotency-Key", "b")]),
                400, "idempotency-key-invalid")
        accented = {"Idempotency-Key": "caf\u00e9".encode()}
        problem(await c.post("/orders", json={}, headers=accented),
                400, "idempotency-key-invalid")
        # The default limit is 255 characters: the layer's max_key_length (256)
        # counts the key as sent, not the %raw:<tenant>: scope beside it.
        assert mw.max_key_length == 255
        problem(await c.post("/orders", json={}, headers=key("x" * 256)),
                400, "idempotency-key-invalid")
        assert (await c.post("/orders", json={}, headers=key("x" * 255))).status_code == 201
        mw.require_key = True
        problem(await c.post("/orders", json={}), 400, "idempotency-key-missing")
        assert (await c.get("/healthz")).status_code == 200  # GET is not guarded
        assert await effects(raw, namespace) == {"x" * 255: 1}

    drive(redis_url, namespace, body)


def test_request_body_limit_before_reading_and_while_streaming(
    redis_url: str, namespace: str
) -> None:
    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware, raw: Any) -> None:
        doc = problem(await c.post("/orders", content=b"x" * 1001, headers=key("big")),
                      413, "request-too-large")
        assert "1001 bytes" in doc["detail"]

        # No Content-Length (chunked): counted while read, refused past the limit.
        async def chunks() -> Any:
            for _ in range(5):
                yield b"y" * 300

        problem(await c.post("/orders", content=chunks(), headers=key("chunked")),
                413, "request-too-large")
        assert await effects(raw, namespace) == {}
        # At the limit it runs, and the body reaches the handler whole.
        ok = await c.post("/orders", content=b"z" * 1000, headers=key("edge"))
        assert ok.status_code == 201 and ok.json()["len"] == 1000

    drive(redis_url, namespace, body, max_request_bytes=1000)


def test_streamed_request_body_reaches_the_app_unchanged(redis_url: str, namespace: str) -> None:
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got = b""
        while True:
            message = await receive()
            got += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append(got)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok:%d" % len(got)})

    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, DurabilityConfig())
        mw = DurableIdempotencyMiddleware(app, layer)
        parts = [b"alpha-", b"", b"beta-" * 1000, b"gamma"]
        try:
            for _ in range(2):
                messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
                            for i, p in enumerate(parts)]
                sent: list[dict[str, Any]] = []

                async def receive(messages: list[Any] = messages) -> dict[str, Any]:
                    return messages.pop(0)  # type: ignore[no-any-return]

                async def send(message: dict[str, Any], sent: list[Any] = sent) -> None:
                    sent.append(message)

                scope = {"type": "http", "method": "POST", "path": "/p", "query_string": b"",
                         "headers": [(b"idempotency-key", b"stream-1")]}
                await mw(scope, receive, send)
                assert sent[1]["body"] == b"ok:%d" % len(b"".join(parts))
        finally:
            await layer.close()
            await store.close()

    asyncio.run(main())
    assert seen == [b"".join([b"alpha-", b"beta-" * 1000, b"gamma"])]  # once, unchanged


def test_response_too_large_to_store_is_sent_once_and_never_rerun(
    redis_url: str, namespace: str
) -> None:
    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware, raw: Any) -> None:
        for parts in (1, 20):  # one chunk (buffered), a stream (passed through)
            k = f"big-{parts}"
            first = await c.post(f"/big?size=4000&parts={parts}", headers=key(k))
            assert first.status_code == 200 and first.content == b"x" * 4000
            dup = await c.post(f"/big?size=4000&parts={parts}", headers=key(k))
            doc = problem(dup, 410, "response-not-stored")
            assert "status 200" in doc["detail"] and "4000 bytes" in doc["detail"]
            assert dup.headers["idempotent-replayed"] == "true"
        small = await c.post("/big?size=1000&parts=4", headers=key("small"))
        again = await c.post("/big?size=1000&parts=4", headers=key("small"))
        assert again.content == small.content == b"x" * 1000
        assert await effects(raw, namespace) == {"big-1": 1, "big-20": 1, "small": 1}

    drive(redis_url, namespace, body, max_response_bytes=1000)


def test_server_errors_are_not_recorded_unless_asked(redis_url: str, namespace: str) -> None:
    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware, raw: Any) -> None:
        assert (await c.post("/flaky", json={}, headers=key("f"))).status_code == 503
        # Released, but still bound to its request: another body is refused.
        problem(await c.post("/flaky", json={"other": 1}, headers=key("f")),
                422, "idempotency-key-reused")
        second = await c.post("/flaky", json={}, headers=key("f"))  # runs again
        assert second.status_code == 201 and second.json() == {"n": 2}
        third = await c.post("/flaky", json={}, headers=key("f"))
        assert third.content == second.content and third.headers["idempotent-replayed"]
        # An exception: the server's 500, nothing recorded, the claim released.
        with pytest.raises(RuntimeError, match="the handler failed"):
            await c.post("/boom", json={}, headers=key("b"))
        with pytest.raises(RuntimeError):
            await c.post("/boom", json={}, headers=key("b"))
        assert (await mw.layer.stats()).in_flight == 0
        assert (await mw.layer.dlq.stats()).pending == 0  # an HTTP handler is never parked
        mw.record_server_errors = True
        assert (await c.post("/flaky", json={}, headers=key("g"))).status_code == 503
        replayed = await c.post("/flaky", json={}, headers=key("g"))
        assert replayed.status_code == 503 and replayed.headers["idempotent-replayed"]
        assert await effects(raw, namespace) == {"f": 2, "b": 2, "g": 1}

    drive(redis_url, namespace, body)


def test_tenants_paths_and_methods_scope_the_guard(redis_url: str, namespace: str) -> None:
    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware, raw: Any) -> None:
        a = await c.post("/orders", json={}, headers={**key("t"), "x-tenant": "acme"})
        b = await c.post("/orders", json={}, headers={**key("t"), "x-tenant": "globex"})
        assert a.status_code == b.status_code == 201 and a.content != b.content
        again = await c.post("/orders", json={}, headers={**key("t"), "x-tenant": "acme"})
        assert again.content == a.content
        # Outside the guarded paths a key means nothing to the middleware.
        await c.post("/flaky", json={}, headers=key("p"))
        await c.post("/flaky", json={}, headers=key("p"))
        assert await effects(raw, namespace) == {"t": 2, "p": 2}

    def tenant(scope: Any) -> str:
        return dict(scope["headers"]).get(b"x-tenant", b"anon").decode()

    drive(redis_url, namespace, body, tenant=tenant, paths=["/orders"])


def test_a_store_of_another_event_loop_is_500_and_the_app_does_not_run(
    redis_url: str, namespace: str
) -> None:
    """A deployment error, not an outage: no Retry-After (a retry meets it again)."""
    ran: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover
        ran.append(1)

    store = durabilis.aio.connect(redis_url, namespace=namespace)
    mw = DurableIdempotencyMiddleware(app, AsyncDurabilityLayer(store, DurabilityConfig()))

    async def request() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                     base_url="http://gw") as c:
            return await c.post("/x", json={}, headers=key("loop"))

    asyncio.run(store.ping())  # the store's loop: made, used, gone
    r = asyncio.run(request())
    problem(r, 500, "idempotency-misconfigured")
    assert "retry-after" not in r.headers and ran == []


def test_redis_down_is_503_and_the_app_does_not_run(namespace: str) -> None:
    async def main() -> None:
        ran: list[int] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover
            ran.append(1)

        store = durabilis.aio.connect("redis://127.0.0.1:1/0", namespace=namespace,
                                      socket_timeout=0.5)
        layer = AsyncDurabilityLayer(store, DurabilityConfig())
        mw = DurableIdempotencyMiddleware(app, layer)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                     base_url="http://gw") as c:
            r = await c.post("/x", json={}, headers=key("down"))
        problem(r, 503, "idempotency-unavailable")
        assert r.headers["retry-after"] == "1" and ran == []
        await store.close()

    asyncio.run(main())


def test_bad_settings_are_config_errors(redis_url: str, namespace: str) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store)

        async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover
            pass

        bad: list[dict[str, Any]] = [
            {"methods": []}, {"methods": ["PO ST"]}, {"paths": ["orders"]},
            {"header": "Idem:Key"}, {"tenant": ""}, {"wait_seconds": -1},
            {"max_key_length": 0}, {"max_request_bytes": 10 ** 9},
            {"max_response_bytes": True}, {"recover_every_seconds": 0},
            {"max_key_length": 257},  # over the layer's max_key_length (256)
            {"tenant": "t" * 1100},  # its %raw:<tenant>: scope over CALLER_SCOPE_MAX_BYTES
        ]
        for options in bad:
            with pytest.raises(ConfigError):
                DurableIdempotencyMiddleware(app, layer, **options)
        with pytest.raises(ConfigError):
            DurableIdempotencyMiddleware(app, durabilis.DurabilityLayer(  # type: ignore[arg-type]
                durabilis.connect(redis_url, namespace=namespace)))
        await layer.close()
        await store.close()

    asyncio.run(main())


def test_orphan_recovery_one_replica_per_period_and_health(
    redis_url: str, namespace: str
) -> None:
    async def main() -> None:
        layers = [AsyncDurabilityLayer(durabilis.aio.connect(redis_url, namespace=namespace))
                  for _ in range(3)]
        recoveries = [OrphanRecovery(x, every_seconds=0.5, holder=f"r{i}")
                      for i, x in enumerate(layers)]
        try:
            first = [await r.run_once() for r in recoveries]
            assert sum(f is not None for f in first) == 1  # one per period
            assert sum(r.skipped for r in recoveries) == 2
            await asyncio.sleep(0.6)  # the lease ends with the period
            assert await recoveries[2].run_once() == []
            health = await recoveries[2].health()
            assert health["ok"] is True
            assert health["recovery"]["runs"] == 1 and health["recovery"]["running"] is False
            assert health["layer"]["in_flight"] == 0
        finally:
            for x in layers:
                await x.close()
                await x.store.close()

    asyncio.run(main())


def test_lifespan_starts_and_stops_recovery(redis_url: str, namespace: str) -> None:
    async def main() -> None:
        mw, _ = build(redis_url, namespace, recover_every=0.1)
        assert mw.recovery is not None
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        outbox: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            outbox.append(message)

        server = asyncio.ensure_future(mw({"type": "lifespan", "asgi": {"version": "3.0"},
                                           "state": {}}, inbox.get, send))
        await inbox.put({"type": "lifespan.startup"})
        while not outbox:
            await asyncio.sleep(0.01)
        assert outbox[-1]["type"] == "lifespan.startup.complete"
        # Periods of 0.1 s go by (a pass on Cluster also reads a slice of the
        # birth index: tens of ms, more on a loaded machine).
        deadline = time.monotonic() + 5
        while True:
            health = await mw.recovery.health()
            assert health["recovery"]["running"] is True
            if health["recovery"]["runs"] + health["recovery"]["skipped"] >= 2:
                break
            assert time.monotonic() < deadline, health
            await asyncio.sleep(0.05)
        await inbox.put({"type": "lifespan.shutdown"})
        await server
        assert outbox[-1]["type"] == "lifespan.shutdown.complete"
        assert (await mw.recovery.health())["recovery"]["running"] is False
        await mw.layer.close()
        await mw.layer.store.close()

    asyncio.run(main())


_DIES_MID_REQUEST = """
import asyncio, sys, httpx
from tests.integration._http_app import build
async def main():
    mw, _ = build(sys.argv[1], sys.argv[2], lease=0.5)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw), base_url="http://gw") as c:
        await c.post("/auth", json={"v": 1},
                     headers={"Idempotency-Key": "lost", "Authorization": "Bearer secret"})
asyncio.run(main())
"""


def test_replay_without_credentials_is_not_recorded(redis_url: str, namespace: str) -> None:
    """A process dies mid-request; its parked request, replayed without the
    client's credentials, is refused by the app: that refusal is not recorded
    (the DLQ record stays pending) and the client's own retry runs it once."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", _DIES_MID_REQUEST, redis_url, namespace],
                            cwd=root, env={**os.environ, "PYTHONPATH": str(root)})

    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware, raw: Any) -> None:
        try:
            for _ in range(500):
                if await raw.exists(f"{namespace}:test:slowpid"):
                    break
                await asyncio.sleep(0.02)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(10)
        await raw.set(f"{namespace}:test:go", 1)
        for _ in range(100):  # its lease (0.5 s) ends; recovery parks it
            if await mw.layer.recover_orphans():
                break
            await asyncio.sleep(0.05)
        summary = await mw.layer.replay_pending(mw.replay_stored, operation_type="http_request")
        assert summary.failed == 1 and summary.replayed == 0
        (record,) = await mw.layer.dlq.list_pending()
        assert "answered 401" in (record.last_error or "")
        assert await effects(raw, namespace) == {}
        retry = await c.post("/auth", json={"v": 1},
                             headers={**key("lost"), "Authorization": "Bearer secret"})
        assert retry.status_code == 201 and "idempotent-replayed" not in retry.headers
        again = await c.post("/auth", json={"v": 1},
                             headers={**key("lost"), "Authorization": "Bearer secret"})
        assert again.content == retry.content and again.headers["idempotent-replayed"]
        assert await effects(raw, namespace) == {"lost": 1}

    drive(redis_url, namespace, body, lease=0.5)


# --- what an adversarial review found (each failed before its fix) ----------------------------


def run_raw(redis_url: str, namespace: str, app: Any, body: Any, **options: Any) -> None:
    """``body(client, mw)`` against a raw ASGI ``app`` behind the middleware."""

    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        await serve(DurableIdempotencyMiddleware(app, AsyncDurabilityLayer(store), **options),
                    body)

    asyncio.run(main())


def test_background_work_after_the_response_neither_delays_nor_undoes_the_record(
    redis_url: str, namespace: str
) -> None:
    charged: list[int] = []
    sent_at: list[float] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        charged.append(1)
        body = b'{"charged":%d}' % len(charged)
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        await asyncio.sleep(0.5)  # a background task (Starlette runs them here)
        raise RuntimeError("the background task failed")

    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(RuntimeError, match="background task"):
            await c.post("/pay", json={}, headers=key("bg"))  # the server logs it
        sent_at.append(loop.time() - began)
        again = await c.post("/pay", json={}, headers=key("bg"))
        assert again.status_code == 201 and again.content == b'{"charged":1}'
        assert again.headers["idempotent-replayed"] == "true"
        assert charged == [1]  # recorded before the background work: never run twice

    run_raw(redis_url, namespace, app, body)


def test_try_again_later_answers_are_not_recorded(redis_url: str, namespace: str) -> None:
    answers = iter([429, 201])

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": next(answers), "headers": []})
        await send({"type": "http.response.body", "body": b"x"})

    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware) -> None:
        assert (await c.post("/p", json={}, headers=key("rl"))).status_code == 429
        retry = await c.post("/p", json={}, headers=key("rl"))
        assert retry.status_code == 201 and "idempotent-replayed" not in retry.headers

    run_raw(redis_url, namespace, app, body)


def test_a_malformed_response_is_not_recorded(redis_url: str, namespace: str) -> None:
    calls: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        if scope["path"] == "/extra":  # a body message after the response was complete
            await send({"type": "http.response.body", "body": b"ok"})
            await send({"type": "http.response.body", "body": b"SECRET-AFTER-END"})
        else:  # a body longer than its Content-Length
            await send({"type": "http.response.body", "body": b"okay"})

    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware) -> None:
        # The response was complete at "ok": that is what is recorded; the stray
        # message after it is the application's error (the server logs it).
        with pytest.raises(RuntimeError, match="after its response was complete"):
            await c.post("/extra", json={}, headers=key("extra"))
        replay = await c.post("/extra", json={}, headers=key("extra"))
        assert replay.content == b"ok" and replay.headers["content-length"] == "2"
        # A body longer than its Content-Length is not recorded: a retry runs again.
        for _ in range(2):
            with pytest.raises(RuntimeError, match="Content-Length"):
                await c.post("/long", json={}, headers=key("long"))
        assert calls == ["/extra", "/long", "/long"]

    run_raw(redis_url, namespace, app, body)


def test_response_headers_given_as_an_iterator_reach_the_first_client(
    redis_url: str, namespace: str
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 201,
                    "headers": iter([(b"location", b"/x/1")])})
        await send({"type": "http.response.body", "body": b"made"})

    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware) -> None:
        first = await c.post("/p", json={}, headers=key("it"))
        again = await c.post("/p", json={}, headers=key("it"))
        assert first.headers["location"] == again.headers["location"] == "/x/1"

    run_raw(redis_url, namespace, app, body)


def test_event_streams_pass_through_as_they_come(redis_url: str, namespace: str) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i,
                        "more_body": True})
            await asyncio.sleep(0.2)
        await send({"type": "http.response.body", "body": b""})

    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware) -> None:
        got: list[tuple[float, bytes]] = []
        loop = asyncio.get_running_loop()
        began = loop.time()
        scope = {"type": "http", "method": "POST", "path": "/sse", "query_string": b"",
                 "headers": [(b"idempotency-key", b"sse")]}
        messages = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await asyncio.Event().wait()
            return {}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                got.append((loop.time() - began, message["body"]))

        await mw(scope, receive, send)
        assert [b for _, b in got] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
        assert got[0][0] < 0.15  # the first event was not held back for the others
        dup = await c.post("/sse", headers=key("sse"))
        problem(dup, 410, "response-not-stored")  # a stream is not stored, never re-run

    run_raw(redis_url, namespace, app, body)


def test_request_details_that_matter_are_told_apart(redis_url: str, namespace: str) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["raw_path"]})

    async def body(c: httpx.AsyncClient, mw: DurableIdempotencyMiddleware) -> None:
        # Raw paths that decode alike are two requests: the second is a reuse.
        assert (await c.post("/x/%FF", headers=key("raw"))).status_code == 200
        problem(await c.post("/x/%FE", headers=key("raw")), 422, "idempotency-key-reused")
        # A folded header ("a, b") is two keys, not one.
        problem(await c.post("/pay", headers={"Idempotency-Key": "a, b"}),
                400, "idempotency-key-invalid")
        # Path prefixes guard whole segments.
        first = await c.post("/payments-admin", headers=key("seg"))
        second = await c.post("/payments-admin", headers=key("seg"))
        assert "idempotent-replayed" not in second.headers and first.status_code == 200
        guarded = [await c.post("/pay/1", headers=key("seg2")) for _ in range(2)]
        assert guarded[1].headers["idempotent-replayed"] == "true"
        # A request body at the limit fits whatever the rest of the request holds.
        big = await c.post("/pay/big?q=" + "v" * 2000, content=b"b" * mw.max_request_bytes,
                           headers=key("limit"))
        assert big.status_code == 200

    run_raw(redis_url, namespace, app, body, paths=["/pay", "/x"])


def test_framing_headers_cannot_be_stored(redis_url: str, namespace: str) -> None:
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store)
        for bad in (["content-length"], ["Transfer-Encoding"], ["connection"]):
            with pytest.raises(ConfigError, match="response_headers"):
                DurableIdempotencyMiddleware(lambda *a: None, layer,  # type: ignore[arg-type]
                                             response_headers=bad)
        await layer.close()
        await store.close()

    asyncio.run(main())


async def _call(
    mw: DurableIdempotencyMiddleware, idem_key: bytes, body: bytes = b"{}",
    *, leaves: bool = False,
) -> list[dict[str, Any]]:
    """One raw ASGI POST with ``idem_key``; the messages the middleware sent.
    The client stays until the response, or (``leaves``) is gone once its
    request was read."""
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        if not leaves:
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/p", "query_string": b"",
             "headers": [(b"idempotency-key", idem_key)]}
    await mw(scope, receive, send)
    return sent


def _served(
    redis_url: str, namespace: str, app: Any, body: Any, config: DurabilityConfig | None = None
) -> None:
    """``body(mw, layer)`` with ``app`` behind the middleware; closes the layer."""
    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store, config or DurabilityConfig())
        try:
            await body(DurableIdempotencyMiddleware(app, layer), layer)
        finally:
            await layer.close()
            await store.close()

    asyncio.run(main())


def test_an_app_error_that_cannot_be_printed_runs_the_app_once_and_reaches_the_server(
    redis_url: str, namespace: str
) -> None:
    """Its text is built after the app ran: a failing str() must not turn into
    an error the retry policy runs the app again for (nor hang the request)."""
    runs: list[int] = []

    class Unprintable(TimeoutError):
        def __str__(self) -> str:
            raise RuntimeError("no str")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        runs.append(1)
        await receive()
        raise Unprintable

    async def body(mw: DurableIdempotencyMiddleware, layer: AsyncDurabilityLayer) -> None:
        with pytest.raises(Unprintable):  # the server answers 500, as without us
            await asyncio.wait_for(_call(mw, b"broken-1"), 10)
        assert runs == [1]
        assert await layer.dlq.pending_count() == 0  # released, not parked

    # Every error retried: the policy would run the app again if it could.
    _served(redis_url, namespace, app, body, DurabilityConfig(retry_policies=(
        durabilis.RetryPolicy("*", max_attempts=3, initial_delay_ms=1, max_delay_ms=1,
                              retryable_errors=()),
    )))


def test_a_stream_its_app_ends_on_a_client_disconnect_releases_the_key_without_an_error(
    redis_url: str, namespace: str
) -> None:
    """A server that does not cancel the app on a disconnect (uvicorn): the app
    sees ``http.disconnect`` and returns mid-stream (Starlette's
    StreamingResponse). That is the client going away, as documented for a
    cancellation: the key is released, and no error reaches the server."""
    runs: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        runs.append(1)
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        if (await receive())["type"] == "http.disconnect":
            return  # the stream is cut short: no final body message

    async def body(mw: DurableIdempotencyMiddleware, layer: AsyncDurabilityLayer) -> None:
        with capture_logs() as logs:
            sent = await asyncio.wait_for(_call(mw, b"stream-1", leaves=True), 10)
        assert sent[0]["status"] == 200  # what the client got before it left
        assert [e["event"] for e in logs if e["event"] == "durability_http_client_gone"] == [
            "durability_http_client_gone"]
        assert await layer.dlq.pending_count() == 0  # released, not parked
        await asyncio.wait_for(_call(mw, b"stream-1", leaves=True), 10)
        assert runs == [1, 1]  # the retry runs it: its response was never complete

    _served(redis_url, namespace, app, body)


def test_a_cancelled_request_keeps_its_key_until_the_app_has_stopped(
    redis_url: str, namespace: str
) -> None:
    """The server gives up on a request (its client went away) while the app
    is in its cleanup: a retry of the key meanwhile gets 409, never a second
    run of the app beside the first."""
    runs: list[int] = []
    writes: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        runs.append(1)
        await receive()
        try:
            await asyncio.sleep(0.2)  # the downstream call
        finally:
            await asyncio.sleep(0.3)  # its commit, awaited in cleanup
            writes.append(1)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"created"})

    async def body(mw: DurableIdempotencyMiddleware, layer: AsyncDurabilityLayer) -> None:
        first = asyncio.ensure_future(_call(mw, b"pay-1"))
        await asyncio.sleep(0.1)
        first.cancel()
        await asyncio.sleep(0.05)  # the client retries at once: the app still cleans up
        retry = await _call(mw, b"pay-1")
        assert retry[0]["status"] == 409
        with pytest.raises(asyncio.CancelledError):
            await first
        assert runs == [1] and writes == [1]  # its cleanup ran to its end
        again = await _call(mw, b"pay-1")  # the key was given back once it stopped
        assert again[0]["status"] == 201 and runs == [1, 1]

    _served(redis_url, namespace, app, body)


def test_a_cancelled_request_whose_app_completes_its_response_all_the_same_is_recorded(
    redis_url: str, namespace: str
) -> None:
    """The app catches the cancellation and finishes what it started (its
    effect, its complete response): that response is recorded before the
    cancellation goes on, so a retry gets it instead of a second run."""
    effects: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        with contextlib.suppress(asyncio.CancelledError):  # finish what was started
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.1)
        effects.append("charged")
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"charged"})

    async def body(mw: DurableIdempotencyMiddleware, layer: AsyncDurabilityLayer) -> None:
        first = asyncio.ensure_future(_call(mw, b"pay-2"))
        await asyncio.sleep(0.1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        retry = await _call(mw, b"pay-2")
        assert retry[0]["status"] == 201 and retry[1]["body"] == b"charged"
        assert (b"idempotent-replayed", b"true") in retry[0]["headers"]
        assert effects == ["charged"]

    _served(redis_url, namespace, app, body)


def test_an_app_that_raises_as_it_is_called_reaches_the_server_and_is_not_parked(
    redis_url: str, namespace: str
) -> None:
    calls: list[int] = []

    class App:  # not a coroutine function: it raises before returning one
        def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
            calls.append(1)
            raise ConnectionError("backend pool exhausted")

    async def body(mw: DurableIdempotencyMiddleware, layer: AsyncDurabilityLayer) -> None:
        with pytest.raises(ConnectionError, match="backend pool exhausted"):
            await _call(mw, b"sync-1")
        assert calls == [1]
        assert await layer.dlq.pending_count() == 0  # released, never parked nor retried

    _served(redis_url, namespace, App(), body)


def test_under_an_anyio_cancel_scope_the_cancelled_app_is_waited_for_without_spinning(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """anyio re-cancels a task at every loop turn until it leaves the scope:
    the wait for the cancelled app is shielded from that (it neither spins the
    loop nor gives up), so its cleanup ends before the key is released."""
    import anyio

    cleaned: list[int] = []
    waits = 0
    real_wait = asyncio.wait

    async def counted_wait(*args: Any, **kwargs: Any) -> Any:
        nonlocal waits
        waits += 1
        return await real_wait(*args, **kwargs)

    monkeypatch.setattr(asyncio, "wait", counted_wait)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        try:
            await asyncio.sleep(5)
        finally:
            await asyncio.sleep(0.5)  # its cleanup
            cleaned.append(1)

    async def body(mw: DurableIdempotencyMiddleware, layer: AsyncDurabilityLayer) -> None:
        with anyio.move_on_after(0.2):
            await _call(mw, b"scope-1")
        assert cleaned == [1]  # waited for, as without anyio
        assert waits < 10  # one wait, not one per loop turn (74,635 in 1.8 s before)

    _served(redis_url, namespace, app, body)


async def _parked(mw: DurableIdempotencyMiddleware, layer: AsyncDurabilityLayer, raw: str) -> str:
    """A request of ``mw`` with key ``raw`` parked in the DLQ (its delivery failed)."""
    from durabilis.http import _fingerprint
    from durabilis.testing import instant_retries

    scope = {"type": "http", "method": "POST", "path": "/p", "query_string": b"",
             "headers": [(b"idempotency-key", raw.encode())]}
    payload = mw._payload(scope, raw, b"{}")

    async def down(ctx: Any) -> None:
        raise ConnectionError("the worker's backend was down")

    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as parked:
        await layer.execute("http", mw.operation_type, payload, down,
                            idempotency_key=durabilis.IdempotencyKey(raw, _fingerprint(payload)))
    assert parked.value.dlq_id is not None
    return parked.value.dlq_id


async def _within(seconds: float, work: Awaitable[Any]) -> Any:
    """``work`` under a timeout: ``asyncio.timeout`` where there is one (it
    counts the task's cancellation requests), else ``wait_for``."""
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None:
        return await asyncio.wait_for(work, seconds)
    async with timeout(seconds):
        return await work


@pytest.mark.parametrize("status", [201, 503])
def test_a_cancelled_replay_whose_app_completes_still_ends_cancelled(
    redis_url: str, namespace: str, status: int
) -> None:
    """A replay (no client) cancelled by a timeout: the response its app
    completes all the same is recorded (a 201; a 503 is not), and the timeout
    still fires as a timeout, not a bare cancellation nor a normal return."""
    runs: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        runs.append(1)
        await receive()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.3)
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    async def body(mw: DurableIdempotencyMiddleware, layer: AsyncDurabilityLayer) -> None:
        dlq_id = await _parked(mw, layer, "rp-1")
        await _parked(mw, layer, "rp-1b")  # behind it: the pass must stop at the timeout
        with pytest.raises(asyncio.TimeoutError):
            await _within(0.1, layer.replay_pending(mw.replay_stored))
        assert runs == [1]
        if status == 201:
            again = await _call(mw, b"rp-1")  # the client's retry gets the recorded answer
            assert again[0]["status"] == 201 and runs == [1]
        else:
            record = await layer.dlq.get(dlq_id)
            assert record is not None and record.status.value == "pending"

    _served(redis_url, namespace, app, body)


def test_a_cancelled_replay_whose_app_reads_its_request_again_is_disconnected(
    redis_url: str, namespace: str
) -> None:
    """A replay has no client: its cancelled app reading the request again in
    its cleanup is told the client is gone, instead of waiting out the lease."""
    ended: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        try:
            await asyncio.sleep(5)
        finally:
            ended.append((await receive())["type"])

    async def body(mw: DurableIdempotencyMiddleware, layer: AsyncDurabilityLayer) -> None:
        dlq_id = await _parked(mw, layer, "rp-2")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(layer.replay(dlq_id, mw.replay_stored), 0.1)
        assert ended == ["http.disconnect"]

    _served(redis_url, namespace, app, body)


@pytest.mark.topologies("cluster")
def test_a_requeued_request_is_replayed_only_by_the_middleware_that_parked_it(
    redis_url: str, namespace: str,
) -> None:
    """Two guarded apps on one layer, both serving requeued requests (each
    named: without an explicit name nothing is served, as two services would
    share the default): the admin app's pass leaves the orders app's request
    alone (deferred, nothing counted, still marked) and the orders app's pass
    replays it. Two that would serve each other's requests (one name) are
    refused at construction."""
    hits: list[tuple[str, str]] = []

    def make_app(name: str) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            hits.append((name, scope["path"]))
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": name.encode()})
        return app

    async def main() -> None:
        store = durabilis.aio.connect(redis_url, namespace=namespace)
        layer = AsyncDurabilityLayer(store)
        try:
            orders = DurableIdempotencyMiddleware(make_app("orders"), layer, tenant="orders",
                                                  recover_every_seconds=60, name="orders")
            admin = DurableIdempotencyMiddleware(make_app("admin"), layer, tenant="admin",
                                                 recover_every_seconds=60, name="admin")
            assert orders.recovery is not None and admin.recovery is not None
            with pytest.raises(ConfigError) as info:
                DurableIdempotencyMiddleware(make_app("twin"), layer, tenant="orders",
                                             recover_every_seconds=60, name="orders")
            assert info.value.field == "name"
            # (not serving requeued requests, unnamed, or named apart: no clash)
            DurableIdempotencyMiddleware(make_app("twin"), layer, tenant="orders",
                                         recover_every_seconds=60, serve_requeued=False)
            unnamed = DurableIdempotencyMiddleware(make_app("twin"), layer, tenant="orders",
                                                   recover_every_seconds=60)
            assert unnamed.recovery is not None and not unnamed.recovery.requeue_handlers
            DurableIdempotencyMiddleware(make_app("twin"), layer, tenant="orders",
                                         recover_every_seconds=60, name="orders-v2")
            # A request of the orders app, parked (as its orphan recovery parks it).
            scope = {"type": "http", "method": "POST", "path": "/refunds",
                     "raw_path": b"/refunds", "query_string": b"", "headers": []}
            payload = orders._payload(scope, "k-1", b'{"order": 7}')
            dlq_id = await layer.dlq.enqueue("orders", "http_request", payload, 1,
                                             "WORKER_LOST",
                                             metadata={"idempotency_key": "%raw:orders:k-1"})
            assert [r.outcome for r in await layer.dlq.requeue([dlq_id])] == ["requeued"]
            summary = await admin.recovery.requeue_once()
            assert summary is not None and summary.replayed == summary.failed == 0
            assert summary.deferred_ids == (dlq_id,) and hits == []
            record = await layer.dlq.get(dlq_id)
            assert record is not None and record.replay_attempts == 0
            assert record.requeued_at is not None and record.claimed_by is None
            summary = await orders.recovery.requeue_once()
            assert summary is not None and summary.replayed == 1
            assert hits == [("orders", "/refunds")]
        finally:
            await layer.close()
            await store.close()

    asyncio.run(main())


def test_a_served_requests_stored_fingerprint_is_the_one_earlier_releases_stored(
    redis_url: str, namespace: str
) -> None:
    # Pinned (tests/unit/test_http_fingerprint.py has more): a claim an earlier
    # release stored must still match the same request after a rolling upgrade.
    pinned = "h2fab57e66c27cd2432ba173e6d329abddcb2223a040386e9e5dec2b0213aec6"

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"id": 1}'})

    async def body(mw: DurableIdempotencyMiddleware, layer: AsyncDurabilityLayer) -> None:
        scope = {"type": "http", "method": "POST", "path": "/orders", "raw_path": b"/orders",
                 "query_string": b"", "headers": [(b"Content-Type", b"application/json"),
                                                  (b"content-length", b"11"),
                                                  (b"Idempotency-Key", b"k-1")]}
        sent: list[dict[str, Any]] = []
        given = False

        async def receive() -> dict[str, Any]:
            nonlocal given
            given = True
            return {"type": "http.request", "body": b'{"item": 7}', "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await mw(scope, receive, send)
        assert given and sent[0]["status"] == 201

        async def never(ctx: Any) -> None:
            raise AssertionError("a duplicate does not run")

        # The layer finds the record under the pinned fingerprint: a duplicate.
        stored = await layer.execute("http", mw.operation_type, {}, never,
                                     idempotency_key=durabilis.IdempotencyKey("k-1", pinned))
        assert stored["s"] == 201 and stored["b"] == b'{"id": 1}'
        with pytest.raises(durabilis.errors.KeyReuseMismatch):
            await layer.execute("http", mw.operation_type, {}, never,
                                idempotency_key=durabilis.IdempotencyKey("k-1", "h" + "0" * 63))

    _served(redis_url, namespace, app, body)


def test_the_app_runs_in_a_task_of_its_own_that_sees_the_operation(
    redis_url: str, namespace: str
) -> None:
    # Python 3.12+ starts the app's task eagerly (its first step at once): it is
    # still a task of its own, with the operation's context, and its work after
    # the response still runs after the record, not before.
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        seen.append((asyncio.current_task(), durabilis.current_operation()))
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})
        seen.append("after the response")  # (no await before: the same step)

    async def body(mw: DurableIdempotencyMiddleware, layer: AsyncDurabilityLayer) -> None:
        sent = await _call(mw, b"own-task")
        assert [m.get("status") for m in sent][:1] == [201] and sent[1]["body"] == b"done"
        (task, operation), after = seen
        assert task is not asyncio.current_task() and task.done()
        assert operation is not None and operation.operation_type == mw.operation_type
        assert after == "after the response"
        again = await _call(mw, b"own-task")
        assert (again[0]["status"], again[1]["body"]) == (201, b"done") and len(seen) == 2

    _served(redis_url, namespace, app, body)
