"""Auto-pipelining for the asyncio store: commands ready in the same event-loop
tick leave together, in one write, and their replies come back in one read.

A durable call is a few short scripts, each a round trip. With many calls in
flight in one process, sending each on a connection of its own costs a
system call and a reply parse per command, and a connection per call in
flight (redis-py's pool refuses past its limit). Here every command a
coroutine issues is queued; a *sender* task takes everything queued so far
and sends it as one non-transactional pipeline on one connection. While a
batch is out, the next commands queue up and leave together once a sender is
free. At most ``senders`` batches are out at once, so a process uses that
many connections for its scripts however many operations it runs.

What does not change:

- Each command is still one script, atomic on the server; a batch is not a
  transaction (neither were separate connections).
- The commands of one coroutine keep their order (it awaits each reply
  before it sends the next).
- Outcomes: a reply is the command's own reply or its own error. When a batch
  fails as a whole (connection lost, timeout), every command of it gets that
  error: "outcome unknown", exactly as for a command sent alone.
- Cancellation: a command whose caller is cancelled before a sender took it
  is never sent. Once taken, it will be sent: the caller's cancellation then
  waits for that command's reply (or the batch's failure) before it goes on,
  so whatever the caller sends next (its plan's compensation: a release)
  reaches Redis after it, never before on another connection. The batch
  itself is never interrupted, so a cancelled caller no longer costs a
  connection (redis-py drops a connection whose reply it stopped reading).
  A sender cancelled itself (a sweep cancelling every task) puts a batch it
  has not sent back in the queue, and fails one it has sent with a lost
  connection (outcome unknown): never with a cancellation its callers did not
  get.
- Arguments: a command whose arguments cannot be sent (a type Redis does not
  take, text that is not valid Unicode) fails alone; the rest of its batch
  goes.
- Timeouts: Redis answers a pipeline once it has run all of it, so a batch's
  replies come together: the batch as a whole gets the socket timeout. A
  script is microseconds to milliseconds, so a batch is too; one that ran for
  seconds would time out the others of its batch ("outcome unknown", as for a
  lost connection: they may have run).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from durabilis._fork import reset_in_child

try:  # hiredis (the `hiredis` extra) packs a command in C; redis-py's asyncio
    # connection packs in Python, ~150 us per durable call (its fused scripts
    # carry ~25 arguments each).
    from hiredis import pack_command as _c_pack
except ImportError:  # pragma: no cover  (without the extra)
    _c_pack = None  # type: ignore[assignment]

DEFAULT_SENDERS = 4
"""Batches out at once (connections used for scripts) per asyncio store."""

_PLAIN_READ = AbstractConnection.read_response
_BATCH_TIMEOUT = getattr(asyncio, "timeout", None)  # Python 3.11+
_RAW_REPLIES = frozenset({"EVALSHA", "EVAL"})
"""Commands whose reply redis-py passes on as parsed (no response callback):
the scripts, nearly every command the store sends."""


class _Entry:
    __slots__ = ("args", "confirm", "future", "taken")

    def __init__(
        self, args: tuple[Any, ...], future: asyncio.Future[Any], confirm: bool = False
    ) -> None:
        self.args = args
        # A confirmation (WAIT / WAITAOF): not sent itself; its batch ends with ONE
        # command of its kind (the most asked of), whose reply it gets.
        self.confirm = confirm
        self.future = future
        # Set when a sender takes it (it will be sent): done once its batch is over.
        self.taken: asyncio.Future[None] | None = None


def _merged(confirms: Sequence[_Entry]) -> list[tuple[Any, ...]]:
    """One confirmation command per kind for a batch: the most replicas (and local
    fsyncs) and the longest timeout any entry asked for. It follows every command
    of the batch on the same connection, so it covers every write of theirs."""
    out: dict[Any, tuple[Any, ...]] = {}
    for e in confirms:
        name, *numbers = e.args
        have = out.get(name)
        out[name] = (name, *numbers) if have is None else (
            name, *(max(int(a), int(b)) for a, b in zip(have[1:], numbers, strict=True)))
    return list(out.values())


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _outcome(entries: Sequence[_Entry]) -> list[Any]:
    """The entries' replies. Cancelled: a command not taken yet is dropped (its
    future is cancelled with the caller, and senders skip it); for one already
    taken, the caller waits until its batch is over before the cancellation goes
    on, so that the caller's next command (its compensation) cannot overtake it
    on another connection."""
    try:
        return [await e.future for e in entries]
    except Exception:
        # The first failure is raised; the others' (a lost batch fails them all)
        # are retrieved, not logged as "Future exception was never retrieved".
        for e in entries:
            e.future.add_done_callback(_retrieve)
        raise
    except asyncio.CancelledError:
        await _taken_over(entries)
        raise


async def _taken_over(entries: Sequence[_Entry]) -> None:
    """The caller of ``entries`` was cancelled: those not taken yet are dropped,
    and the batches that took the others are waited for (see :func:`_outcome`)."""
    while True:
        # (again after each wait: a sender cancelled before it sent puts
        # its batch back, not taken; another sender may have taken it since)
        for e in entries:
            if e.taken is None:
                e.future.cancel()
        batches = {e.taken for e in entries if e.taken is not None and not e.taken.done()}
        if not batches:
            break
        try:
            await asyncio.wait(batches)
        except asyncio.CancelledError:
            continue  # cancelled again: it is already being cancelled


class AutoPipeline:
    """Queue commands; send what is queued as one pipeline per free sender."""

    def __init__(self, client: Any, senders: int = DEFAULT_SENDERS) -> None:
        self._client = client
        self._max = senders
        self._queue: list[_Entry] = []
        self._senders = 0  # sender tasks alive
        self._woken = False  # a sender was started and has not taken the queue yet
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # batches sent (for tests and benchmarks)
        self.commands = 0  # commands sent in them
        reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """The queue and the senders are the parent loop's: a forked child never
        sends what its parent queued (its store refuses it anyway, see
        ``AsyncStore.check_loop``)."""
        self._queue = []
        self._senders = 0
        self._woken = False
        self._tasks = set()

    async def execute(self, *args: Any) -> Any:
        """Send one command with whatever else is ready; its reply or its error.

        A per-command error reply is *returned* (an exception instance), as
        redis-py's pipelines do with ``raise_on_error=False``: the caller
        tells a NOSCRIPT from a real error. A failure of the whole batch is
        raised.
        """
        entry = self._push(args)
        self._wake()
        try:
            return await entry.future
        except asyncio.CancelledError:
            await _taken_over((entry,))
            raise

    async def execute_many(
        self, commands: list[tuple[Any, ...]], confirm: tuple[Any, ...] | None = None
    ) -> list[Any]:
        """Several commands, queued together (one batch when a sender is free).

        ``confirm``: a ``WAIT``/``WAITAOF`` command; its reply is appended to the
        replies. The batch that takes these commands ends with one confirmation
        for all its callers (not one per caller: Redis would run them one after
        another, a replica round trip each, holding up the rest of the batch).
        """
        entries = [self._push(args) for args in commands]
        if confirm is not None:
            entries.append(self._push(confirm, confirm=True))
        self._wake()
        return await _outcome(entries)

    def _push(self, args: tuple[Any, ...], confirm: bool = False) -> _Entry:
        entry = _Entry(args, asyncio.get_running_loop().create_future(), confirm)
        self._queue.append(entry)
        return entry

    def _wake(self) -> None:
        if self._woken or self._senders >= self._max:
            return  # a sender will take the queue (a busy one when it is back)
        self._woken = True
        self._senders += 1
        task = asyncio.get_running_loop().create_task(self._send_queued())
        self._tasks.add(task)
        task.add_done_callback(self._sender_done)

    def _sender_done(self, task: asyncio.Task[None]) -> None:
        """A sender's end, however it ended: also cancelled before its first step
        (a sweep cancelling every task), which runs none of its code. Its place
        is given back, and commands still waiting get another sender (else the
        store would never send again)."""
        self._tasks.discard(task)
        self._senders -= 1
        self._woken = False
        if any(not e.future.done() for e in self._queue):
            self._wake()

    async def _send_queued(self) -> None:
        # A new task starts on the next loop iteration: everything the other
        # coroutines queue in this tick joins the batch.
        while self._queue:
            batch, self._queue = self._queue, []
            self._woken = False
            live = [e for e in batch if not e.future.done()]
            if live:
                over: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                for e in live:
                    e.taken = over  # from here on it is sent: a cancelled caller waits
                try:
                    await self._send(live)
                finally:
                    over.set_result(None)

    async def _send(self, batch: list[_Entry]) -> None:
        """One write, then the replies in order, each to its caller as it is read.

        What redis-py's pipeline does, minus its per-command Python packing: the
        replies still go through the client's own parser and response callbacks.
        """
        self.batches += 1
        self.commands += len(batch)
        client = self._client
        pool = client.connection_pool
        conn = await self._connection(pool, batch)
        if conn is None:
            return
        confirms = [e for e in batch if e.confirm]
        closing = _merged(confirms)
        try:
            sent, packed = _packed(conn, [e for e in batch if not e.confirm])
            if not sent and not confirms:  # (every command had arguments Redis cannot take)
                return
            await conn.send_packed_command([*packed, *_pack(conn, closing)])
            replies = _Replies(client, conn)
            async with replies.deadline():
                for entry in sent:
                    reply = await replies.read(entry.args[0])
                    if not entry.future.done():
                        entry.future.set_result(reply)
                for command in closing:
                    replies.renew(at_once=True)  # (WAIT blocks on the server up to its timeout)
                    reply = await replies.read(command[0])
                    for entry in confirms:
                        if entry.args[0] == command[0] and not entry.future.done():
                            entry.future.set_result(reply)
        except TimeoutError:  # (the batch's deadline: a reply did not come in time)
            await conn.disconnect(nowait=True)
            _fail(batch, RedisTimeout(f"a reply of a batch of {len(batch)} command(s) did not "
                                      f"come within the socket timeout ({conn.socket_timeout} s)"))
        except BaseException as exc:
            # The connection is out of step (or gone): drop it. Every command not
            # answered yet has an unknown outcome; its caller gets the error. This
            # sender's own cancellation (a sweep of every task) is not the
            # callers': they get a lost connection, an unknown outcome.
            await conn.disconnect(nowait=True)
            _fail(batch, RedisConnectionError(
                "the batch's sender task was cancelled: the outcome is unknown"
            ) if isinstance(exc, asyncio.CancelledError) else exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            await pool.release(conn)

    async def _connection(self, pool: Any, batch: list[_Entry]) -> Any:
        """A connection for ``batch``; ``None`` when there is none (its callers
        got the error: nothing was sent)."""
        try:
            return await pool.get_connection()  # (connects; a failure returns it itself)
        except asyncio.CancelledError:
            # This sender was cancelled (a sweep of every task), not the callers:
            # nothing was sent, so the batch goes back to the queue for the next
            # sender (see _sender_done), its callers none the wiser.
            self._requeue(batch)
            raise
        except BaseException as exc:
            _fail(batch, exc)  # Redis unreachable or no free connection
            if not isinstance(exc, Exception):
                raise
            return None

    def _requeue(self, batch: list[_Entry]) -> None:
        """Commands taken but never sent: first in the queue again, not taken."""
        for e in batch:
            e.taken = None
        self._queue[:0] = [e for e in batch if not e.future.done()]

    async def aclose(self) -> None:
        """Wait for the batches that are out (their callers wait for them anyway)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _pack(conn: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The RESP bytes of ``commands`` (hiredis when installed, else redis-py's packer)."""
    if _c_pack is not None:
        try:
            return [_c_pack(args) for args in commands]
        except TypeError:
            pass  # an argument hiredis does not take: redis-py's encoder decides
    packer: Callable[..., Any] = conn.pack_commands
    return list(packer(commands)) if commands else []


def _packed(conn: Any, entries: Sequence[_Entry]) -> tuple[list[_Entry], list[Any]]:
    """The entries that could be packed, and their RESP bytes. One whose
    arguments cannot be sent (a type, text that is not valid Unicode) gets its
    own error and is left out: the rest of the batch does not pay for it."""
    try:
        return list(entries), _pack(conn, [e.args for e in entries])
    except Exception:
        pass  # one entry at a time, below, finds which
    ok: list[_Entry] = []
    packed: list[Any] = []
    for e in entries:
        try:
            packed += _pack(conn, [e.args])
        except Exception as exc:
            if not e.future.done():
                e.future.set_exception(exc)
            continue
        ok.append(e)
    return ok, packed


def _raw_read(conn: Any) -> Callable[[], Any] | None:
    """The parser's own read of one reply, when a batch may use it (see :class:`_Replies`)."""
    if _BATCH_TIMEOUT is None or type(conn).read_response is not _PLAIN_READ:
        return None
    read: Callable[[], Any] | None = getattr(getattr(conn, "_parser", None), "read_response", None)
    return read


class _Replies:
    """The replies of one batch, read in order.

    redis-py's ``read_response`` arms and cancels a timeout for every reply:
    ~11 of its ~12 us per reply here, ~20 us per durable call. Script replies
    are read from the parser itself instead, under ONE timer for the batch
    (Python 3.11+): each reply may take the whole socket timeout, counted from
    the previous one. Redis sends a pipeline's replies once it has run all of
    it, so in practice the first reply waits for the whole batch's run and the
    rest are in the buffer: the batch gets one socket timeout (see the module
    docstring). The timer is pushed back once a reply took more than a
    hundredth of the timeout, so replies read from the buffer cost no timer
    work. Older Pythons, connections that add to the read
    (Sentinel's failover, fakeredis) and replies with a response callback keep
    redis-py's own read and its timeout.
    """

    __slots__ = ("_armed", "_client", "_conn", "_loop", "_raw", "_scope", "_slack", "_timeout")

    def __init__(self, client: Any, conn: Any) -> None:
        self._client = client
        self._conn = conn
        self._raw = _raw_read(conn)
        self._timeout: float | None = conn.socket_timeout
        self._scope: Any = None
        self._armed = 0.0
        self._slack = 0.0

    def deadline(self) -> Any:
        """The batch's timer (a context manager), or none."""
        if self._raw is None or self._timeout is None or _BATCH_TIMEOUT is None:
            return contextlib.nullcontext()
        self._loop = asyncio.get_running_loop()
        self._armed = self._loop.time()
        self._slack = self._timeout / 100
        self._scope = _BATCH_TIMEOUT(self._timeout)
        return self._scope

    def renew(self, *, at_once: bool = False) -> None:
        """The next reply gets the whole socket timeout from now."""
        if self._scope is None or self._timeout is None:
            return
        now = self._loop.time()
        if at_once or now - self._armed > self._slack:
            self._scope.reschedule(now + self._timeout)
            self._armed = now

    async def read(self, command: Any) -> Any:
        """One reply; a command's own error reply is returned, a lost connection raised."""
        if self._raw is None or command not in _RAW_REPLIES:  # (a response callback to apply)
            reply = await _reply(self._client, self._conn, command)
        else:
            reply = await self._raw()
        self.renew()
        return reply


async def _reply(client: Any, conn: Any, command: Any) -> Any:
    """One reply, through the client's parser; a command's own error is returned."""
    try:
        return await client.parse_response(conn, command)
    except ResponseError as exc:
        return exc


def _fail(entries: Sequence[_Entry], exc: BaseException) -> None:
    for entry in entries:
        if entry.future.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            entry.future.cancel()
        else:
            entry.future.set_exception(exc)
