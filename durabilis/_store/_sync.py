"""The synchronous store: :class:`Store`, its ready-connection pool
(:class:`_ReadyPool`) and its direct reply reader (:func:`_read_reply`)."""

from __future__ import annotations

import select
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
from redis._parsers.hiredis import _HiredisParser as _HIREDIS_PARSER
from redis.connection import HiredisRespSerializer as _HIREDIS_PACKER

from durabilis import _fork
from durabilis._acks import Acks
from durabilis._scripts import Replies, ScriptCall, fuse
from durabilis._signal_gate import GATE
from durabilis._store._base import (
    Gates,
    Stepping,
    Waves,
    count_in,
    failed_step,
    first_error_or,
    fused_call,
    fused_command,
    fused_replies,
    raise_first,
    sentinels_of,
    told,
    unloaded,
    wave_groups,
)
from durabilis._store._errors import map_error
from durabilis._store._held import HeldPool
from durabilis._store._wave import ClusterWaves, _kept_reply, _wait_out
from durabilis.errors import (
    DurabilisError,
    StorageUnavailable,
)

_PACK: Any
try:  # hiredis packs str (UTF-8), bytes, int and float as redis-py's own packer does
    from hiredis import pack_command as _PACK
except ImportError:  # (redis-py then packs and parses in Python)
    _PACK = None


_POLL = hasattr(select, "poll")

def _in_step(conn: Any) -> bool:
    """Whether a connection is connected with nothing unread (the check the pool
    makes before it hands one out, without its reconnecting part: ``False``
    sends it through the pool's own check, which reconnects or raises)."""
    parser = getattr(conn, "_parser", None)
    sock = conn._sock
    if sock is None or parser is None:
        return False
    reader = getattr(parser, "_reader", None)
    if (_POLL and type(parser) is _HIREDIS_PARSER and reader is not None
            and not hasattr(sock, "pending")):  # (TLS: bytes may wait above the socket)
        # The parser's own check (can_read) without its poll object made anew
        # each time: one kept per socket (and its descriptor). Buffered or
        # readable (data, or the server's close) is not in step.
        try:
            fd = sock.fileno()
            polled = conn.__dict__.get("_durabilis_poll")
            if polled is None or polled[0] is not sock or polled[1] != fd:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                polled = conn.__dict__["_durabilis_poll"] = (sock, fd, poller)
            return fd >= 0 and not reader.has_data() and not polled[2].poll(0)
        except (ValueError, OSError):
            return False
    try:
        return not parser.can_read(0)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        return False


def _read_reply(conn: Any) -> Any:
    """One reply, read from the connection's hiredis reader directly: what
    ``Connection.read_response`` does without a health check (push messages
    handed to the parser's handler, an error reply raised with the connection
    left in step; a failure raised, the caller drops the connection), minus
    its wrappers. Another parser goes through ``read_response``."""
    parser = conn._parser
    reader = getattr(parser, "_reader", None)
    if type(parser) is not _HIREDIS_PARSER or reader is None or conn.health_check_interval:
        return conn.read_response(disconnect_on_error=False)  # (the caller drops it)
    push = getattr(parser, "_hiredis_PushNotificationType", None)
    while True:
        reply = reader.gets()
        while reply is _NOT_ENOUGH_DATA:
            # (raises redis-py's TimeoutError / ConnectionError)
            parser.read_from_socket()  # type: ignore[no-untyped-call]
            reply = reader.gets()
        if push is None or not isinstance(reply, push):
            break
        parser.handle_push_response(reply)  # type: ignore[no-untyped-call]
        reader = parser._reader  # (the handler may have dropped the connection)
        if reader is None:
            raise redis.exceptions.ConnectionError("Connection closed by server.")
    if isinstance(reply, (redis.exceptions.ResponseError, redis.exceptions.ConnectionError)):
        raise reply
    if type(reply) is list and reply and isinstance(reply[0], redis.exceptions.ConnectionError):
        raise reply[0]
    return reply


