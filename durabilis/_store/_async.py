"""The asyncio store: :class:`AsyncStore`, bound to the event loop of its first call."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import redis
from redis._parsers.hiredis import _AsyncHiredisParser

from durabilis._acks import Acks
from durabilis._autopipe import AutoPipeline
from durabilis._cancel import cancels as _cancels
from durabilis._cancel import resurface as _resurface
from durabilis._fork import reset_in_child
from durabilis._scripts import Replies, ScriptCall, fuse
from durabilis._store import _base
from durabilis._store._base import Gates, Waves
from durabilis._store._errors import map_error
from durabilis.errors import (
    DurabilisError,
    StorageUnavailable,
    WrongEventLoop,
)


def _cluster_max_connections(client: Any) -> int:
    """Connections per node of redis-py's async cluster client (its ``max_connections``)."""
    n = (getattr(client, "connection_kwargs", None) or {}).get("max_connections")
    return n if isinstance(n, int) and n > 0 else 100


def _ready_now(conn: Any) -> bool:
    """Whether a connection is connected with nothing unread: the check the
    pool's ``ensure_connection`` makes (redis-py's ``can_read`` for hiredis),
    without its awaits. ``False`` sends it the pool's own way, which
    reconnects or raises."""
    parser = conn._parser
    if type(parser) is not _AsyncHiredisParser or not conn.is_connected:
        return False
    stream, reader = getattr(parser, "_stream", None), getattr(parser, "_reader", None)
    return (
        parser._connected and reader is not None and stream is not None
        and not reader.has_data() and not stream.at_eof() and stream.exception() is None
        and not stream._buffer
    )


class _ReadyAsyncPool(redis.asyncio.BlockingConnectionPool):
    """redis-py's asyncio blocking pool, with the connections given back kept
    ready in a list in front of it (the asyncio twin of the sync store's ready
    pool): taking one and giving it back costs no lock, condition, timeout or
    observability hook (~12 us a round with redis-py 8).

    What the pool promises stays. A ready connection stays counted in use, so
    ``max_connections`` bounds them all, and closing the pool closes it; it is
    checked as the pool checks any it hands out (anything unread, or the
    server's close, sends it the pool's own way, which reconnects it). While a
    caller is inside the pool's own ``get_connection`` (it may be waiting for
    a connection), every connection goes back the pool's own way, which wakes
    it: none waits while one sits ready."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._ready: list[Any] = []
        self._inside = 0  # callers inside the pool's own get_connection
        super().__init__(*args, **kwargs)

    def reset(self) -> None:
        self._ready = []
        super().reset()  # type: ignore[no-untyped-call]

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        ready = self._ready
        if ready:
            conn = ready.pop()
            if _ready_now(conn):
                return conn
            try:
                await self.ensure_connection(conn)  # reconnects it, or raises
            except BaseException:
                await super().release(conn)
                raise
            return conn
        self._inside += 1
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        finally:
            self._inside -= 1

    async def release(self, connection: Any) -> None:
        if connection in self._ready:  # (given back twice: kept once, never two users)
            return
        if (
            not self._inside and connection in self._in_use_connections
            and not connection.should_reconnect() and _ready_now(connection)
        ):
            self._ready.append(connection)
            return
        await super().release(connection)


class _Home:
    """The event loop an :class:`AsyncStore` runs on, set by its first call.
    Shared with the store's ``with_acks`` twins, which share its connections."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()
        self.forked = False  # bound in a parent process: its connections are the parent's
        reset_in_child(self)

    def after_fork_in_child(self) -> None:
        # redis-py's asyncio pools do not check the pid (its sync ones do): a
        # store that made connections in the parent shares their sockets, and
        # is refused in the child. One never used there is the child's.
        self.lock = threading.Lock()
        if self.loop is not None:
            self.loop, self.forked = None, True


