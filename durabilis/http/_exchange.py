"""One run of the application for one request (:class:`_Exchange`)."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from durabilis.http._common import (
    _HIDDEN_EXTENSIONS,
    _NO_BODY_STATUSES,
    Message,
    Receive,
    Scope,
    Send,
    _AppFailed,
    _length_of,
    _log,
    _media_type_in,
)
from durabilis.layer import OperationContext

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from durabilis.http._middleware import DurableIdempotencyMiddleware

# Python 3.12+: the application's task takes its first step at once (as
# ``asyncio.eager_task_factory`` does), so a handler that answers without
# waiting on anything has its response before this request's task would have
# yielded: two turns of the event loop fewer per request. Its own task all the
# same (``current_task()``, cancel scopes, its context); earlier Pythons
# schedule that first step.
_EAGER: dict[str, Any] = {"eager_start": True} if sys.version_info >= (3, 12) else {}


def _app_task(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """The application's own task (eager where the loop has no task factory of its own)."""
    loop = asyncio.get_running_loop()
    if _EAGER and loop.get_task_factory() is None:
        return asyncio.Task(coro, loop=loop, **_EAGER)
    return loop.create_task(coro)


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
        self.stored: list[list[bytes]] = []  # the response headers a record keeps
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
            started = self.mw.app(scope, self._app_receive, self._app_send)
            if not inspect.isawaitable(started):
                raise TypeError("An asyncio.Future, a coroutine or an awaitable is required")
        except Exception as exc:
            raise _AppFailed(exc) from None
        task = _app_task(self._until_done(started))
        self.app_task = task
        try:
            await self._done.wait()
        except BaseException as interruption:
            task.cancel()  # interrupted before the response was complete
            if inspect.iscoroutine(started) and (
                    inspect.getcoroutinestate(started) == inspect.CORO_CREATED):
                started.close()  # (its task cancelled before its first step: never awaited)
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

    async def _until_done(self, app: Awaitable[None]) -> None:
        """The application, then (however it ended) the signal :meth:`run` waits on."""
        try:
            await app
        finally:
            self._done.set()

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
        body = b"".join(self.chunks)
        self.chunks = [body]  # (joined once: flush sends the same bytes)
        return {"s": self.status, "h": self.stored, "b": body}

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

    def _started(self, message: Message) -> bool:
        """Keep the response's start (headers as bytes; those a record stores;
        its declared length); whether its media type is one streamed through."""
        headers: list[tuple[bytes, bytes]] = []
        stored = self.mw.stored_headers
        lengths: list[bytes] = []
        content_type: bytes | None = None  # (the first one)
        for k, v in message.get("headers", ()):  # (one pass)
            pair = (bytes(k), bytes(v))
            headers.append(pair)
            name = pair[0].lower()
            if name in stored:
                self.stored.append(list(pair))
            elif name == b"content-length":
                lengths.append(pair[1])
            if content_type is None and name == b"content-type":
                content_type = pair[1]
        self.start = {**message, "headers": headers}
        self.status = int(message["status"])
        self.declared = _length_of(lengths)
        return content_type is not None and _media_type_in(content_type) in self.mw.stream_types

    async def _app_send(self, message: Message) -> None:
        kind = message.get("type")
        if self.complete:
            raise RuntimeError(f"the application sent {kind!r} after its response was complete")
        if kind == "http.response.start":
            if self.start is not None:
                raise RuntimeError("the application started its response twice")
            if self._started(message) and self.send is not None:
                self.streamed = True  # a stream: never held back, never stored
                assert self.start is not None
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
