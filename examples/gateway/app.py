"""A payments gateway: Starlette behind DurableIdempotencyMiddleware.

Run it with several worker processes (they share one Redis):

    pip install 'durabilis[gateway]'
    DURABILIS_REDIS_URL=redis://127.0.0.1:6379/0 \
        uvicorn --factory examples.gateway.app:create_app --workers 4 --port 8000

POST /payments with an ``Idempotency-Key`` runs once across all workers: a
retried or duplicated request gets the first response again
(``Idempotent-Replayed: true``), the same key with another body gets 422, a
request still running elsewhere 409. GET /healthz shows the orphan recovery
each worker runs in the background and the fleet's counters.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from durabilis import aio
from durabilis.http import DurableIdempotencyMiddleware


def create_app() -> Any:
    """uvicorn's factory (``--factory``): one layer per worker process."""
    store = aio.connect(namespace=os.environ.get("DURABILIS_NAMESPACE", "gateway"))
    layer = aio.DurabilityLayer(store)  # gateway defaults: one "*" retry policy
    ledger = f"{store.namespace}:example:ledger"

    async def pay(request: Request) -> Response:
        order = await request.json()
        # The side effect: a ledger entry. (A real handler would forward the
        # key downstream: durabilis.current_operation().idempotency_key.)
        payment = uuid.uuid4().hex
        await store.client.hset(ledger, payment, str(order.get("amount", 0)))
        return JSONResponse({"payment": payment, "amount": order.get("amount"),
                             "worker": os.getpid()}, status_code=201)

    async def count(request: Request) -> Response:
        return JSONResponse({"payments": await store.client.hlen(ledger)})

    async def health(request: Request) -> Response:
        assert guarded.recovery is not None
        return JSONResponse(await guarded.recovery.health())

    app = Starlette(routes=[
        Route("/payments", pay, methods=["POST"]),
        Route("/payments/count", count, methods=["GET"]),
        Route("/healthz", health, methods=["GET"]),
    ])
    guarded = DurableIdempotencyMiddleware(
        app, layer,
        paths=["/payments"], require_key=True,  # a payment without a key is refused
        wait_seconds=2.0,                        # a concurrent duplicate waits for the first
        recover_every_seconds=10.0,              # park requests whose worker died
    )
    return guarded