def _taken(pool: Any) -> tuple[Any, bool]:
    """A connection of ``pool`` and whether the signal handlers are held back
    (:meth:`~durabilis._signal_gate.SignalGate.hold`): they stay held as it
    returns, until the caller's ``try`` lets them run (``GATE.unhold``)."""
    held = GATE.hold()
    try:
        conn = pool.take() if isinstance(pool, HeldPool) else pool.get_connection()
    except BaseException:
        GATE.unhold(held)  # (no connection taken)
        raise
    return conn, held


def _given(pool: Any, conn: Any, held: bool) -> None:
    """``conn`` back to ``pool`` (the caller held the handlers back first,
    with no call before: see :meth:`Store._send`); then what was held runs."""
    try:
        pool.give(conn) if isinstance(pool, HeldPool) else pool.release(conn)
    finally:
        if held:
            GATE.unhold(held)


def _given_in_step(pool: Any, conn: Any, held: bool, done: bool) -> None:
    """``conn`` back to ``pool``, dropped first unless its command ended with its
    reply read (``done``). Dropped here, not where the failure was caught: a
    second interruption there (a second Ctrl-C as the first one's reply was
    waited for) gave it back with the reply still on its way, and the next
    command (the claim's own release) read it as its own."""
    try:
        if not done:
            conn.disconnect()
    finally:
        _given(pool, conn, held)


class _ReadyPool(HeldPool, redis.BlockingConnectionPool):
    """redis-py's blocking pool, with the connections given back kept ready in
    a list (a LIFO, lock-free under the GIL) in front of its queue: taking one
    and giving it back costs no lock, queue or observability hook (~35 us a
    script with redis-py 8's pool).

    What the pool promises stays: ``max_connections`` bounds the connections
    (new ones come from the queue only); a ready connection is checked as the
    pool checks any it hands out (reconnected if the server closed it, never
    handed out with unread data); one whose command did not end with its
    reply read is disconnected by its user before it comes back (a reply
    left unread is never paired with the next command). A connection goes
    back to the queue, not the list, whenever the queue is empty (a caller may
    be waiting there for one). A forked child resets the pool (redis-py's
    ``_checkpid``), the list with it: it never uses its parent's sockets.
    Signal handlers wait while it takes or gives back one (:class:`HeldPool`).
    """

    _ready: list[Any]

    def reset(self) -> None:
        self._ready = []
        super().reset()  # type: ignore[no-untyped-call]

    def take(self, *args: Any, **kwargs: Any) -> Any:
        if self._ready and self.pid == _fork.pid() and not self._in_maintenance:
            try:
                conn = self._ready.pop()
            except IndexError:  # (taken by another thread meanwhile)
                pass
            else:
                if _in_step(conn):
                    return conn
                try:
                    self.ensure_connection(conn)  # reconnects it, or raises
                except BaseException:
                    super().give(conn)
                    raise
                return conn
        return super().take(*args, **kwargs)

    def give(self, connection: Any) -> None:
        if (
            self.pid == _fork.pid() and getattr(connection, "pid", None) == self.pid
            and not self._in_maintenance and len(self.pool.queue)  # (qsize without its lock)
            and not connection.should_reconnect()
        ):
            self._ready.append(connection)
            return
        super().give(connection)