class AsyncStore(_base.StoreBase):
    """The asyncio twin of :class:`Store` (built by :func:`durabilis.aio.connect`)."""

    def __init__(self, client: Any, *, url: str, namespace: str, is_cluster: bool) -> None:
        super().__init__(client, url=url, namespace=namespace, is_cluster=is_cluster)
        # (made here, not on first use: a with_acks twin shares them)
        self._init_lock = asyncio.Lock()
        # Standalone: the scripts of concurrent operations leave in batches
        # (durabilis/_autopipe.py). Cluster: redis-py's cluster pipelines refuse
        # EVALSHA, so calls go one by one, at most as many at once as a node's
        # pool holds (past that they wait instead of failing).
        self.autopipe = None if is_cluster else AutoPipeline(client)
        self._slots = asyncio.Semaphore(_cluster_max_connections(client))
        self._loading: dict[str, asyncio.Future[None]] = {}  # sha -> its SCRIPT LOAD
        self._home = _Home()

    def check_loop(self) -> None:
        """Refuse another event loop than the store's before anything is sent.

        redis-py's asyncio connections (and the store's own locks and
        futures) belong to the loop that made them; the first call binds the
        store to its loop, for good (``close()`` included: one rule for every
        backend).

        Raises:
            WrongEventLoop: Called from another loop.
        """
        loop = asyncio.get_running_loop()
        home = self._home
        if home.loop is loop:
            return
        with home.lock:  # (two threads' loops making their first call at once)
            if home.loop is None and not home.forked:
                home.loop = loop
                return
        if home.loop is None:
            raise WrongEventLoop(
                "this AsyncStore was used in the parent process before fork(), whose "
                "connections it holds: connect_async (and build the layer) in the child"
            )
        closed = " (now closed)" if home.loop.is_closed() else ""
        raise WrongEventLoop(
            f"this AsyncStore belongs to another event loop{closed}, whose connections "
            "it holds: make one store per event loop (connect_async inside the coroutine "
            "that asyncio.run runs, or one per thread's loop)"
        )

    async def _ready(self) -> None:
        # redis-py's async cluster client (re)reads the slot map lazily, and
        # when many coroutines trigger that at once they break each other's
        # connections. Let one do it while the others wait.
        if not (self.is_cluster and getattr(self.client, "_initialize", False)):
            return
        async with self._init_lock:
            if getattr(self.client, "_initialize", False):
                await self.client.initialize()

    @property
    def holds_in_task(self) -> bool:
        """Whether a shielded step may be awaited in its caller's task
        (:class:`~durabilis._cancel.HeldThrough`) rather than a task of its own:
        when its calls go through the autopipe (standalone, Sentinel) and the
        acks level is checked. Then what a step awaits in the caller's task
        are futures that complete by themselves (the batch's, a script's load,
        a sleep): no read, and no timeout that would cancel the caller's task
        to fire, runs there (they run in the batch's sender task)."""
        return self.autopipe is not None and not self._acks_unchecked

    def with_acks(self, acks: str | Acks, timeout: float | None = None) -> AsyncStore:
        """See :meth:`Store.with_acks` (the twin shares this store's batching too)."""
        twin: AsyncStore = self._acking(acks, timeout)
        return twin

    async def _check_acks(self) -> None:
        if self._acks_unchecked:
            refused = self._acks_unsupported(await self.command("INFO", "server"))
            if refused is not None:
                raise refused

    async def run(self, call: ScriptCall) -> Any:
        """Run one script; redis-py errors become durabilis errors."""
        self.check_loop()
        before = _cancels()
        try:
            if self._acks_unchecked:  # (once: no coroutine per call after)
                await self._check_acks()
            reply = await self._run(call)
        except Exception:
            _resurface(before)  # (a cancellation it swallowed outranks the error it left)
            raise
        _resurface(before)
        return reply

    async def _run(self, call: ScriptCall) -> Any:
        try:
            if self._waits(call):
                return await self._run_acked(call)
            if self.autopipe is not None:
                # See Store.run: plain EVALSHA first; batched with the other
                # coroutines' scripts of this tick.
                reply = await self.autopipe.execute(*self._evalsha(call))
                if not isinstance(reply, Exception):
                    return reply
                if not isinstance(reply, redis.exceptions.NoScriptError):
                    raise reply
                return await self._load_and_run(call)
            async with self._slot():
                await self._ready()
                return await self._load_and_run(call)
        except Exception as exc:
            raise map_error(exc, call) from exc

    async def _run_acked(self, call: ScriptCall) -> Any:
        """See :meth:`Store._run_acked`: the script and ``WAIT`` on one connection
        (batched with the other coroutines' commands; on Cluster, its node's)."""
        command: tuple[Any, ...] = tuple(self._evalsha(call))
        for tries in range(5):
            if self.autopipe is not None:
                reply, acked = await self.autopipe.execute_many([command], self._wait())
            else:
                async with self._slot():
                    await self._ready()
                    reply, acked = await self._node_waited(call, command)
            step, command = self._acked_next(call, command, reply, acked, tries)
            if step == "done":
                return command
            if step == "reroute":
                self.client._initialize = True  # the slot map is read again first
                await asyncio.sleep(0.05 * (tries + 1))
        raise StorageUnavailable(f"script {call.name} was not run: {reply!r}")

    async def _node_waited(self, call: ScriptCall, command: tuple[Any, ...]) -> tuple[Any, Any]:
        """Cluster: ``command`` and ``WAIT`` on one connection of the key's primary."""
        node = self.client.get_node_from_key(call.keys[0])
        conn = node.acquire_connection()
        try:
            await conn.send_packed_command(conn.pack_commands([command, self._wait()]))
            try:
                reply = await node.parse_response(conn, command[0])
            except redis.exceptions.ResponseError as exc:
                reply = exc
            try:
                acked = await node.parse_response(conn, "WAIT")
            except redis.exceptions.ResponseError as exc:
                acked = exc  # (see _kept_reply)
        except BaseException as exc:
            await conn.disconnect()
            if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
                self.client._initialize = True  # (a failover: read the slot map again)
            raise
        finally:
            node.release(conn)
        return reply, acked

    async def _load_and_run(self, call: ScriptCall) -> Any:
        script = self.scripts.get(call.name)
        if self.autopipe is not None:
            # NOSCRIPT (first use, a restart, SCRIPT FLUSH) meant nothing ran. The
            # callers that met it together load the script once, then send again
            # batched; EVAL (the source itself) if it was flushed once more.
            await self._script_load(script.sha, script.script)
            reply = await self.autopipe.execute(*self._evalsha(call))
            if isinstance(reply, redis.exceptions.NoScriptError):
                reply = await self.autopipe.execute("EVAL", *self._eval(call))
            if isinstance(reply, Exception):
                raise reply
            return reply
        try:
            return await script(keys=call.keys, args=call.args)
        except redis.exceptions.NoScriptError:
            # See Store.run: flushed between reload and retry.
            return await self.client.eval(*self._eval(call))

    async def _script_load(self, sha: str, source: Any) -> None:
        loading = self._loading.get(sha)
        if loading is None:
            loading = asyncio.ensure_future(self._send_load(source))
            self._loading[sha] = loading
            loading.add_done_callback(lambda _: self._loading.pop(sha, None))
        await asyncio.shield(loading)  # a cancelled caller does not cancel the others' load

    async def _send_load(self, source: Any) -> None:
        assert self.autopipe is not None
        reply = await self.autopipe.execute("SCRIPT", "LOAD", source)
        if isinstance(reply, Exception):
            raise reply

    def _slot(self) -> asyncio.Semaphore:
        """A place among the calls this Cluster store has out at once (waits when full)."""
        return self._slots

    async def run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run several scripts in ONE round trip (see :meth:`Store.run_many`)."""
        self.check_loop()
        before = _cancels()
        try:
            if self._acks_unchecked:  # (once: no coroutine per call after)
                await self._check_acks()
            replies = await self._run_many(calls)
        except Exception:
            _resurface(before)  # (as run's)
            raise
        _resurface(before)
        return replies

    async def _run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        if self.autopipe is None:
            return _base.first_error_or(await self._wave(calls))
        commands = [tuple(self._evalsha(c)) for c in calls]
        waits = any(self._waits(c) for c in calls)
        try:  # (one WAIT after them all: they share the batch's connection)
            replies = await self.autopipe.execute_many(commands, self._wait() if waits else None)
        except Exception as exc:
            raise map_error(exc, calls[0] if len(calls) == 1 else None) from exc
        acked = replies.pop() if waits else None
        for i in _base.unloaded(replies):  # run now, whatever the others did
            try:
                replies[i] = await self.run(calls[i])
            except DurabilisError as exc:
                replies[i] = exc
        _base.raise_first(calls, replies)  # (the first failure, once every call was tried)
        if waits:
            try:
                self._confirmed(acked, calls[0] if len(calls) == 1 else None)
            except DurabilisError as exc:  # (every call ran: unconfirmed, not undone)
                exc.partial = _base.told(replies)
                raise
        return replies

    async def run_step(
        self, calls: Sequence[ScriptCall], gates: Gates | None = None,
        waves: Waves | None = None,
    ) -> Replies:
        """See :meth:`Store.run_step`."""
        self.check_loop()
        n = len(calls)
        if self._acks_unchecked:  # (once: no coroutine per call after)
            await self._check_acks()
        if self._fuse:
            if n == 1:
                try:
                    return Replies([await self.run(calls[0])], "c")
                except DurabilisError as exc:
                    _base.failed_step(exc, [], 1)
                    raise
            try:
                if self.autopipe is not None and not self._acks.waits:
                    before = _cancels()
                    try:
                        reply = await self._run_fused(calls, gates)
                    except Exception:
                        _resurface(before)  # (as run's)
                        raise
                    _resurface(before)
                    return _base.fused_replies(reply, n)
                gated = [bool(gates and i in gates) for i in range(n)]
                return _base.fused_replies(await self.run(fuse(calls, gated)), n)
            except DurabilisError as exc:
                exc.partial = Replies([None] * n, "?" * n)
                raise
        stepping = _base.Stepping(n, gates)
        for wave in _base.wave_groups(n, waves):
            if not stepping.took(wave, await self._wave([calls[i] for i in wave])):
                break
        return stepping.done()

    async def _run_fused(self, calls: Sequence[ScriptCall], gates: Gates | None) -> Any:
        """See :meth:`Store._run_fused` (batched as :meth:`_run` sends a script)."""
        assert self.autopipe is not None
        try:
            reply = await self.autopipe.execute(*_base.fused_command(self.scripts, calls, gates))
        except Exception as exc:
            raise map_error(exc, _base.fused_call(calls, gates)) from exc
        if not isinstance(reply, Exception):
            return reply
        fused = _base.fused_call(calls, gates)
        if not isinstance(reply, redis.exceptions.NoScriptError):
            raise map_error(reply, fused) from reply
        try:  # (nothing ran: loaded, then sent again)
            return await self._load_and_run(fused)
        except Exception as exc:
            raise map_error(exc, fused) from exc

    async def _caught(self, call: ScriptCall) -> Any:
        try:
            return await self.run(call)
        except DurabilisError as exc:
            return exc

    async def _wave(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """See :meth:`Store._wave` (Cluster: gathered, one call too: a cancelled
        caller waits for what it sent, below)."""
        if not calls or not self.is_cluster:
            return [await self._caught(c) for c in calls]
        tasks = [asyncio.ensure_future(self._caught(c)) for c in calls]
        try:
            await asyncio.wait(tasks)  # a cancellation here does not cancel them...
        except asyncio.CancelledError:
            # ...and the plan's compensation must not overtake a call still in
            # flight: wait for them (within the socket timeout), then go on.
            while not all(t.done() for t in tasks):
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait(tasks)
            raise
        return [t.result() for t in tasks]

    async def command(self, *args: Any) -> Any:
        """Run a plain read-only Redis command with error mapping."""
        self.check_loop()
        before = _cancels()
        try:
            if self.autopipe is not None:
                reply = await self.autopipe.execute(*args)
                if isinstance(reply, Exception):
                    raise reply
            else:
                async with self._slot():
                    await self._ready()
                    reply = await self.client.execute_command(*args)
        except Exception as exc:
            _resurface(before)  # (as run's)
            raise map_error(exc) from exc
        _resurface(before)
        return reply

    async def scan_count(
        self, pattern: str, where: tuple[str, frozenset[bytes]] | None = None
    ) -> int:
        """See :meth:`Store.scan_count`."""
        self.check_loop()
        before = _cancels()
        try:
            await self._ready()
            n, batch = 0, []
            async for key in self.client.scan_iter(match=pattern, count=1000):
                _resurface(before)  # (a long scan stops at the next page)
                if where is None:
                    n += 1
                    continue
                batch.append(key)
                if len(batch) >= 500:
                    n += _base.count_in(await self._hget_all(batch, where[0]), where[1])
                    batch = []
            if batch and where is not None:
                n += _base.count_in(await self._hget_all(batch, where[0]), where[1])
        except Exception as exc:
            _resurface(before)  # (as run's)
            raise map_error(exc) from exc
        _resurface(before)
        return n

    async def _hget_all(self, keys: list[Any], field: str) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, field)
        return list(await pipe.execute(raise_on_error=False))

    async def ping(self) -> bool:
        self.check_loop()
        before = _cancels()
        try:
            await self._ready()
            up = bool(await self.client.ping())
        except Exception as exc:
            _resurface(before)  # (as run's)
            raise map_error(exc) from exc
        _resurface(before)
        return up

    async def close(self) -> None:
        """Close the connection pool (once the batches that are out are back).

        Raises:
            WrongEventLoop: Called from another loop than the store's: its
                connections cannot be closed from there.
        """
        self.check_loop()
        if self.autopipe is not None:
            await self.autopipe.aclose()
        await self.client.aclose()
        for sentinel in _base.sentinels_of(self.client):
            await sentinel.aclose()

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
