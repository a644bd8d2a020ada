"""The ASGI middleware: :class:`DurableIdempotencyMiddleware`."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from durabilis.dlq import DlqRecord
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
from durabilis.http._common import (
    _NEVER_STORED,
    _NO_BODY_STATUSES,
    _REQUEST_ROOM,
    _RESPONSE_ROOM,
    DEFAULT_RELEASE_STATUSES,
    DEFAULT_RESPONSE_HEADERS,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    _AppFailed,
    _fingerprint,
    _length_of,
    _log,
    _log_app_end,
    _media_type,
    _number,
    _parse_key,
    _problem,
    _read_body,
    _scan_headers,
    _token,
    _too_large,
)
from durabilis.http._exchange import _Exchange
from durabilis.http._recovery import OrphanRecovery
from durabilis.idempotency import CALLER_SCOPE_MAX_BYTES, IdempotencyKey
from durabilis.layer import AsyncDurabilityLayer, OperationContext

_SERVING: weakref.WeakKeyDictionary[
    AsyncDurabilityLayer, weakref.WeakValueDictionary[tuple[str, str], DurableIdempotencyMiddleware]
] = weakref.WeakKeyDictionary()
"""Per layer, the middleware serving each (name, operation type)'s requeued requests."""


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

    Attributes:
        stored_headers: The response headers stored and replayed (lower-case
            bytes), from ``response_headers``.
        stream_types: The media types passed through unbuffered, from
            ``stream_types`` (normalised).

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
        self.stored_headers = frozenset(
            _token("response_headers", h).lower().encode("latin-1") for h in response_headers
        )
        if framing := sorted(h.decode() for h in self.stored_headers & _NEVER_STORED):
            raise ConfigError("response_headers", f"{framing} are framing or hop-by-hop "
                              "headers: the replay sets its own")
        self.release_statuses = frozenset(int(_number("release_statuses", c, 100, 599))
                                          for c in release_statuses)
        self.stream_types = frozenset(
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
        values, lengths = _scan_headers(scope, self._header)
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
        declared = _length_of(lengths)
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
    if this.cancelling() > 1:
        this.uncancel()
