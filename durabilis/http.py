"""HTTP idempotency for ASGI gateways: the ``Idempotency-Key`` header over the layer.

:class:`DurableIdempotencyMiddleware` wraps any ASGI application (Starlette,
FastAPI, Litestar, Quart...; no framework is imported) so that a request
carrying an ``Idempotency-Key`` runs ONCE across the whole fleet, following the
IETF httpapi draft "The Idempotency-Key HTTP Header Field":

- the first request runs the application; its complete response (status, the
  headers you allow, body) is recorded by :class:`~durabilis.aio.DurabilityLayer`
  before it is sent;
- a duplicate with the same key and the same request (method, path, query, the
  fingerprinted headers, body) gets the stored response again, marked
  ``Idempotent-Replayed: true``;
- a duplicate while the first still runs gets ``409`` (or waits up to
  ``wait_seconds`` for its response); the same key with another request gets
  ``422``; a missing key where one is required, or a malformed one, gets
  ``400``; errors are ``application/problem+json`` (RFC 9457).

:class:`OrphanRecovery` runs ``recover_orphans`` periodically (one replica per
period, through a short lease in Redis), and the DLQ's expiry cleanup on a
period of its own (one replica per period too), and reports health. ``docs/http.md``
has the whole contract.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import socket
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from durabilis._log import get_logger
from durabilis._retry_core import NotRetried
from durabilis._scripts import ScriptCall
from durabilis.dlq import DlqRecord, ReplaySummary
from durabilis.errors import (
    ConfigError,
    DurabilisError,
    InvalidKey,
    InvalidPayload,
    KeyReuseMismatch,
    OperationInProgress,
    PayloadTooLarge,
    ResultNotStored,
    WrongEventLoop,
)
from durabilis.events import exception_str
from durabilis.idempotency import CALLER_SCOPE_MAX_BYTES, IdempotencyKey
from durabilis.layer import AsyncDurabilityLayer, OperationContext

__all__ = [
    "DEFAULT_RESPONSE_HEADERS",
    "DurableIdempotencyMiddleware",
    "OrphanRecovery",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_RESPONSE_HEADERS: tuple[str, ...] = (
    "content-type", "content-language", "content-encoding", "content-location",
    "location", "etag", "last-modified", "link", "cache-control", "vary",
)
"""Response headers stored and replayed by default. Never ``set-cookie``: a
replay must not hand one client's session to another who guessed the key."""

DEFAULT_RELEASE_STATUSES: tuple[int, ...] = (408, 425, 429)
"""Statuses that mean "try again later": sent, not recorded, the key released."""

_PROBLEM = "urn:durabilis:problem:"
_REQUEST_ROOM = 16 * 1024  # the stored request beside its body (method, path, headers...)
_RESPONSE_ROOM = 4 * 1024  # the stored response beside its body (status, headers)
# Set by the replay itself, or never to be replayed from a record.
_NEVER_STORED = frozenset({
    b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"upgrade",
    b"te", b"trailer", b"proxy-authenticate", b"proxy-connection",
})
_NO_BODY_STATUSES = frozenset({204, 304})
# Extensions that let an application hand the server a file instead of bytes:
# the middleware must see every byte it records, so it hides them.
_HIDDEN_EXTENSIONS = ("http.response.pathsend", "http.response.zerocopysend",
                      "http.response.trailers")
_log = get_logger()

_SERVING: weakref.WeakKeyDictionary[
    AsyncDurabilityLayer, weakref.WeakValueDictionary[tuple[str, str], DurableIdempotencyMiddleware]
] = weakref.WeakKeyDictionary()
"""Per layer, the middleware serving each (name, operation type)'s requeued requests."""


class _AppFailed(NotRetried):
    """The application raised (``error``), or answered 5xx (``error is None``):
    nothing is recorded, the claim is released, the client may try again."""

    def __init__(self, error: BaseException | None, status: int = 0) -> None:
        super().__init__(f"{type(error).__name__}: {exception_str(error)}" if error is not None
                         else f"the application answered {status}" if status
                         else "the client went away before the response was complete")
        self.error = error
        # The code the retry log shows: the exception's type, or the status.
        self.code = type(error).__name__ if error is not None else f"HTTP_{status}"


