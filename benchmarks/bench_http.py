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
asyncio PING round trip on one connection; ``layer.execute`` alone with a
payload of the same size; and ``layer.execute`` around the bare app, as a
gateway would call it without the middleware (the request's payload as the
middleware keeps it, a caller key bound to a fingerprint, the app run inside
``fn``, its response returned as the record), so that what the middleware itself
adds (parsing, fingerprint, the app's own task, buffering, replay) is the
difference ("own share"). The older subtraction, new key - bare app - layer
alone, timed apart, is printed too: it also books to the middleware the app
running cold after a Redis round trip (its code out of the CPU's caches), which
no middleware code can save. Each kind's client CPU time per request
(``time.process_time``, this process only: not Redis's) is reported beside the
wall-clock rates; on a shared machine it is the steadier figure. Requests are
sent one at a time (latency, not throughput); the rounds interleave the kinds.
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
from durabilis.idempotency import IdempotencyKey
from durabilis.layer import AsyncDurabilityLayer

BARE = "bare app (ASGI, in-process)"
NEW = "guarded app, new key"
DUP = "guarded app, completed duplicate"
PING = "redis PING (asyncio, 1 connection)"
LAYER = "layer.execute alone, new key"
AROUND = "layer.execute around the bare app"
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


async def _rate(call: Callable[[], Awaitable[Any]], seconds: float) -> tuple[float, float]:
    """Calls per second (wall clock), and this process's CPU us per call."""
    n, began, cpu = 0, time.perf_counter(), time.process_time()
    while (took := time.perf_counter() - began) < seconds:
        for _ in range(20):
            await call()
        n += 20
    return n / took, (time.process_time() - cpu) * 1e6 / n


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

        # The middleware's payload for this request, and the record of its response.
        request = {"m": "POST", "p": "/payments", "rp": b"/payments", "r": "", "q": b"",
                   "h": [[b"content-type", b"application/json"]], "b": BODY, "k": "",
                   "i": "http"}
        record = {"s": 201, "h": [[b"content-type", b"application/json"]],
                  "b": b'{"payment":"p-1","amount":1999}'}

        async def app_in_fn(_ctx: Any) -> dict[str, Any]:
            await _call(bare, None)
            return record

        def around() -> Awaitable[Any]:
            key = IdempotencyKey(next(fresh), "h" + "0" * 63)  # (a fresh key: any fingerprint)
            return layer.execute("http", "http_request", request, app_in_fn,
                                 idempotency_key=key)

        kinds: dict[str, Callable[[], Awaitable[Any]]] = {
            PING: ping.ping,
            LAYER: lambda: layer.execute("http", "http_request", {"b": BODY}, noop,
                                         idempotency_key=next(fresh)),
            AROUND: around,
            BARE: lambda: _call(bare, None),
            NEW: lambda: _call(guarded, next(fresh)),
            DUP: lambda: _call(guarded, dup_key),
        }
        for call in kinds.values():  # warm up: connections, scripts, code paths
            await _rate(call, min(seconds, 0.05))
        runs: dict[str, list[float]] = {k: [] for k in kinds}
        cpu: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(rounds):
            for name, call in kinds.items():
                rate, cpu_us = await _rate(call, seconds)
                runs[name].append(rate)
                cpu[name].append(cpu_us)
    finally:
        await layer.close()
        await store.close()
        await ping.aclose()
    out: dict[str, Any] = {k: figures(v, unit="requests/s") for k, v in runs.items()}
    out[PING]["unit"] = out[LAYER]["unit"] = "calls/s"
    us = {k: 1e6 / out[k]["median"] for k in runs}
    out["cpu"] = {k: figures(v, unit="CPU us") for k, v in cpu.items()}
    cpu_of = {k: out["cpu"][k]["median"] for k in cpu}
    out["overhead"] = {
        "new key, us per request": round(us[NEW] - us[BARE], 1),
        "duplicate, us per request": round(us[DUP] - us[BARE], 1),
        "PING round trip, us": round(us[PING], 1),
        "new key / bare app (requests/s)": round(out[NEW]["median"] / out[BARE]["median"], 3),
        "duplicate / bare app (requests/s)": round(out[DUP]["median"] / out[BARE]["median"], 3),
        "middleware's own share, us (new key - layer around the app)": round(
            us[NEW] - us[AROUND], 1),
        "middleware's own share, CPU us (new key - layer around the app)": round(
            cpu_of[NEW] - cpu_of[AROUND], 1),
        "middleware's own share, us (new key - bare - layer, timed apart)": round(
            us[NEW] - us[BARE] - us[LAYER], 1),
        "same, CPU us (new key - bare - layer, timed apart)": round(
            cpu_of[NEW] - cpu_of[BARE] - cpu_of[LAYER], 1),
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
    for name in (PING, LAYER, AROUND, BARE, NEW, DUP):
        if name not in section:  # (a result file of an older run)
            continue
        f = section[name]
        lines.append(f"  {name:<40} {f['median']:>10,.0f} {f['unit']:<11} "
                     f"({f['min']:,.0f}-{f['max']:,.0f})")
    for name, f in section.get("cpu", {}).items():
        lines.append(f"  CPU us per call, {name:<38} {f['median']:>7,.1f} "
                     f"({f['min']:,.1f}-{f['max']:,.1f})")
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
