"""A Cluster wave of the synchronous store (:class:`ClusterWaves`, which
:class:`~durabilis._store._sync.Store` is): its calls written to their nodes,
then read within one deadline; and what a call left unread or lost becomes."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis

from durabilis._scripts import ScriptCall
from durabilis._signal_gate import GATE
from durabilis._store._base import _NOT_RUN, StoreBase
from durabilis._store._errors import map_error
from durabilis._store._held import through
from durabilis.errors import DurabilisError, NotReplicated, StorageUnavailable


def _kept_reply(conn: Any) -> Any:
    """One reply (an error reply returned, not raised: a node demoted to replica
    refuses ``WAIT``, its script refused too or its write unconfirmed). The
    connection is kept as it stands when the read fails or is interrupted (the
    caller drops or drains it)."""
    try:
        return conn.read_response(disconnect_on_error=False)
    except redis.exceptions.ResponseError as exc:
        return exc


def _drain(
    redis_node: Any, conn: Any, replies: int = 1, deadline: float | None = None, *,
    until: bytes | None = None,
) -> bool:
    """Read and drop the ``replies`` written to ``conn`` (a script, its WAIT):
    True, in step; False, disconnected (a reply did not come by ``deadline``).
    ``until``: at most ``replies``, up to this one. Interrupted again (a second
    Ctrl-C, a SIGTERM's ``SystemExit``), it stops waiting and that goes on.

    The caller gives ``conn`` back, dropped first unless this returned True
    (:func:`_given_back`): raised at this function's entry, before its
    ``try``, it was neither drained nor dropped."""
    since = GATE.ran
    try:
        with _read_by(conn, deadline):
            through(_read_and_drop, redis_node, conn, replies, until)
    except Exception as exc:
        conn.disconnect()
        if GATE.made_of(exc, since) is not None:
            raise  # a signal handler's, meanwhile: an interruption again, it goes on
        return False
    except BaseException:
        conn.disconnect()
        raise
    return True


def _read_and_drop(
    redis_node: Any, conn: Any, replies: int, until: bytes | None = None
) -> None:
    for _ in range(replies):
        with contextlib.suppress(redis.exceptions.ResponseError):
            reply = redis_node.parse_response(conn, "EVALSHA")
            if until is not None and reply in (until, until.decode()):
                return


def _send_marker(conn: Any, marker: str) -> None:
    conn.send_command("PING", marker, check_health=False)


def _read_into(conn: Any, got: list[Any], replies: int) -> None:
    for _ in range(replies):
        got.append(_kept_reply(conn))


def _wait_out(target: Any, conn: Any, left: int, exc: BaseException, since: int) -> None:
    """A send of one connection failed with ``exc`` while ``left`` of its replies
    were unread: when that is an interruption (Ctrl-C, ``SystemExit``), the
    scripts written still run, so their replies are waited for (one socket
    timeout at most, or another interruption) before it goes on: the plan's
    compensation on another connection (a claim's release) must never overtake
    them (the claim would be held by nobody). So are they when ``exc`` is, or
    was made of, what a signal handler raised (a SIGALRM timeout's
    ``TimeoutError`` in the socket read: the plan compensates it as an
    interruption), raised by a handler that ran since the send began (``since``:
    the gate's count of handler runs then; one raised before, in whose
    ``except`` block a nested call runs, is no interruption of this send). The
    caller drops the connection."""
    if left and (not isinstance(exc, Exception) or GATE.made_of(exc, since) is not None):
        _drain_past(target, conn, left, None)


def _drain_past(redis_node: Any, conn: Any, left: int, deadline: float | None) -> bool:
    """:func:`_drain` of the at most ``left`` replies due on ``conn`` after an
    interruption of their read: up to a ``PING`` of a nonce sent after them,
    not a count of replies. The interruption may have landed just after a reply
    was read whole and before it was counted, and waiting for one more then
    took a socket timeout (for ever without one). The nonce comes back once
    whatever is before it did (``PING``: the ACL in docs/operations.md grants
    it). True, in step; False, dropped; given back by the caller, as
    :func:`_drain`'s."""
    marker = os.urandom(12).hex()
    since = GATE.ran
    try:
        through(_send_marker, conn, marker)
    except BaseException as exc:
        conn.disconnect()
        if isinstance(exc, Exception) and GATE.made_of(exc, since) is None:
            return False  # (the connection is gone: nothing more comes on it)
        raise
    return _drain(redis_node, conn, left + 1, deadline, until=marker.encode())


class _Lost:
    """A wave's call whose write timed out: it may run, its outcome is unknown."""

    __slots__ = ("node",)

    def __init__(self, node: str) -> None:
        self.node = node


def _drop(redis_node: Any, conn: Any) -> None:
    """Give ``conn`` back without its reply (disconnected: nothing unread stays)."""
    try:
        conn.disconnect()
    finally:
        redis_node.connection_pool.release(conn)


def _given_back(redis_node: Any, conn: Any, in_step: bool) -> None:
    """``conn`` back to its pool after a drain: as it is if the drain ended in
    step, else dropped first (a drain cut short at its entry by a second
    interruption left replies on their way: the next command would read them
    as its own)."""
    if in_step:
        redis_node.connection_pool.release(conn)
    else:
        _drop(redis_node, conn)


def _unknown(call: ScriptCall, node: str) -> StorageUnavailable:
    return StorageUnavailable(
        f"Redis unavailable (script {call.name}): node {node} did not answer in this "
        "step; the call was sent, its outcome is unknown"
    )


_HURRY = "*"
"""In a wave's ``failed``: interrupted twice, every call left is dropped unread."""


_UNREACHABLE = (redis.exceptions.TimeoutError, TimeoutError)
"""What connecting or writing to a node raises when it hangs (a refused or
reset connection, or a pool out of connections, is not that: those calls go
the usual way, which fails fast or works)."""


_WAVE_FLOOR = 0.1
"""Seconds a reply of a wave is still waited for once the wave's time is up
(one buffered meanwhile is read at once)."""


@contextmanager
def _read_by(conn: Any, deadline: float | None) -> Iterator[None]:
    """Reads on ``conn`` wait only what is left until ``deadline`` (at least
    ``_WAVE_FLOOR``); its own socket timeout again after (before it goes back
    to its pool)."""
    sock = conn._sock
    if deadline is None or sock is None or conn.socket_timeout is None:
        yield
        return
    sock.settimeout(max(deadline - time.monotonic(), _WAVE_FLOOR))
    try:
        yield
    finally:
        if conn._sock is sock:
            sock.settimeout(conn.socket_timeout)


class ClusterWaves(StoreBase):
    """The sync store's Cluster waves (:meth:`_wave`): the calls of a step's wave
    written to their nodes, then read within one deadline."""

    def _caught(self, call: ScriptCall) -> Any:
        """``run(call)``'s reply, or its DurabilisError (the store's own)."""
        raise NotImplementedError

    def _wave(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Each call's reply or DurabilisError. Cluster: each call written to its
        key's primary before any reply is read (one round trip for the wave; a
        redirect, NOSCRIPT or failover reply, or a call that could not be
        written, goes again through redis-py's own routing). A wave of one call
        too (a claim step's waves are): read by redis-py, an interruption
        dropped its connection unread. Otherwise one by one (the simulator's
        unfused standalone store)."""
        if not calls or not self.is_cluster:
            return [self._caught(c) for c in calls]
        # A node that hangs costs the wave one socket timeout, not one per call
        # on it (read one after another, N calls there held the wave for N
        # timeouts, and the keep-alive's renewals of the claims on healthy nodes
        # with it: their leases ran out, a live operation was taken over). The
        # wave has one deadline; once a node failed in it (a connect, a write or
        # a read), its other calls fail at once: not sent, or their outcome
        # unknown (a plan compensates, as for any lost reply).
        deadline = None if self.socket_timeout is None else (
            time.monotonic() + self.socket_timeout)
        failed: dict[str, DurabilisError | None] = {}  # node -> the error its calls get
        since = GATE.ran  # (a signal handler's exception: one raised during this wave)
        unread: list[Any] = []
        out: list[Any] = []
        # Signal handlers wait while the wave's own bookkeeping runs (a connection
        # taken, written to, then kept in ``unread`` until its reply is read):
        # one raising between two of those lost the connection, its reply never
        # read. They run during the writes, the reads and the usual path's calls
        # (``through``), where what was taken is in hand; the rest at the end.
        held = GATE.hold()
        try:
            self._each_call(calls, unread, out, failed=failed, deadline=deadline, since=since)
        finally:
            if held:  # (held again, whatever ended the calls: no call before)
                GATE.closed = GATE.holding = True
            try:
                self._left_unread(calls, unread, failed, deadline)
            finally:
                GATE.unhold(held)
        return out

    def _each_call(
        self, calls: Sequence[ScriptCall], unread: list[Any], out: list[Any], *,
        failed: dict[str, DurabilisError | None], deadline: float | None, since: int,
    ) -> None:
        """:meth:`_wave`'s calls written, then their replies read into ``out``."""
        for call in calls:  # every call written first...
            unread.append(self._send_to_node(call, failed, since))
        for i, call in enumerate(calls):  # ...then each reply read
            on, unread[i] = unread[i], None  # (each connection given back)
            if on is None:  # not written, for no node's fault: the usual path
                out.append(through(self._caught, call))
            elif type(on) is str:  # not written: its node failed in this wave
                out.append(self._unreached(call, on, failed))
            elif type(on) is _Lost:  # a write that timed out: it may run
                out.append(_unknown(call, on.node))
            elif on[2].name in failed:  # written; its node failed since: unknown
                _drop(on[0], on[1])
                out.append(_unknown(call, on[2].name))
            else:
                reply = self._reply_of(call, on, deadline, failed, since)
                if isinstance(reply, StorageUnavailable) and not isinstance(
                    reply, NotReplicated
                ):
                    failed[on[2].name] = None
                out.append(reply)

    def _left_unread(
        self, calls: Sequence[ScriptCall], unread: list[Any],
        failed: dict[str, DurabilisError | None], deadline: float | None,
    ) -> None:
        """Interrupted (KeyboardInterrupt, SystemExit): the calls written still run;
        wait for their replies (within the wave's time; not on a node that failed
        in it) so that the plan's compensation never overtakes one of them."""
        for i, (call, on) in enumerate(zip(calls, unread, strict=False)):
            if type(on) is not tuple:
                continue
            unread[i] = None
            if on[2].name in failed or _HURRY in failed:
                _drop(on[0], on[1])
                continue
            drained = False
            try:
                drained = _drain(on[0], on[1], 2 if self._waits(call) else 1, deadline)
            except BaseException:  # interrupted again: the rest dropped, unread
                failed[_HURRY] = None
                self._left_unread(calls, unread, failed, deadline)
                raise
            finally:
                _given_back(on[0], on[1], drained)
            if not drained:
                failed[on[2].name] = None  # (its other calls: dropped, not waited for)

    def _unreached(
        self, call: ScriptCall, name: str, failed: dict[str, DurabilisError | None]
    ) -> Any:
        """A call not written because its node failed in this wave: the first goes
        the usual way (redis-py re-reads the slots: a failover, a moved slot);
        if that fails too, the others fail at once with its error."""
        error = failed.get(name)
        if error is not None:
            return error
        reply = through(self._caught, call)
        if isinstance(reply, StorageUnavailable):
            failed[name] = reply
        else:  # (the usual way works: the others go that way too)
            failed.pop(name, None)
        return reply

    def _send_to_node(
        self, call: ScriptCall, failed: dict[str, DurabilisError | None], since: int,
    ) -> tuple[Any, Any, Any] | str | _Lost | None:
        """Write one script to the connection of its key's primary (Cluster).
        ``None`` if it could not be written whole (then nothing ran: the usual
        path sends it); the node's name if the node failed (connecting, writing)
        in this wave, now or before (``failed``): then nothing is tried there."""
        try:
            node = self.client.get_node_from_key(call.keys[0])
        except Exception as exc:
            if GATE.made_of(exc, since) is not None:
                raise  # a signal handler's (nothing written): an interruption
            return None
        if node.name in failed:
            return str(node.name)
        try:
            redis_node = self.client.get_redis_connection(node)
            conn = redis_node.connection_pool.get_connection()
        except Exception as exc:
            if GATE.made_of(exc, since) is not None:
                raise  # a signal handler's (nothing written): an interruption, no node's fault
            if isinstance(exc, _UNREACHABLE):
                failed[node.name] = None
                return str(node.name)
            return None
        try:
            through(self._write, conn, call)
        except BaseException as exc:
            conn.disconnect()
            redis_node.connection_pool.release(conn)
            if GATE.made_of(exc, since) is not None:
                raise  # a signal handler's: an interruption (the plan takes it as unknown)
            if isinstance(exc, _UNREACHABLE):  # part of it may be in the node's
                failed[node.name] = None  # buffers (a script whole, its WAIT not):
                return _Lost(str(node.name))  # it may run, so it is never sent again
            if isinstance(exc, Exception):  # not written whole: it does not run
                return None
            raise
        return redis_node, conn, node

    def _write(self, conn: Any, call: ScriptCall) -> None:
        if self._waits(call):
            conn.send_packed_command(conn.pack_commands([self._evalsha(call), self._wait()]))
        else:
            conn.send_command(*self._evalsha(call))

    def _reply_of(
        self, call: ScriptCall, on: tuple[Any, Any, Any], deadline: float | None,
        failed: dict[str, DurabilisError | None], since: int,
    ) -> Any:
        """The reply of a script :meth:`_send_to_node` wrote (``on``: its node's
        client, the connection, the node; or its DurabilisError),
        waited for until ``deadline`` at the most (then: lost, outcome unknown).

        Interrupted while waiting (Ctrl-C, ``SystemExit``), the connection is
        drained within the same deadline before the interruption goes on, as
        :meth:`_left_unread` drains the calls not read yet: the script was
        written and runs, and the plan's compensation (a claim's release, on
        another connection) must not overtake it. (Read with redis-py's
        ``disconnect_on_error=False``: an interrupted read is parsed again
        from where it stood; its default drops the connection.)"""
        redis_node, conn, node = on
        pool = redis_node.connection_pool
        waits = self._waits(call)
        got: list[Any] = []  # the replies read (the script's, then WAIT's)
        try:
            with _read_by(conn, deadline):
                through(_read_into, conn, got, 2 if waits else 1)
            reply, acked = got[0], (got[1] if waits else None)
        except BaseException as exc:
            left = (2 if waits else 1) - len(got)
            if isinstance(exc, Exception) and GATE.made_of(exc, since) is None:
                # lost on the way: the outcome is unknown
                conn.disconnect()
                pool.release(conn)
                through(self._reread_slots, node)
                return map_error(exc, call)
            # An interruption, or a signal handler's exception (as one): drained first.
            if not left:  # (every reply read: its timeout may not be restored yet)
                _drop(redis_node, conn)
                raise
            drained = False
            try:
                drained = _drain_past(redis_node, conn, left, deadline)
            except BaseException:  # interrupted again: the wave's other calls dropped
                failed[_HURRY] = None
                raise
            finally:
                _given_back(redis_node, conn, drained)
            if not drained:
                failed[node.name] = None  # (its other calls: dropped, not waited for)
            raise
        pool.release(conn)
        if isinstance(reply, _NOT_RUN):  # a redirect, NOSCRIPT, a failover: nothing ran
            return through(self._caught, call)  # the usual path
        if isinstance(reply, redis.exceptions.ResponseError):
            return map_error(reply, call)
        if self._waits(call):
            try:
                self._confirmed(acked, call)
            except NotReplicated as exc:
                return exc
        return reply

    def _reread_slots(self, node: Any) -> None:
        """After a connection failed, as redis-py does: the node tried last, the slot
        map read again (a failover moves the slots to a new primary). What a
        signal handler raises meanwhile (a ``SIGALRM`` timeout) goes on."""
        since = GATE.ran
        try:
            self.client.nodes_manager.move_node_to_end_of_cached_nodes(node.name)
            self.client.nodes_manager.initialize(last_failed_node_name=node.name)
        except Exception as exc:  # the next call finds out again
            if GATE.made_of(exc, since) is not None:
                raise
        swallowed = GATE.swallowed(since)  # (one caught in there: it asked the next node)
        if swallowed is not None:
            raise swallowed
