"""What the HTTP middleware's modules share: ASGI types, limits, request and
response helpers, and the failure that releases a request's key."""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from durabilis._log import get_logger
from durabilis.core.retry import NotRetried
from durabilis.errors import (
    ConfigError,
)
from durabilis.events import exception_str

__all__ = [  # the 0.x module's names that durabilis.http keeps importable (one star import)
    "DEFAULT_RELEASE_STATUSES",
    "DEFAULT_RESPONSE_HEADERS",
    "ASGIApp",
    "Message",
    "Receive",
    "Scope",
    "Send",
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
_LENGTH = struct.Struct(">Q").pack  # a fingerprinted part's length: 8 bytes, big-endian


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
    if not text.isprintable():  # (ASCII here: printable is 0x20-0x7E)
        return None, "the key must be printable ASCII"
    if len(text) > limit:
        return None, f"the key is {len(text)} characters, over the limit of {limit}"
    return text, ""


def _scan_headers(scope: Scope, header: bytes) -> tuple[list[bytes], list[bytes]]:
    """The values of the request's ``header`` and of its ``Content-Length``s (one pass)."""
    values: list[bytes] = []
    lengths: list[bytes] = []
    for k, v in scope.get("headers", ()):
        name = k.lower()
        if name == header:
            values.append(v)
        if name == b"content-length":
            lengths.append(v)
    return values, lengths


def _length_of(values: list[bytes]) -> int | None:
    """The length declared by the ``Content-Length`` header values of a request
    or response: ``None`` when absent, ``-1`` when malformed (not digits, or
    several headers that disagree)."""
    if not values:
        return None
    if len(values) > 1:
        distinct = {bytes(v).strip() for v in values}
        if len(distinct) > 1:
            return -1
        values = list(distinct)
    value = bytes(values[0]).strip()
    return int(value) if value.isdigit() else -1


def _media_type_in(content_type: bytes) -> str:
    """The media type of a ``Content-Type`` value (lower case, no parameters)."""
    return bytes(content_type).split(b";", 1)[0].strip().lower().decode("latin-1")


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
    # The same bytes as ever, in two updates (the body is not copied): each part
    # after its length (8 bytes, big-endian), the body last.
    method: bytes = payload["m"].encode()
    raw_path: bytes = payload["rp"]
    query: bytes = payload["q"]
    framed = [_LENGTH(len(method)), method, _LENGTH(len(raw_path)), raw_path,
              _LENGTH(len(query)), query]
    for k, v in payload["h"]:
        framed += (_LENGTH(len(k)), k, _LENGTH(len(v)), v)
    body: bytes = payload["b"]
    framed.append(_LENGTH(len(body)))
    digest = hashlib.sha256(b"".join(framed))
    digest.update(body)
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