class DurableIdempotencyMiddleware:
    """Run each request carrying an ``Idempotency-Key`` once, fleet-wide.

    Args:
        app: The ASGI application.
        layer: The layer that claims, records and recovers (its idempotency
            config gives the dedup window and the lease).
        methods: The methods it applies to (the draft names POST and PATCH).
        paths: Path prefixes it applies to; ``None``: every path.
        require_key: Answer ``400`` to a request of those methods/paths
            without the header (otherwise it passes through unguarded).
        header: The header's name.
        tenant: Whose key space a key lives in: a name, or a function of the
            ASGI scope (e.g. the API account from a header your auth layer
            checked). Two tenants' equal keys never meet.
        operation_type: The layer's operation type (retry policy, counters).
        wait_seconds: A duplicate that arrives while the first request runs
            waits up to this long for its response; ``0``: ``409`` at once.
        max_key_length: Longest accepted key, in characters (printable ASCII).
            ``None``: 255, or the layer's ``max_key_length`` when smaller (it
            counts the key as sent; the layer stores ``%raw:<tenant>:<key>``).
        max_request_bytes: Largest request body; a larger ``Content-Length``
            is refused (``413``) before anything is read or run. ``None``: 1 MiB,
            less 16 KiB kept for the rest of the stored request (the layer's
            ``max_value_bytes`` and the DLQ's ``max_payload_bytes`` bound it).
        max_response_bytes: Largest response body stored (1 MiB less 4 KiB by
            default). A larger one is still sent to its client (streamed
            through once over the limit) and recorded as *completed, response
            not stored*: a duplicate gets ``410`` naming the original status.
        response_headers: Response header names stored and replayed.
        fingerprint_headers: Request header names that are part of the request
            fingerprint (and kept with the claim for recovery and replay).
        record_server_errors: Record ``5xx`` responses too. By default a
            ``5xx`` is sent but not recorded: the claim is released and a retry
            with the same key runs again (the application said it failed).
        release_statuses: Other statuses sent but not recorded, for the same
            reason: "try again later" answers (408, 425, 429 by default).
        stream_types: Response media types passed through as they come (never
            held back; recorded as *completed, response not stored*): server-
            sent events by default.
        replayed_header: The header that marks a replayed response.
        recover_every_seconds: Run an :class:`OrphanRecovery` in the
            application's lifespan (started at startup or on the first
            request, stopped at shutdown); ``None``: do not.
        serve_requeued: With ``recover_every_seconds`` and an explicit
            ``name``, that recovery also replays (with :attr:`requeue_handler`)
            the parked requests of this middleware's ``operation_type`` an
            operator marked for redelivery (``durabilis dlq requeue``); only
            those it parked itself (its ``name``): another middleware's are
            left to it. Without an explicit ``name`` nothing is served: two
            services on one namespace would share the default name and replay
            each other's requests (an app's answer recorded for another's key).
        name: This middleware's identity among those on one namespace: kept
            with each request it parks, and the requeue pass of another
            identity declines it. ``None``: the ``tenant`` when it is a fixed
            name, otherwise the ``operation_type`` (and no requeue serving).
            Give each service its own, and keep it across deploys: requests
            parked under a name are served only by a middleware of that name.

    Raises:
        ConfigError: A setting out of range (field named).
    """

    def __init__(
        self,
        app: ASGIApp,
        layer: AsyncDurabilityLayer,
        *,
        methods: Iterable[str] = ("POST", "PATCH"),
        paths: Sequence[str] | None = None,
        require_key: bool = False,
        header: str = "Idempotency-Key",
        tenant: str | Callable[[Scope], str] = "http",
        operation_type: str = "http_request",
        wait_seconds: float = 0.0,
        max_key_length: int | None = None,
        max_request_bytes: int | None = None,
        max_response_bytes: int = 1024 * 1024 - 4096,
        response_headers: Iterable[str] = DEFAULT_RESPONSE_HEADERS,
        fingerprint_headers: Iterable[str] = ("content-type",),
        record_server_errors: bool = False,
        release_statuses: Iterable[int] = DEFAULT_RELEASE_STATUSES,
        stream_types: Iterable[str] = ("text/event-stream",),
        replayed_header: str = "Idempotent-Replayed",
        recover_every_seconds: float | None = None,
        serve_requeued: bool = True,
        name: str | None = None,
    ) -> None:
        if not isinstance(layer, AsyncDurabilityLayer):
            raise ConfigError("layer", "DurableIdempotencyMiddleware needs an AsyncDurabilityLayer")
        self.app = app
        self.layer = layer
        self.methods = frozenset(_token("methods", m).upper() for m in methods)
        if not self.methods:
            raise ConfigError("methods", "name at least one method")
        self.paths = tuple(paths) if paths is not None else None
        if self.paths is not None and not all(isinstance(p, str) and p.startswith("/")
                                              for p in self.paths):
            raise ConfigError("paths", "path prefixes start with '/'")
        self.require_key = bool(require_key)
        self._header = _token("header", header).lower().encode("latin-1")
        if not (callable(tenant) or (isinstance(tenant, str) and tenant)):
            raise ConfigError("tenant", "a non-empty name or a function of the scope")
        self.tenant = tenant
        self.operation_type = _token("operation_type", operation_type)
        serve_requeued = serve_requeued and name is not None
        if name is None:
            name = tenant if isinstance(tenant, str) else self.operation_type
        if not (isinstance(name, str) and name and len(name.encode()) <= 256):
            raise ConfigError("name", f"expected a non-empty name (up to 256 bytes), got {name!r}")
        self.name = name
        self.wait_seconds = _number("wait_seconds", wait_seconds, 0.0, 3600.0)
        idem = layer.config.idempotency
        # The layer's max_key_length counts the key as the client sent it (keys
        # are ASCII: a character is a byte), not the %raw:<tenant>: scope, which
        # has room of its own (CALLER_SCOPE_MAX_BYTES): a fixed tenant must fit it.
        room = idem.max_key_length
        if isinstance(tenant, str):
            scope = len(str(IdempotencyKey.caller(tenant, "k", None)).encode()) - 1
            if scope > CALLER_SCOPE_MAX_BYTES:
                raise ConfigError("tenant", f"{tenant!r} is too long: its scope %raw:<tenant>: "
                                  f"is {scope} bytes, over {CALLER_SCOPE_MAX_BYTES}")
        if max_key_length is None:
            max_key_length = max(1, min(255, room))
        self.max_key_length = int(_number("max_key_length", max_key_length, 1, 4096))
        if self.max_key_length > room:
            raise ConfigError("max_key_length", f"must be at most the layer's "
                              f"IdempotencyConfig.max_key_length={idem.max_key_length}")
        # The stored request (method, path, query, headers, key) must fit beside
        # the body in what the claim and the DLQ keep.
        cap = min(idem.max_value_bytes, layer.config.dlq.max_payload_bytes) - _REQUEST_ROOM
        if max_request_bytes is None:
            max_request_bytes = max(0, min(1024 * 1024, cap))
        self.max_request_bytes = int(_number("max_request_bytes", max_request_bytes, 0, cap))
        self.max_response_bytes = int(_number(
            "max_response_bytes", max_response_bytes, 0, idem.max_value_bytes - _RESPONSE_ROOM))
        self._stored = frozenset(
            _token("response_headers", h).lower().encode("latin-1") for h in response_headers
        )
        if framing := sorted(h.decode() for h in self._stored & _NEVER_STORED):
            raise ConfigError("response_headers", f"{framing} are framing or hop-by-hop "
                              "headers: the replay sets its own")
        self.release_statuses = frozenset(int(_number("release_statuses", c, 100, 599))
                                          for c in release_statuses)
        self._stream_types = frozenset(
            _media_type("stream_types", t) for t in stream_types
        )
        self._fingerprinted = frozenset(
            _token("fingerprint_headers", h).lower().encode("latin-1")
            for h in fingerprint_headers
        )
        self.record_server_errors = bool(record_server_errors)
        self._replayed = _token("replayed_header", replayed_header).lower().encode("latin-1")
        self.recovery = (None if recover_every_seconds is None
                         else self._recovery(recover_every_seconds, serve_requeued))

    def _recovery(self, every_seconds: float, serve_requeued: bool) -> OrphanRecovery:
        """The recovery run in the lifespan; serving requeued requests, it is
        the only one on this layer for its (name, operation type)."""
        serving = _SERVING.setdefault(self.layer, weakref.WeakValueDictionary())
        if serve_requeued and serving.get((self.name, self.operation_type)) is not None:
            raise ConfigError("name", f"another middleware on this layer serves the requeued "
                              f"{self.operation_type!r} requests of name {self.name!r}: give "
                              "each its own name (or tenant)")
        recovery = OrphanRecovery(
            self.layer, every_seconds=every_seconds,
            requeue_handlers={self.operation_type: self.requeue_handler}
            if serve_requeued else None,
        )
        if serve_requeued:
            serving[(self.name, self.operation_type)] = self
        return recovery

    # -- ASGI --

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan" and self.recovery is not None:
            await self.app(scope, self._lifespan_receive(receive), send)
            return
        if kind != "http" or not self._applies(scope):
            await self.app(scope, receive, send)
            return
        if self.recovery is not None:
            self.recovery.start()
        values = [v for k, v in scope.get("headers", ()) if k.lower() == self._header]
        if not values:
            if self.require_key:
                await _problem(send, 400, "idempotency-key-missing", "Idempotency-Key missing",
                               "this request needs an Idempotency-Key header")
                return
            await self.app(scope, receive, send)
            return
        if len(values) > 1:
            await _problem(send, 400, "idempotency-key-invalid", "Idempotency-Key invalid",
                           "more than one Idempotency-Key header")
            return
        raw, why = _parse_key(values[0], self.max_key_length)
        if raw is None:
            await _problem(send, 400, "idempotency-key-invalid", "Idempotency-Key invalid", why)
            return
        declared = _content_length(scope)
        if declared == -1:
            await _problem(send, 400, "bad-content-length", "Bad Content-Length",
                           "the Content-Length header is not a number")
            return
        if declared is not None and declared > self.max_request_bytes:
            await _too_large(send, declared, self.max_request_bytes)
            return
        body = await _read_body(receive, self.max_request_bytes)
        if body is None:  # the client went away before its body arrived: nothing ran
            return
        if isinstance(body, int):
            await _too_large(send, body, self.max_request_bytes)
            return
        await self._run(scope, raw, body, receive, send)

    async def _run(
        self, scope: Scope, raw: str, body: bytes, receive: Receive, send: Send
    ) -> None:
        payload = self._payload(scope, raw, body)
        exchange = _Exchange(self, scope, body, receive, send)
        run: Callable[[OperationContext], Awaitable[Any]] = exchange.run
        try:
            tenant = self.tenant(scope) if callable(self.tenant) else self.tenant
            key = IdempotencyKey(raw, _fingerprint(payload))
            result: Any = await self.layer.execute(
                tenant, self.operation_type, payload, run,
                idempotency_key=key, wait=self.wait_seconds or None,
            )
        except _AppFailed as failed:
            exchange.raise_cancelled()  # (its response was not recorded either)
            if failed.error is None:  # its answer (5xx, 429...), not recorded: key released
                if exchange.client_gone and not exchange.complete:
                    _log.info("durability_http_client_gone", path=scope.get("path", ""),
                              operation_type=self.operation_type)
                else:
                    await exchange.flush()
                await exchange.finish_app()
                return
            # It raised before its response was complete, or the response is
            # malformed (a server would refuse to send it): the server answers.
            if exchange.app_task is not None and not exchange.app_task.done():
                exchange.app_task.cancel()
            raise failed.error from None
        except DurabilisError as refused:
            if exchange.ran:
                # It ran (ResultNotStored, OutcomeUnrecorded, LeaseLost...): its
                # client gets its own response; what is missing is the record.
                if not isinstance(refused, ResultNotStored):
                    _log.warning("durability_http_unrecorded", error=type(refused).__name__,
                                 operation_type=self.operation_type)
                exchange.raise_cancelled()
                await exchange.flush()
                await exchange.finish_app()
                return
            await self._refuse(send, refused)
            return
        except BaseException:
            # (Interrupted in fn, the application was cancelled there, and
            # waited for: never cancelled again here, in its cleanup.)
            if exchange.app_task is not None and not exchange.stopping:
                exchange.app_task.cancel()
            raise
        # Cancelled, but its application completed its response: recorded (a
        # retry gets it), then the cancellation goes on.
        exchange.raise_cancelled()
        if exchange.ran:
            await exchange.flush()
            await exchange.finish_app()
        else:
            await self._replay(send, result)

    async def _refuse(self, send: Send, refused: DurabilisError) -> None:
        """The answer to a request that did not run here."""
        if isinstance(refused, KeyReuseMismatch):
            await _problem(send, 422, "idempotency-key-reused", "Idempotency-Key reused",
                           "this key was already used with a different request")
        elif isinstance(refused, OperationInProgress):
            await _problem(send, 409, "request-in-progress", "Request in progress",
                           "a request with this key is being processed; retry later",
                           headers=[(b"retry-after", b"1")])
        elif isinstance(refused, (InvalidKey, InvalidPayload)):
            # Not the layer's text: it would show how keys are stored.
            await _problem(send, 400, "idempotency-key-invalid", "Idempotency-Key invalid",
                           "the key does not fit this key space (too long or not valid text)")
        elif isinstance(refused, PayloadTooLarge):
            await _problem(send, 413, "request-too-large", "Content Too Large",
                           f"the request as stored for recovery (body, path, query, "
                           f"fingerprinted headers) is {refused.size} bytes, over the limit "
                           f"of {refused.limit}")
        elif isinstance(refused, ResultNotStored):
            await _problem(send, 410, "response-not-stored", "Response not stored",
                           f"a request with this key completed; its response was not stored "
                           f"({refused.reason})", replayed=self._replayed)
        elif isinstance(refused, WrongEventLoop):
            # A deployment error (a store made for another event loop), not a
            # passing outage: a retry would meet it again.
            await _problem(send, 500, "idempotency-misconfigured", "Internal Server Error",
                           "the idempotency store belongs to another event loop than this "
                           "request's (make the store on the server's own loop)")
        else:  # StorageUnavailable, LayerClosed...: nothing ran (fail closed)
            await _problem(send, 503, "idempotency-unavailable", "Service Unavailable",
                           f"the idempotency store cannot take this request now "
                           f"({type(refused).__name__})", headers=[(b"retry-after", b"1")])

    async def _replay(self, send: Send, result: Any) -> None:
        if not (isinstance(result, dict) and isinstance(result.get("s"), int)):
            await _problem(send, 500, "stored-result-invalid", "Stored result invalid",
                           "the result stored under this key is not an HTTP response")
            return
        body = result.get("b")
        if body is None:
            await _problem(send, 410, "response-not-stored", "Response not stored",
                           f"a request with this key completed with status {result['s']}; its "
                           f"response ({result.get('n', 0)} bytes) was too large to store",
                           replayed=self._replayed)
            return
        headers = [(bytes(k), bytes(v)) for k, v in result.get("h", ())]
        if result["s"] not in _NO_BODY_STATUSES:
            headers.append((b"content-length", str(len(body)).encode()))
        headers.append((self._replayed, b"true"))
        await send({"type": "http.response.start", "status": result["s"], "headers": headers})
        await send({"type": "http.response.body", "body": bytes(body)})

    # -- recovery of parked requests --

    def owns(self, record: DlqRecord) -> bool:
        """Whether ``record`` is a request this middleware parked (its ``name``).

        A record parked before requests carried the name is this middleware's
        when its agent is this middleware's fixed tenant (any, for a tenant
        function)."""
        p = record.original_operation
        if isinstance(p, dict) and "i" in p:
            return bool(p["i"] == self.name)
        return not isinstance(self.tenant, str) or record.agent_id == self.tenant

    @property
    def requeue_handler(self) -> Callable[[OperationContext], Awaitable[dict[str, Any]]]:
        """:meth:`replay_stored`, declining the records of another middleware:
        the ``fn`` for ``layer.replay_requeued({mw.operation_type: mw.requeue_handler})``
        (a declined record is deferred: nothing counted, its mark kept)."""

        async def replay(ctx: OperationContext) -> dict[str, Any]:
            return await self.replay_stored(ctx)

        replay.accepts_record = self.owns  # type: ignore[attr-defined]
        return replay

    async def replay_stored(self, ctx: OperationContext) -> dict[str, Any]:
        """Run a parked request again, without a client, from what its claim kept.

        The ``fn`` for ``layer.replay(dlq_id, mw.replay_stored)`` and
        ``layer.replay_pending(mw.replay_stored, operation_type="http_request")``:
        it rebuilds the request (method, path, query, the fingerprinted headers,
        body, the ``Idempotency-Key``) and records the application's response, so
        the client's next retry gets it as a replay. A request that had in fact
        completed is answered from its record and not run again. Only a
        response below 400 is recorded: the replay carries no credentials, so a
        refusal fails the replay (the record stays pending) instead of becoming
        the key's answer.

        A request parked under another ``name`` is replayed all the same when
        asked by hand (a deploy that renamed the middleware); only the fleet's
        requeue pass (:attr:`requeue_handler`) declines it.

        Raises:
            InvalidPayload: The parked operation is not an HTTP request.
        """
        p = ctx.payload
        if not (isinstance(p, dict) and {"m", "p", "q", "h", "b", "k"} <= p.keys()):
            raise InvalidPayload("the parked operation is not an HTTP request")
        headers = [(bytes(k), bytes(v)) for k, v in p["h"]]
        headers.append((self._header, str(p["k"]).encode("latin-1")))
        scope: Scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": p["m"], "scheme": "http", "path": p["p"],
            "raw_path": bytes(p.get("rp") or str(p["p"]).encode("utf-8")),
            "query_string": bytes(p["q"]),
            "root_path": p.get("r", ""), "headers": headers, "client": None, "server": None,
            "extensions": {}, "state": {},
        }
        exchange = _Exchange(self, scope, bytes(p["b"]), None, None)
        try:
            record = await exchange.run(ctx)
        except _AppFailed:
            exchange.raise_cancelled()  # cancelled, and nothing to record: raised now
            raise
        if exchange.app_task is not None:  # its background work goes on, errors logged
            exchange.app_task.add_done_callback(_log_app_end)
        if exchange.cancelled is not None:
            _cancel_again()
        if record["s"] >= 400:
            # Without its client's other headers (credentials are never kept), a
            # refusal may be an artefact of the replay: not recorded, so the
            # client's own retry still runs it; the DLQ record stays pending.
            raise _AppFailed(RuntimeError(
                f"the replayed request was answered {record['s']}; not recorded (a "
                f"replay carries only the fingerprinted headers)"), record["s"])
        return record

    # -- helpers --

    def _applies(self, scope: Scope) -> bool:
        if scope.get("method", "") not in self.methods:
            return False
        if self.paths is None:
            return True
        path = scope.get("path", "")
        # Whole segments: "/pay" guards "/pay" and "/pay/x", not "/payments".
        return any(path == prefix or path.startswith(prefix.rstrip("/") + "/")
                   for prefix in self.paths)

    def _payload(self, scope: Scope, raw: str, body: bytes) -> dict[str, Any]:
        path = scope.get("path", "")
        return {
            "m": scope["method"],
            "p": path,
            # As sent: "/x/%FF" and "/x/%FE" decode alike, they are not one request.
            "rp": bytes(scope.get("raw_path") or path.encode("utf-8", "surrogateescape")),
            "r": scope.get("root_path", ""),
            "q": bytes(scope.get("query_string", b"")),
            "h": [[k.lower(), v] for k, v in scope.get("headers", ())
                  if k.lower() in self._fingerprinted],
            "b": body,
            "k": raw,
            "i": self.name,  # who parked it: replayed by this middleware only
        }

    def _lifespan_receive(self, receive: Receive) -> Receive:
        recovery = self.recovery
        assert recovery is not None

        async def wrapped() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.startup":
                recovery.start()
            elif message.get("type") == "lifespan.shutdown":
                await recovery.stop()
            return message

        return wrapped


