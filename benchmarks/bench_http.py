"""What DurableIdempotencyMiddleware adds to a request, against the bare app.

Run alone: ``python -m benchmarks.bench_http`` (``--rounds R``, ``--seconds S``);
the suite (``python -m benchmarks``) runs it as its ``http`` section.

The same Starlette app (one JSON POST route) is called in-process through
ASGI, with no server and no client library in the way, so the figures are the
middleware's own cost: the bare app; the guarded app with a new
``Idempotency-Key`` per request (two Redis round trips: the claim, the
record; the request's body fingerprinted and kept with the claim, the response
buffered and stored); the guarded app answering a completed duplicate (two
round trips today: the claim that finds the record, then the fleet's
``duplicates`` counter; the stored response replayed). The floor, measured in the same rounds: an
asyncio PING round trip on one connection; and ``layer.execute`` alone with a
payload of the same size, so that what the middleware itself adds (parsing,
fingerprint, buffering, replay) is the difference. Requests are sent one at a time
(latency, not throughput); the rounds interleave the kinds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

import durabilis
from benchmarks._harness import figures, quiet, redis_server, skipped
from durabilis.layer import AsyncDurabilityLayer

BARE = "bare app (ASGI, in-process)"
NEW = "guarded app, new key"
DUP = "guarded app, completed duplicate"
PING = "redis PING (asyncio, 1 connection)"
LAYER = "layer.execute alone, new key"
BODY = json.dumps({"account": "acct-42", "amount": 1999, "currency": "EUR",
                   "memo": "x" * 200}).encode()


def _app() -> Any:
    from starlette.applications import Starlette  # noqa: PLC0415 - optional (bench extra)
    from starlette.requests import Request  # noqa: PLC0415
    from starlette.responses import JSONResponse  # noqa: PLC0415
    from starlette.routing import Route  # noqa: PLC0415

    async def pay(request: Request) -> JSONResponse:
        order = await request.json()
        return JSONResponse({"payment": "p-1", "amount": order["amount"]}, status_code=201)

    return Starlette(routes=[Route("/payments", pay, methods=["POST"])])


async def _call(app: Any, key: str | None) -> int:
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(BODY)).encode())]
    if key is not None:
        headers.append((b"idempotency-key", key.encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/payments", "raw_path": b"/payments",
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.Event().wait()  # pragma: no cover - the app reads no more
        return {}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def _rate(call: Callable[[], Awaitable[Any]], seconds: float) -> float:
    n, began = 0, time.perf_counter()
    while (took := time.perf_counter() - began) < seconds:
        for _ in range(20):
            await call()
        n += 20
    return n / took


async def _measure(url: str, rounds: int, seconds: float) -> dict[str, Any]:
    from durabilis.http import DurableIdempotencyMiddleware  # noqa: PLC0415

    store = durabilis.aio.connect(url, namespace="bench-http")
    layer = AsyncDurabilityLayer(store)
    bare = _app()
    guarded = DurableIdempotencyMiddleware(_app(), layer)
    ping = aioredis.Redis.from_url(url)
    fresh = (f"k-{uuid.uuid4().hex}" for _ in itertools.count())
    dup_key = "the-duplicate"
    try:
        assert await _call(guarded, dup_key) == 201  # the duplicate's record
        async def noop(_ctx: Any) -> dict[str, Any]:
            return {"payment": "p-1", "amount": 1999}

        kinds: dict[str, Callable[[], Awaitable[Any]]] = {
            PING: ping.ping,
            LAYER: lambda: layer.execute("http", "http_request", {"b": BODY}, noop,
                                         idempotency_key=next(fresh)),
            BARE: lambda: _call(bare, None),
            NEW: lambda: _call(guarded, next(fresh)),
            DUP: lambda: _call(guarded, dup_key),
        }
        for call in kinds.values():  # warm up: connections, scripts, code paths
            await _rate(call, min(seconds, 0.05))
        runs: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(rounds):
            for name, call in kinds.items():
                runs[name].append(await _rate(call, seconds))
    finally:
        await layer.close()
        await store.close()
        await ping.aclose()
    out: dict[str, Any] = {k: figures(v, unit="requests/s") for k, v in runs.items()}
    out[PING]["unit"] = out[LAYER]["unit"] = "calls/s"
    us = {k: 1e6 / out[k]["median"] for k in runs}
    out["overhead"] = {
        "new key, us per request": round(us[NEW] - us[BARE], 1),
        "duplicate, us per request": round(us[DUP] - us[BARE], 1),
        "PING round trip, us": round(us[PING], 1),
        "new key / bare app (requests/s)": round(out[NEW]["median"] / out[BARE]["median"], 3),
        "duplicate / bare app (requests/s)": round(out[DUP]["median"] / out[BARE]["median"], 3),
        "middleware's own share, us (new key - bare - layer)": round(
            us[NEW] - us[BARE] - us[LAYER], 1),
        "new-key overhead / its 2 round trips (PING)": round(
            (us[NEW] - us[BARE]) / (2 * us[PING]), 2),
        "duplicate overhead / its 2 round trips (PING)": round(
            (us[DUP] - us[BARE]) / (2 * us[PING]), 2),
    }
    return out


def run(url: str, rounds: int = 5, seconds: float = 0.4) -> dict[str, Any]:
    """The section's figures (``skipped`` when Starlette is not installed)."""
    try:
        import starlette  # noqa: F401, PLC0415
    except ImportError:
        return {"skipped": skipped("starlette is not installed (pip install -e '.[bench]')")}
    return asyncio.run(_measure(url, rounds, seconds))


def report(section: dict[str, Any]) -> list[str]:
    """Lines of the suite's table for this section."""
    if "overhead" not in section:
        return [f"  skipped: {section.get('skipped')}"]
    lines = []
    for name in (PING, LAYER, BARE, NEW, DUP):
        f = section[name]
        lines.append(f"  {name:<40} {f['median']:>10,.0f} {f['unit']:<11} "
                     f"({f['min']:,.0f}-{f['max']:,.0f})")
    lines += [f"  {k:<54} {v:>8}" for k, v in section["overhead"].items()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.4)
    args = parser.parse_args()
    quiet()
    with redis_server() as (url, _admin):
        section = run(url, args.rounds, args.seconds)
    print("\n".join(report(section)))


if __name__ == "__main__":
    main()
