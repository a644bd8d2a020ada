"""The console's pieces below the routes: its security headers, how a form is
read, and how a stored value is shown in a page (no route, no template)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durabilis.cli import jsonable, printable
from durabilis.dlq import DlqRecord
from durabilis.web._data import ACTION_MAX, DEFAULT_PAGE, MAX_PAGE, BadInput

CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")

# a bulk confirmation's ids (<= 200 chars each) and versions (<= 63 chars each)
MAX_FORM_BYTES = ACTION_MAX * (202 + 65) + 16 * 1024


class _SecurityHeaders:
    """Adds the strict CSP and friends to every response (pure ASGI: no buffering)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() not in _OWN_HEADERS]
                headers += _HEADERS
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
_OWN_HEADERS = {k for k, _ in _HEADERS}


def _fmt_dt(value: Any) -> str:
    if not isinstance(value, datetime):
        return "-" if value is None else printable(value)
    if value.year >= 9999:
        return "never"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cell(value: Any, limit: int = 80) -> str:
    """A stored value on one line (the CLI's :func:`printable`), cut at ``limit``."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return _fmt_dt(value)
    text = printable(getattr(value, "value", value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json_text(value: Any) -> str:
    text = json.dumps(jsonable(value), indent=2, ensure_ascii=False, sort_keys=True)
    # JSON escapes the C0 controls; the rest (bidi overrides...) as the CLI shows them.
    return "\n".join(printable(line, escape_backslash=False) for line in text.split("\n"))


def _not_allowed() -> Response:
    """HEAD on an action route: 405 (it neither confirms nor acts; the hook is not asked)."""
    return Response(status_code=405, headers={"allow": "GET, POST"})


async def _read_form(request: Request) -> dict[str, str]:
    """The POSTed url-encoded form's fields (read up to :data:`MAX_FORM_BYTES`; another
    content type has no field, so its CSRF check fails)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, "form too large")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        return {}
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=50)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: v[0] for k, v in parsed.items()}


def _page_size(text: str | None) -> int:
    if not text:
        return DEFAULT_PAGE
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        raise BadInput(f"limit must be an integer in 1..{MAX_PAGE}")
    return int(text)


_RECORD_FIELDS = (
    "dlq_id", "status", "operation_type", "agent_id", "retry_count", "replay_attempts",
    "parkings", "failed_at", "last_parked_at", "expires_at", "original_error", "last_error",
    "last_replay_at", "requeued_at", "requeued_by", "replayed_at", "replayed_by",
    "abandoned_at", "abandoned_by", "claimed_by", "claim_expires_at", "last_replay_error",
    "last_replay_error_at", "stream_id",
)
_ERROR_FIELDS = frozenset({"original_error", "last_error"})


def _record_rows(record: DlqRecord) -> list[tuple[str, Any, bool]]:
    """(field, value, is an error text) for the record page's table; ``trace``: the
    parked call's W3C trace context (durabilis.otel), as ``dlq show`` prints it."""
    rows = [(name, getattr(record, name), name in _ERROR_FIELDS) for name in _RECORD_FIELDS]
    trace = getattr(record, "trace_context", None)
    if trace is not None:
        parent, state = trace
        rows.append(("trace", parent if state is None else f"{parent} (tracestate {state})",
                     False))
    return rows