def _cancel_again() -> None:
    """Ask again for the cancellation the current task caught (a replay whose
    application completed its response after it): the layer records the
    outcome (a shielded step), then raises it; never swallowed. Counted once:
    ``asyncio.timeout`` and anyio's scopes match their own request to it."""
    this = asyncio.current_task()
    if this is None:
        return
    this.cancel()
    cancelling = getattr(this, "cancelling", None)  # (Python 3.11+)
    if cancelling is not None and cancelling() > 1:
        this.uncancel()  # type: ignore[attr-defined]


class _Exchange:
    """One run of the application for one request. The application runs in a
    task of its own: its response is buffered (up to the limit) until the layer
    has recorded it, then flushed; what the application does after its response
    is complete (background tasks) neither delays nor undoes the record."""

    def __init__(
        self, mw: DurableIdempotencyMiddleware, scope: Scope, body: bytes,
        receive: Receive | None, send: Send | None,
    ) -> None:
        self.mw = mw
        self.scope = scope
        self.body = body
        self.receive = receive
        self.send = send
        self.ran = False
        self.complete = False
        self.streamed = False  # sent to its client as it came (not stored)
        self.status = 0
        self.start: Message | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.declared: int | None = None
        self._body_given = False
        self._done = asyncio.Event()
        self.app_task: asyncio.Task[None] | None = None
        # The cancellation of a request whose application completed its
        # response all the same: raised once that response is recorded.
        self.cancelled: BaseException | None = None
        self.stopping = False  # its application was cancelled (once: its cleanup runs on)
        self.client_gone = False  # its application was told the client disconnected

    async def run(self, ctx: OperationContext) -> dict[str, Any]:
        """The layer's ``fn``: run the application until its response is
        complete; return what to record. Once per request: the layer never
        gets to run the application again (a retry is the client's)."""
        if self.ran:
            raise _AppFailed(RuntimeError("the application already ran for this request"))
        self.ran = True
        scope = dict(self.scope)
        extensions = dict(scope.get("extensions") or {})
        for name in _HIDDEN_EXTENSIONS:
            extensions.pop(name, None)
        scope["extensions"] = extensions
        # The task copies this context: current_operation() works in the handler.
        try:  # (an application that raises as it is called, before any await, too)
            task = asyncio.ensure_future(self.mw.app(scope, self._app_receive, self._app_send))
        except Exception as exc:
            raise _AppFailed(exc) from None
        self.app_task = task
        task.add_done_callback(lambda _t: self._done.set())
        try:
            await self._done.wait()
        except BaseException as interruption:
            task.cancel()  # interrupted before the response was complete
            self.stopping = True
            self._done.set()  # (a replay's application reading its request again: disconnected)
            # The key is given back only once the application stopped (its
            # cleanup): else a retry of the same key could run it again beside it.
            await self._ended(task)
            if self.complete and isinstance(interruption, asyncio.CancelledError):
                # It completed its response all the same (finished what it had
                # started): recorded like any, then the cancellation is raised.
                self.cancelled = interruption
                return self._outcome()
            raise
        if not self.complete:  # the application ended (raised or returned) first
            error = None if task.cancelled() else task.exception()
            if error is None and self.client_gone:
                # It saw its client disconnect and stopped (a stream cut short):
                # the server's giving up, not the application's error.
                raise _AppFailed(None)
            raise _AppFailed(error or RuntimeError(
                "the application returned without a complete response"))
        return self._outcome()

    def raise_cancelled(self) -> None:
        """Raise the request's cancellation, if its application completed its
        response after it (see :meth:`run`): nothing more is sent."""
        if self.cancelled is not None:
            raise self.cancelled

    async def _ended(self, task: asyncio.Task[None]) -> None:
        """Wait for the cancelled application to end (the claim is renewed
        meanwhile), up to the claim's lease: an application still running then
        is left to run, and the key is released (logged). One more cancellation
        is waited through too. anyio's cancel scopes, which cancel again at
        every loop turn, are shielded for the wait when anyio is in use; a
        third plain cancellation ends the wait (the key is released at once)."""
        anyio = sys.modules.get("anyio")  # only if the application uses it already
        if anyio is not None:
            try:
                shield = anyio.CancelScope(shield=True)
            except Exception:  # not in a task anyio can shield
                shield = None
            if shield is not None:
                with shield:  # its scopes' cancellations wait for the end of it
                    await self._wait_for_end(task)
                return
        await self._wait_for_end(task)

    async def _wait_for_end(self, task: asyncio.Task[None]) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + float(self.mw.layer.config.idempotency.in_progress_ttl_seconds)
        again = 0
        while not task.done():
            left = end - loop.time()
            if left <= 0 or again > 1:
                _log.warning("durability_http_app_not_stopped", path=self.scope.get("path", ""),
                             reason="lease" if left <= 0 else "cancelled again")
                return
            try:
                await asyncio.wait({task}, timeout=left)
            except asyncio.CancelledError:
                again += 1  # (the first cancellation is raised once it ended)

    def _outcome(self) -> dict[str, Any]:
        """The record of a complete response, or :class:`_AppFailed` to release the key."""
        if self.declared is not None and self.size != self.declared and (
                self.status not in _NO_BODY_STATUSES):
            raise _AppFailed(RuntimeError(
                f"the response body is {self.size} bytes, its Content-Length says "
                f"{self.declared}"))
        if (self.status >= 500 and not self.mw.record_server_errors) or (
                self.status in self.mw.release_statuses):
            raise _AppFailed(None, self.status)
        if self.streamed or self.size > self.mw.max_response_bytes:
            return {"s": self.status, "h": [], "b": None, "n": self.size}
        assert self.start is not None
        headers = [[k, v] for k, v in self.start["headers"]
                   if bytes(k).lower() in self.mw._stored]
        return {"s": self.status, "h": headers, "b": b"".join(self.chunks)}

    async def finish_app(self) -> None:
        """Wait for the application to end (its background work); its error,
        once its response is recorded and sent, goes to the server as usual."""
        task = self.app_task
        if task is not None:
            await task

    async def _app_receive(self) -> Message:
        if not self._body_given:
            self._body_given = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        if self.receive is None:  # a replay has no client: it "leaves" once answered
            await self._done.wait()
            return {"type": "http.disconnect"}
        message = await self.receive()
        if message.get("type") == "http.disconnect":
            self.client_gone = True
        return message

    async def _app_send(self, message: Message) -> None:
        kind = message.get("type")
        if self.complete:
            raise RuntimeError(f"the application sent {kind!r} after its response was complete")
        if kind == "http.response.start":
            if self.start is not None:
                raise RuntimeError("the application started its response twice")
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
            self.start = {**message, "headers": headers}
            self.status = int(message["status"])
            self.declared = _declared_length(headers)
            if self.send is not None and _media_type_of(headers) in self.mw._stream_types:
                self.streamed = True  # a stream: never held back, never stored
                await self.send(self.start)
            return
        if kind != "http.response.body":
            return  # nothing else is part of a recorded response
        if self.start is None:
            raise RuntimeError("the application sent a body before starting its response")
        chunk = bytes(message.get("body", b""))
        self.size += len(chunk)
        more = bool(message.get("more_body", False))
        if self.streamed:
            assert self.send is not None
            await self.send({"type": "http.response.body", "body": chunk, "more_body": more})
        elif self.size <= self.mw.max_response_bytes:
            self.chunks.append(chunk)
        elif self.send is None:  # a replay: no one to stream to; count, keep nothing
            self.chunks = []
        elif not more:  # complete: sent whole once the layer has its outcome
            self.chunks.append(chunk)
        else:
            # Over the limit with more to come: it will not be stored, so its
            # client gets it as it comes (a long stream is not held in memory).
            self.streamed = True
            await self.send(self.start)
            self.chunks.append(chunk)
            await self.send({"type": "http.response.body", "body": b"".join(self.chunks),
                             "more_body": True})
            self.chunks = []
        if not more:
            self.complete = True
            self._done.set()

    async def flush(self) -> None:
        """Send the application's own response (all its headers) to its client."""
        if self.streamed or self.send is None or self.start is None:
            return
        await self.send(self.start)
        await self.send({"type": "http.response.body", "body": b"".join(self.chunks)})
        self.chunks = []


