"""One run of the application for one request (:class:`_Exchange`)."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any

from durabilis.http._common import (
    _HIDDEN_EXTENSIONS,
    _NO_BODY_STATUSES,
    Message,
    Receive,
    Scope,
    Send,
    _AppFailed,
    _declared_length,
    _log,
    _media_type_of,
)
from durabilis.layer import OperationContext

if TYPE_CHECKING:
    from durabilis.http._middleware import DurableIdempotencyMiddleware


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
                   if bytes(k).lower() in self.mw.stored_headers]
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
            if self.send is not None and _media_type_of(headers) in self.mw.stream_types:
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
