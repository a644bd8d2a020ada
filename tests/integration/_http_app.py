"""The gateway the HTTP tests drive: a Starlette app behind DurableIdempotencyMiddleware.

Run in-process (``build(url, namespace)``) or by uvicorn in real worker
processes (``uvicorn --factory tests.integration._http_app:create_app``, with
``DURABILIS_TEST_URL`` and ``DURABILIS_TEST_NS`` in the environment). Its side
effects are counted in Redis (``<ns>:test:effects`` hash, one field per
Idempotency-Key), so a test reads how many times each request really ran.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import durabilis
from durabilis import IdempotencyConfig
from durabilis.http import DurableIdempotencyMiddleware
from durabilis.layer import AsyncDurabilityLayer, DurabilityConfig


def build(
    url: str, namespace: str, *, lease: float = 30.0, recover_every: float | None = None,
    **options: Any,
) -> tuple[DurableIdempotencyMiddleware, Any]:
    """The middleware-wrapped app and the Redis client its handlers count with
    (the layer's store's client: closed with ``mw.layer.store``)."""
    store = durabilis.aio.connect(url, namespace=namespace)
    layer = AsyncDurabilityLayer(store, DurabilityConfig(
        idempotency=IdempotencyConfig(in_progress_ttl_seconds=lease)))
    raw = store.client  # redis-py's own client (plain or Cluster): the effects' counter
    effects = f"{namespace}:test:effects"

    def key_of(request: Request) -> str:
        return request.headers.get("idempotency-key", "-")

    async def orders(request: Request) -> Response:
        body = await request.body()
        n = await raw.hincrby(effects, key_of(request), 1)
        return JSONResponse(
            {"order": uuid.uuid4().hex, "pid": os.getpid(), "n": n, "len": len(body),
             "ct": request.headers.get("content-type", "")},
            status_code=201,
            headers={"location": f"/orders/{n}", "set-cookie": f"s={uuid.uuid4().hex}"},
        )

    async def slow(request: Request) -> Response:
        # Tell the test who runs it, then hold until it says go (or is killed).
        await raw.set(f"{namespace}:test:slowpid", os.getpid())
        while not await raw.exists(f"{namespace}:test:go"):
            await asyncio.sleep(0.02)
        n = await raw.hincrby(effects, key_of(request), 1)
        return JSONResponse({"n": n, "pid": os.getpid()}, status_code=201)

    async def auth(request: Request) -> Response:
        # Needs credentials (never kept with the claim), then runs like /slow.
        if "authorization" not in request.headers:
            return JSONResponse({"error": "who are you?"}, status_code=401)
        return await slow(request)

    async def flaky(request: Request) -> Response:
        # 503 on its first run for a key, 201 after: the first answer is not recorded.
        n = await raw.hincrby(effects, key_of(request), 1)
        return JSONResponse({"n": n}, status_code=503 if n == 1 else 201)

    async def boom(request: Request) -> Response:
        await raw.hincrby(effects, key_of(request), 1)
        raise RuntimeError("the handler failed")

    async def big(request: Request) -> Response:
        size = int(request.query_params.get("size", "0"))
        parts = int(request.query_params.get("parts", "1"))
        await raw.hincrby(effects, key_of(request), 1)
        chunk = b"x" * (size // parts)

        async def stream() -> Any:
            for _ in range(parts):
                yield chunk

        return StreamingResponse(stream(), status_code=200, media_type="text/plain")

    async def health(request: Request) -> Response:
        mw = request.app.state.middleware
        if mw.recovery is None:
            return JSONResponse({"ok": True})
        return JSONResponse(await mw.recovery.health())

    app = Starlette(routes=[
        Route("/orders", orders, methods=["POST", "PUT"]),
        Route("/slow", slow, methods=["POST"]),
        Route("/auth", auth, methods=["POST"]),
        Route("/flaky", flaky, methods=["POST"]),
        Route("/boom", boom, methods=["POST"]),
        Route("/big", big, methods=["POST"]),
        Route("/healthz", health, methods=["GET"]),
    ])
    mw = DurableIdempotencyMiddleware(
        app, layer, recover_every_seconds=recover_every, **options)
    app.state.middleware = mw
    return mw, raw


def create_app() -> DurableIdempotencyMiddleware:
    """uvicorn's factory: settings from the environment."""
    recover = os.environ.get("DURABILIS_TEST_RECOVER")
    mw, _ = build(
        os.environ["DURABILIS_TEST_URL"], os.environ["DURABILIS_TEST_NS"],
        lease=float(os.environ.get("DURABILIS_TEST_LEASE", "30")),
        recover_every=float(recover) if recover else None,
        wait_seconds=float(os.environ.get("DURABILIS_TEST_WAIT", "0")),
    )
    return mw