class OrphanRecovery:
    """Run ``layer.recover_orphans`` periodically, one replica per period.

    Every replica may run one; each period, the first to take the lease
    (``<ns>:layer:{layer}:lease:recover_orphans``, as long as the period)
    recovers and the others skip. A request whose worker died (SIGKILL, OOM)
    is parked in the DLQ as ``WORKER_LOST`` and its key released, so the
    client's retry runs it again instead of waiting out the lease;
    :meth:`DurableIdempotencyMiddleware.replay_stored` can replay the parked
    record without the client.

    Beside it, on a schedule of its own, the DLQ's expired records are cleaned
    up (``layer.dlq.cleanup_due``: one replica per period, through the lease
    ``<ns>:dlq:{dlq}:lease:cleanup``), so a pending record that expires
    unreplayed is reported (event ``durability_dlq_expired``, an ``expired``
    log entry, ``DlqStats.expired``) even when nothing new is parked.

    With ``requeue_handlers`` (operation type -> the ``fn`` the application
    replays it with, as given to ``layer.replay``), this replica also serves
    the records an operator marked for redelivery (``durabilis dlq requeue``):
    every ``requeue_every_seconds`` it runs ``layer.replay_requeued`` over
    those types. Every replica with handlers runs it at once, no lease: each
    record is claimed first, so one replica replays it, under the breaker,
    pacing and exactly-once rules of any replay. Records of a type without a
    handler here are left to the replicas that have one.

    Args:
        layer: The layer whose orphans to recover.
        every_seconds: The period (and the lease).
        limit: Most orphans recovered per period.
        holder: The name kept in the lease (default: host and pid).
        dlq_cleanup_every_seconds: The DLQ cleanup's period (and lease);
            ``None`` turns it off.
        requeue_handlers: Operation type -> replay ``fn``; ``None`` (or empty):
            this replica serves no requeued record.
        requeue_every_seconds: The period of the requeue pass.
        requeue_limit: Most handlers one requeue pass runs.
        requeue_max_per_second: Most handlers started per second (``None``: no pacing).
    """

    def __init__(
        self,
        layer: AsyncDurabilityLayer,
        *,
        every_seconds: float = 10.0,
        limit: int = 1000,
        holder: str | None = None,
        dlq_cleanup_every_seconds: float | None = 60.0,
        requeue_handlers: Mapping[str, Callable[[OperationContext], Any]] | None = None,
        requeue_every_seconds: float = 5.0,
        requeue_limit: int = 100,
        requeue_max_per_second: float | None = None,
    ) -> None:
        self.layer = layer
        if requeue_handlers is not None and not isinstance(requeue_handlers, Mapping):
            raise ConfigError("requeue_handlers", "must map operation types to replay functions")
        self.requeue_handlers = dict(requeue_handlers or {})
        for op, fn in self.requeue_handlers.items():
            if not isinstance(op, str) or not op or not callable(fn):
                raise ConfigError("requeue_handlers",
                                  f"must map operation types to callables, got {op!r}: {fn!r}")
        self.requeue_every_seconds = _number("requeue_every_seconds", requeue_every_seconds,
                                             0.05, 86400.0)
        self.requeue_limit = int(_number("requeue_limit", requeue_limit, 1, 1_000_000))
        self.requeue_max_per_second = None if requeue_max_per_second is None else (
            _number("requeue_max_per_second", requeue_max_per_second, 0.001, 1_000_000.0)
        )
        self.requeue_runs = 0
        self.requeue_replayed = 0
        self.requeue_failed = 0
        self.requeue_error: str | None = None
        self.every_seconds = _number("every_seconds", every_seconds, 0.05, 86400.0)
        self.dlq_cleanup_every_seconds = None if dlq_cleanup_every_seconds is None else (
            _number("dlq_cleanup_every_seconds", dlq_cleanup_every_seconds, 0.05, 86400.0)
        )
        self.cleanup_runs = 0
        self.cleanup_skipped = 0
        self.cleanup_removed = 0
        self.cleanup_expired = 0
        self.cleanup_error: str | None = None
        self.limit = int(_number("limit", limit, 1, 1_000_000))
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        self.runs = 0
        self.skipped = 0
        self.recovered = 0
        self.last_run_at: float | None = None
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._lease = layer.store.keys.layer("lease", "recover_orphans")

    async def run_once(self) -> list[str] | None:
        """Take this period's lease and recover; ``None`` when another replica has it.

        Returns:
            The DLQ ids of the orphans parked (possibly none).

        Raises:
            StorageUnavailable: Redis is down.
        """
        ms = max(1, int(self.every_seconds * 1000))
        taken = await self.layer.store.run(
            ScriptCall("layer_lease", [self._lease], [self.holder, ms])
        )
        if not int(taken or 0):
            self.skipped += 1
            return None
        parked = await self.layer.recover_orphans(self.limit)
        self.runs += 1
        self.recovered += len(parked)
        self.last_run_at = time.time()
        return parked

    async def cleanup_once(self) -> int | None:
        """Take this period's DLQ cleanup lease and clean up; ``None`` when
        another replica has it (or the cleanup is turned off).

        Returns:
            The DLQ records removed (each pending one reported as expired).

        Raises:
            StorageUnavailable: Redis is down.
        """
        if self.dlq_cleanup_every_seconds is None:
            return None
        done = await self.layer.dlq.cleanup_due(
            self.dlq_cleanup_every_seconds, holder=self.holder
        )
        if done is None:
            self.cleanup_skipped += 1
            return None
        self.cleanup_runs += 1
        self.cleanup_removed += done.removed
        self.cleanup_expired += len(done.expired)
        return done.removed

    async def requeue_once(self) -> ReplaySummary | None:
        """One pass over the requeued records this replica has handlers for
        (``layer.replay_requeued``); ``None`` when it has none.

        Raises:
            StorageUnavailable: Redis is down.
        """
        if not self.requeue_handlers:
            return None
        summary = await self.layer.replay_requeued(
            self.requeue_handlers, self.requeue_limit, self.requeue_max_per_second
        )
        self.requeue_runs += 1
        self.requeue_replayed += summary.replayed
        self.requeue_failed += summary.failed
        return summary

    def start(self) -> None:
        """Start the periodic task on the running loop (no-op when running, or
        once :meth:`stop` was called: a request after shutdown does not restart it)."""
        if self._stopped or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop the periodic task and wait for it."""
        self._stopped = True
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # The task's own CancelledError is returned, not raised; a cancellation
        # of the caller itself still propagates.
        await asyncio.gather(task, return_exceptions=True)

    async def _loop(self) -> None:
        clean_every = self.dlq_cleanup_every_seconds
        requeue_every = self.requeue_every_seconds if self.requeue_handlers else None
        next_recover = next_clean = next_requeue = time.monotonic()
        while not self._stopped:  # (stop() stays final should a cancellation be lost)
            if time.monotonic() >= next_recover:
                try:
                    await self.run_once()
                    self.last_error = None
                except Exception as exc:  # Redis down (or a bug): try again next period
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    _log.warning("durability_recovery_failed", error=type(exc).__name__)
                next_recover = time.monotonic() + self.every_seconds
            if clean_every is not None and time.monotonic() >= next_clean:
                try:
                    await self.cleanup_once()
                    self.cleanup_error = None
                except Exception as exc:  # the same: next period
                    self.cleanup_error = f"{type(exc).__name__}: {exc}"
                    _log.warning("durability_dlq_cleanup_failed", error=type(exc).__name__)
                next_clean = time.monotonic() + clean_every
            if requeue_every is not None and time.monotonic() >= next_requeue:
                try:
                    await self.requeue_once()
                    self.requeue_error = None
                except Exception as exc:  # the same: next period
                    self.requeue_error = f"{type(exc).__name__}: {exc}"
                    _log.warning("durability_dlq_requeue_pass_failed", error=type(exc).__name__)
                next_requeue = time.monotonic() + requeue_every
            wake = next_recover if clean_every is None else min(next_recover, next_clean)
            if requeue_every is not None:
                wake = min(wake, next_requeue)
            await asyncio.sleep(max(0.0, wake - time.monotonic()))

    async def health(self) -> dict[str, Any]:
        """What a health endpoint shows: this replica's recovery and the fleet's totals.

        ``ok`` is false when the last recovery failed or Redis cannot be read.
        """
        report: dict[str, Any] = {
            "ok": self.last_error is None and self.cleanup_error is None
            and self.requeue_error is None,
            "recovery": {
                "running": self._task is not None and not self._task.done(),
                "every_seconds": self.every_seconds, "runs": self.runs,
                "skipped": self.skipped, "recovered": self.recovered,
                "last_run_at": self.last_run_at, "last_error": self.last_error,
            },
            "dlq_cleanup": {
                "every_seconds": self.dlq_cleanup_every_seconds, "runs": self.cleanup_runs,
                "skipped": self.cleanup_skipped, "removed": self.cleanup_removed,
                "expired": self.cleanup_expired, "last_error": self.cleanup_error,
            },
            "dlq_requeue": {
                "operation_types": sorted(self.requeue_handlers),
                "every_seconds": self.requeue_every_seconds, "runs": self.requeue_runs,
                "replayed": self.requeue_replayed, "failed": self.requeue_failed,
                "last_error": self.requeue_error,
            },
        }
        try:
            report["layer"] = dataclasses.asdict(await self.layer.stats())
        except DurabilisError as exc:
            report["ok"] = False
            report["layer"] = None
            report["error"] = type(exc).__name__
        return report


def _token(field: str, value: object) -> str:
    if not isinstance(value, str) or not value or not value.isascii() or any(
        c in value for c in ' \t\r\n:"(),/;<=>?@[\\]{}'
    ):
        raise ConfigError(field, f"expected an HTTP token, got {value!r}")
    return value


def _number(field: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigError(field, f"expected a number in [{low}, {high}], got {value!r}")
    return float(value)


def _parse_key(value: bytes, limit: int) -> tuple[str | None, str]:
    """The key of a header value: an sf-string (``"..."``, as the draft
    writes it) or, as most clients send it, the bare text."""
    try:
        text = value.decode("ascii").strip(" \t")
    except UnicodeDecodeError:
        return None, "the key must be printable ASCII"
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        inner, out, i = text[1:-1], [], 0
        while i < len(inner):
            c = inner[i]
            if c == "\\":
                if i + 1 >= len(inner) or inner[i + 1] not in '"\\':
                    return None, "bad escape in the quoted key"
                c, i = inner[i + 1], i + 1
            elif c == '"':
                return None, "unescaped quote in the quoted key"
            out.append(c)
            i += 1
        text = "".join(out)
    elif "," in text:
        return None, "more than one key (a list): send one Idempotency-Key"
    if not text:
        return None, "the key is empty"
    if any(not (0x20 <= ord(c) <= 0x7E) for c in text):
        return None, "the key must be printable ASCII"
    if len(text) > limit:
        return None, f"the key is {len(text)} characters, over the limit of {limit}"
    return text, ""


def _content_length(scope: Scope) -> int | None:
    """The declared request body length; ``None`` when absent, ``-1`` when
    malformed (not digits, or several headers that disagree)."""
    return _declared_length(scope.get("headers", ()))


def _declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    values = {bytes(v).strip() for k, v in headers if bytes(k).lower() == b"content-length"}
    if not values:
        return None
    if len(values) > 1 or not all(v.isdigit() for v in values):
        return -1
    return int(values.pop())


def _media_type_of(headers: Iterable[tuple[bytes, bytes]]) -> str:
    for k, v in headers:
        if k.lower() == b"content-type":
            return bytes(v).split(b";", 1)[0].strip().lower().decode("latin-1")
    return ""


def _media_type(field: str, value: object) -> str:
    if not isinstance(value, str) or value.count("/") != 1 or not value.isascii():
        raise ConfigError(field, f"expected a media type like 'text/event-stream', got {value!r}")
    return value.strip().lower()


def _log_app_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        _log.error("durability_http_app_failed_after_response",
                   error=type(task.exception()).__name__)


async def _read_body(receive: Receive, limit: int) -> bytes | int | None:
    """The whole body, or its size so far once over ``limit``, or ``None`` on disconnect."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return size
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _fingerprint(payload: dict[str, Any]) -> str:
    """SHA-256 over the request's parts, each length-prefixed (no two requests
    share an encoding); ``h``-prefixed so it never equals a payload fingerprint."""
    digest = hashlib.sha256()
    parts: list[bytes] = [payload["m"].encode(), payload["rp"], payload["q"]]
    for k, v in payload["h"]:
        parts += [k, v]
    parts.append(payload["b"])
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return "h" + digest.hexdigest()[1:]


async def _problem(
    send: Send, status: int, slug: str, title: str, detail: str, *,
    headers: Sequence[tuple[bytes, bytes]] = (), replayed: bytes | None = None,
) -> None:
    """An ``application/problem+json`` answer (RFC 9457)."""
    body = json.dumps(
        {"type": _PROBLEM + slug, "title": title, "status": status, "detail": detail}
    ).encode()
    out = [(b"content-type", b"application/problem+json"),
           (b"content-length", str(len(body)).encode()), *headers]
    if replayed is not None:
        out.append((replayed, b"true"))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})


async def _too_large(send: Send, size: int, limit: int) -> None:
    await _problem(send, 413, "request-too-large", "Content Too Large",
                   f"the request body is {size} bytes, over the limit of {limit} for a "
                   f"request with an Idempotency-Key")
