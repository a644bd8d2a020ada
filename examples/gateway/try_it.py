"""Hit the gateway like flaky clients do: every payment sent 3 times at once.

    python examples/gateway/try_it.py http://127.0.0.1:8000 [payments]

Prints what came back and how many payments the ledger holds; exits 0 when
every payment was applied exactly once and every copy got the same response.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections import Counter

import httpx


async def main(base: str, n: int) -> int:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        before = (await client.get("/payments/count")).json()["payments"]
        keys = [str(uuid.uuid4()) for _ in range(n)]

        async def send(k: str, amount: int) -> httpx.Response:
            return await client.post("/payments", json={"amount": amount},
                                     headers={"Idempotency-Key": k})

        copies = await asyncio.gather(*(
            asyncio.gather(*(send(k, i) for _ in range(3))) for i, k in enumerate(keys)))
        statuses = Counter(r.status_code for c in copies for r in c)
        replayed = sum(r.headers.get("idempotent-replayed") == "true" for c in copies for r in c)
        identical = sum(len({r.content for r in c}) == 1 for c in copies)
        reused = await client.post("/payments", json={"amount": -1},
                                   headers={"Idempotency-Key": keys[0]})
        missing = await client.post("/payments", json={"amount": 1})
        after = (await client.get("/payments/count")).json()["payments"]
        health = (await client.get("/healthz")).json()
    applied = after - before
    print(f"sent {3 * n} requests for {n} payments: statuses {dict(statuses)}, "
          f"{replayed} replayed, {identical}/{n} keys answered byte-identically")
    print(f"same key, other body -> {reused.status_code}; no key -> {missing.status_code}")
    print(f"ledger: {applied} new payments (expected {n}); fleet counters: {health['layer']}")
    ok = (applied == n and identical == n and reused.status_code == 422
          and missing.status_code == 400)
    print("OK: every payment applied exactly once" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    sys.exit(asyncio.run(main(url, count)))
