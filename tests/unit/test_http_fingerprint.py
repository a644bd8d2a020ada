"""The HTTP middleware's request fingerprint is pinned: a claim stored by an
earlier release must still match the same request after an upgrade (a rolling
upgrade sees both), so neither the bytes hashed nor how they are gathered from
the ASGI scope may change. No Redis: the store is never connected."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durabilis.aio
from durabilis.http import DurableIdempotencyMiddleware, _fingerprint
from durabilis.layer import AsyncDurabilityLayer

# (scope, key, body, the fingerprinted headers as kept, the fingerprint of the 0.x releases)
PINNED: list[tuple[dict[str, Any], str, bytes, list[list[bytes]], str]] = [
    ({"type": "http", "method": "POST", "path": "/orders", "raw_path": b"/orders",
      "query_string": b"",
      "headers": [(b"content-type", b"application/json"), (b"idempotency-key", b"k-1")]},
     "k-1", b'{"item": 7}', [[b"content-type", b"application/json"]],
     "h2fab57e66c27cd2432ba173e6d329abddcb2223a040386e9e5dec2b0213aec6"),
    ({"type": "http", "method": "PATCH", "path": "/a/b", "raw_path": b"/a/%FF",
      "query_string": b"x=1&y=%20",
      "headers": [(b"Content-Type", b"text/plain; charset=utf-8"), (b"X-Tenant", b"t1"),
                  (b"x-tenant", b"t2"), (b"Authorization", b"secret")]},
     "order-42", b"",
     [[b"content-type", b"text/plain; charset=utf-8"], [b"x-tenant", b"t1"],
      [b"x-tenant", b"t2"]],
     "ha8d69ee1e33b1384ccda1a4f08242bb1440e41b3901604c8fcba06bd3cf392e"),
    ({"type": "http", "method": "POST", "path": "/caf\u00e9", "query_string": b"q",
      "root_path": "/api", "headers": []},
     "k", bytes(range(256)), [],
     "h0be5b8078adfe041c419755feb70d9fc244433942687b0fd36207ca7ac51ed8"),
]


def _middleware() -> tuple[DurableIdempotencyMiddleware, AsyncDurabilityLayer]:
    async def app(scope: Any, receive: Any, send: Any) -> None:  # never called
        raise AssertionError

    store = durabilis.aio.connect("redis://127.0.0.1:1/0", namespace="pin")
    layer = AsyncDurabilityLayer(store)
    mw = DurableIdempotencyMiddleware(app, layer, fingerprint_headers=("Content-Type", "X-Tenant"))
    return mw, layer


@pytest.mark.parametrize(("scope", "raw", "body", "kept", "pinned"), PINNED)
def test_a_requests_fingerprint_is_the_one_earlier_releases_stored(
    scope: dict[str, Any], raw: str, body: bytes, kept: list[list[bytes]], pinned: str
) -> None:
    async def main() -> None:
        mw, layer = _middleware()
        try:
            payload = mw._payload(scope, raw, body)
            assert payload["h"] == kept  # (lower-cased names, in the request's order)
            assert _fingerprint(payload) == pinned
        finally:
            await layer.close()
            await layer.store.close()

    asyncio.run(main())
