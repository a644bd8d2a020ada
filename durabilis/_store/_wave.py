"""A Cluster wave's helpers for the synchronous store (:meth:`Store._wave`): one
deadline for its reads, and what a call left unread or lost becomes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from durabilis._scripts import ScriptCall
from durabilis.errors import StorageUnavailable


def _wait_reply(target: Any, conn: Any) -> Any:
    """``WAIT``'s reply, or its error reply (a node demoted to replica refuses WAIT:
    then the script before it was refused too, or its write counts as unconfirmed)."""
    try:
        return target.parse_response(conn, "WAIT")
    except redis.exceptions.ResponseError as exc:
        return exc


def _kept_reply(conn: Any) -> Any:
    """One reply (an error reply returned, not raised). The connection is kept as
    it stands when the read fails or is interrupted (the caller drops or drains it)."""
    try:
        return conn.read_response(disconnect_on_error=False)
    except redis.exceptions.ResponseError as exc:
        return exc


def _drain(
    redis_node: Any, conn: Any, replies: int = 1, deadline: float | None = None,
    release: bool = True,
) -> bool:
    """Read and drop the ``replies`` written to ``conn`` (a script, its WAIT), then give
    ``conn`` back (disconnected if a reply did not come by ``deadline``: False).
    ``release=False``: the caller gives it back."""
    try:
        with _read_by(conn, deadline):
            for _ in range(replies):
                with contextlib.suppress(redis.exceptions.ResponseError):
                    redis_node.parse_response(conn, "EVALSHA")
    except BaseException:
        conn.disconnect()
        return False
    finally:
        if release:
            redis_node.connection_pool.release(conn)
    return True


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


def _unknown(call: ScriptCall, node: str) -> StorageUnavailable:
    return StorageUnavailable(
        f"Redis unavailable (script {call.name}): node {node} did not answer in this "
        "step; the call was sent, its outcome is unknown"
    )


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