class Store(ClusterWaves):
    """A synchronous connection to the durabilis state in Redis.

    Build one with :func:`durabilis.connect`; share it between the pillars
    and threads of a process (redis-py clients are thread-safe).
    """

    def with_acks(self, acks: str | Acks, timeout: float | None = None) -> Store:
        """This store (same client and connections) with another acknowledgement level.

        ``"replicas:N"``: each script is followed, on its connection and in the
        same round trip, by ``WAIT N timeout_ms``; fewer confirmations within
        ``timeout`` seconds (default 1) raise :class:`~durabilis.errors.NotReplicated`
        (the step counts as failed, its outcome unknown). ``"primary"``: no
        ``WAIT``. ``acks`` may be a parsed level (``DurabilityConfig.acks_level``),
        which carries its timeout.

        Raises:
            ConfigError: An invalid level or timeout.
        """
        twin: Store = self._acking(acks, timeout)
        return twin

    def _check_acks(self) -> None:
        if self._acks_unchecked:
            refused = self._acks_unsupported(self.command("INFO", "server"))
            if refused is not None:
                raise refused

    def run(self, call: ScriptCall) -> Any:
        """Run one script; redis-py errors become durabilis errors."""
        self._check_acks()
        try:
            if self._waits(call):
                return self._run_acked(call)
            script = self.scripts.get(call.name)
            if not self.is_cluster:
                # The hot path: a plain EVALSHA costs ~15 us less per round trip
                # than the Script object's call (benchmarks/README.md). NOSCRIPT
                # means nothing ran: the Script object below loads it.
                try:
                    return self._send(
                        "EVALSHA", script.sha, len(call.keys), *call.keys, *call.args
                    )
                except redis.exceptions.NoScriptError:
                    # Nothing ran: EVAL carries the source (and caches it), on
                    # this held send too (redis-py's Script call takes and gives
                    # back its connection where a signal handler raising loses it).
                    return self._send("EVAL", *self._eval(call))
            try:
                return script(keys=call.keys, args=call.args)
            except redis.exceptions.NoScriptError:
                # Flushed again between redis-py's reload and its retry: EVAL
                # carries the source itself (NOSCRIPT means nothing ran).
                return self.client.eval(*self._eval(call))
        except Exception as exc:
            raise map_error(exc, call) from exc

    def _run_acked(self, call: ScriptCall) -> Any:
        """The script, then ``WAIT``, on one connection of its key's primary.

        ``WAIT`` counts the replicas that have what this connection wrote, so it
        must follow the script on the same connection. NOSCRIPT (nothing ran) is
        sent again as EVAL; on Cluster a redirect or a failover reply (nothing
        ran) is sent again after the slot map is read again, a few times."""
        command: tuple[Any, ...] = tuple(self._evalsha(call))
        for tries in range(5):
            node = None
            if self.is_cluster:
                node = self.client.get_node_from_key(call.keys[0])
                target = self.client.get_redis_connection(node)
            else:
                target = self.client
            try:
                reply, acked = self._send_waited(target, command)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                if node is not None:
                    self._reread_slots(node)
                raise
            step, command = self._acked_next(call, command, reply, acked, tries)
            if step == "done":
                return command
            if step == "reroute" and node is not None:
                self._reread_slots(node)
                time.sleep(0.05 * (tries + 1))
        raise StorageUnavailable(f"script {call.name} was not run: {reply!r}")

    def _send_waited(self, target: Any, command: tuple[Any, ...]) -> tuple[Any, Any]:
        """``command`` and ``WAIT`` written together on one connection of ``target``:
        ``(command's reply or its error reply, WAIT's reply)``."""
        since = GATE.ran  # (a signal handler's exception: one raised during this send)
        pool = target.connection_pool
        conn, held = _taken(pool)  # (held until it is in this try: see _send)
        left = 0  # replies written and not read yet
        done = False  # both replies read (or nothing was written): in step
        try:
            if held:
                GATE.unhold(held)
            conn.send_packed_command(conn.pack_commands([command, self._wait()]))
            left = 2
            reply = _kept_reply(conn)  # (EVALSHA / EVAL: no response callback)
            left = 1
            acked = _kept_reply(conn)
            left = 0
            done = True
            return reply, acked
        except BaseException as exc:
            _wait_out(target, conn, left, exc, since)
            raise
        finally:
            if held:  # (no call before the pool holds it again)
                GATE.closed = GATE.holding = True
            _given_in_step(pool, conn, held, done)

    def _send(self, *args: Any) -> Any:
        """One command on a pooled connection: what redis-py's ``execute_command``
        does, minus its per-call observability and retry wrappers (~70 us a
        durable call here). The reply goes through the client's own parser; an
        error reply leaves the connection in step, anything else (a timeout, a
        lost connection, an interruption) drops it.

        On a pool of plain connections (:class:`_ReadyPool`'s), taking one and
        giving it back costs no pool round, and the command is packed by
        hiredis (the very bytes redis-py's packer makes, in C).

        Signal handlers wait from before the connection is taken until it is in
        this ``try``, and again while it is given back
        (:meth:`~durabilis._signal_gate.SignalGate.hold`): what one raises never
        leaves the connection out of the pool."""
        since = GATE.ran  # (a signal handler's exception: one raised during this send)
        pool = self.client.connection_pool
        conn, held = _taken(pool)
        sent = False
        done = False  # the reply read (an error reply too): the connection in step
        try:
            if held:  # a handler held back meanwhile runs now: nothing is sent
                GATE.unhold(held)
            if (_PACK is not None and type(pool) is _ReadyPool
                    and type(conn._command_packer) is _HIREDIS_PACKER):
                # Numbers become bytes here (the very bytes redis-py's encoder
                # makes), never inside hiredis: its C packer does not check the
                # conversion of a number, and a signal handler raising during it
                # (Ctrl-C, a SIGTERM handler calling sys.exit) crashed the process.
                # (An int's text made here as that encoder makes it: its repr,
                # which hiredis packs as the same bytes.)
                encode = conn.encoder.encode
                packed = _PACK(tuple([
                    a if (t := type(a)) is str or t is bytes
                    else str(a) if t is int else encode(a)
                    for a in args
                ]))
                conn.send_packed_command(
                    [packed], check_health=bool(conn.health_check_interval))
                sent = True
                reply = _read_reply(conn)  # (EVALSHA: no response callback)
            else:
                conn.send_command(*args)
                sent = True
                reply = conn.read_response(disconnect_on_error=False)  # (EVALSHA: as is)
            done = True
            return reply
        except redis.exceptions.ResponseError:
            done = True  # (an error reply, read whole)
            raise
        except BaseException as exc:
            _wait_out(self.client, conn, 1 if sent else 0, exc, since)
            raise
        finally:
            if held:  # (no call before the pool holds it again: none can raise here)
                GATE.closed = GATE.holding = True
            _given_in_step(pool, conn, held, done)  # (what was held back runs after)

    def run_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run several scripts in ONE round trip (a non-transactional pipeline).

        Each script stays atomic; together they are not a transaction. On
        Cluster, redis-py refuses EVALSHA in pipelines, so the calls are sent
        concurrently there, each to its node (``_wave``): in no particular order.

        Raises:
            DurabilisError: The first call that failed (every call was still tried).
        """
        self._check_acks()
        if self.is_cluster:
            return first_error_or(self._wave(calls))
        try:
            pipe = self.client.pipeline(transaction=False)
            for c in calls:
                # Plain EVALSHA, not the Script object: redis-py would add a
                # SCRIPT EXISTS round trip before every pipeline.
                pipe.execute_command(*self._evalsha(c))
            waits = any(self._waits(c) for c in calls)
            if waits:  # (one WAIT covers every write of the connection)
                pipe.execute_command(*self._wait())
            replies = list(pipe.execute(raise_on_error=False))
        except Exception as exc:
            raise map_error(exc, calls[0] if len(calls) == 1 else None) from exc
        acked = replies.pop() if waits else None
        for i in unloaded(replies):  # run now, whatever the others did
            try:
                replies[i] = self.run(calls[i])
            except DurabilisError as exc:
                replies[i] = exc
        raise_first(calls, replies)  # (the first failure, once every call was tried)
        if waits:
            try:
                self._confirmed(acked, calls[0] if len(calls) == 1 else None)
            except DurabilisError as exc:  # (every call ran: unconfirmed, not undone)
                exc.partial = told(replies)
                raise
        return replies

    def run_step(
        self, calls: Sequence[ScriptCall], gates: Gates | None = None,
        waves: Waves | None = None,
    ) -> Replies:
        """Run the calls of one step; a refusal by a gated call stops the step.

        Standalone: ONE atomic script in ONE round trip, all-or-nothing (every
        call's checks pass before any call writes; a gated refusal writes
        nothing). Cluster: wave by wave (``waves``; default one call per wave),
        the calls of a wave concurrently; after a wave with a gated refusal or a
        failure, the later waves are not sent (what the calls before and beside
        it wrote stays written: the plan compensates).

        Raises:
            DurabilisError: The step failed; ``exc.partial`` tells which calls
                ran before it (on Cluster) or ``?`` for all (standalone).
        """
        n = len(calls)
        self._check_acks()
        if self._fuse:
            if n == 1:
                try:
                    return Replies([self.run(calls[0])], "c")
                except DurabilisError as exc:
                    failed_step(exc, [], 1)
                    raise
            try:
                if not self._acks.waits:
                    return fused_replies(self._run_fused(calls, gates), n)
                gated = [bool(gates and i in gates) for i in range(n)]
                return fused_replies(self.run(fuse(calls, gated)), n)
            except DurabilisError as exc:
                exc.partial = Replies([None] * n, "?" * n)
                raise
        stepping = Stepping(n, gates)
        for wave in wave_groups(n, waves):
            if not stepping.took(wave, self._wave([calls[i] for i in wave])):
                break
        return stepping.done()

    def _run_fused(self, calls: Sequence[ScriptCall], gates: Gates | None) -> Any:
        """``self.run(fuse(calls, gated))`` with no ``WAIT`` to follow (the common
        fused step): the very command it sends (:func:`fused_command`)."""
        try:
            return self._send(*fused_command(self.scripts, calls, gates))
        except redis.exceptions.NoScriptError:  # (nothing ran: the usual way loads it)
            pass
        except Exception as exc:
            raise map_error(exc, fused_call(calls, gates)) from exc
        return self.run(fused_call(calls, gates))

    def _caught(self, call: ScriptCall) -> Any:
        try:
            return self.run(call)
        except DurabilisError as exc:
            return exc

    @contextmanager
    def _mapped(self) -> Iterator[None]:
        try:
            yield
        except DurabilisError:
            raise
        except Exception as exc:
            raise map_error(exc) from exc

    def command(self, *args: Any) -> Any:
        """Run a plain read-only Redis command with error mapping."""
        with self._mapped():
            return self.client.execute_command(*args)

    def scan_count(self, pattern: str, where: tuple[str, frozenset[bytes]] | None = None) -> int:
        """How many keys match ``pattern`` (SCAN, every primary on Cluster).

        ``where=(field, values)``: only hashes whose ``field`` holds one of ``values``
        (read in pipelined batches).
        """
        with self._mapped():
            if where is None:
                return sum(1 for _ in self.client.scan_iter(match=pattern, count=1000))
            field, values = where
            n, batch = 0, []
            for key in self.client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    n += count_in(self._hget_all(batch, field), values)
                    batch = []
            return n + (count_in(self._hget_all(batch, field), values) if batch else 0)

    def _hget_all(self, keys: list[Any], field: str) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, field)
        return list(pipe.execute(raise_on_error=False))

    def ping(self) -> bool:
        with self._mapped():
            return bool(self.client.ping())

    def close(self) -> None:
        """Close the connection pool (and, on Sentinel, the connections to the
        sentinels)."""
        self.client.close()
        for sentinel in sentinels_of(self.client):
            sentinel.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
