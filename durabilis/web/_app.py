"""The console's Starlette app: routes, security headers, CSRF, the actions' gate.

Safe by construction: every page is a Jinja2 template with autoescape on (a
stored string can never become markup), there is no script at all (the
Content-Security-Policy forbids one), every stored text also goes through the
CLI's :func:`~durabilis.cli.printable` (control characters shown as escapes),
and the actions (off by default) pass three gates in order: ``actions=True``,
the host's ``authorize`` hook naming an actor, and (for the POST that acts) a
CSRF token bound to a signed cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from durabilis.cli import describe_error_text, printable
from durabilis.config import breaker_to_dict, config_to_dict, policy_to_dict
from durabilis.dlq import DlqRecord
from durabilis.errors import ConfigError, DurabilisError, StorageUnavailable
from durabilis.events import REDACTED
from durabilis.layer import DurabilityConfig
from durabilis.web import _charts, _data
from durabilis.web._data import (
    ACTION_MAX,
    STATUSES,
    BadInput,
    Console,
    DlqFilter,
)
from durabilis.web._page_parts import (
    _cell,
    _fmt_dt,
    _json_text,
    _not_allowed,
    _page_size,
    _read_form,
    _record_rows,
    _SecurityHeaders,
)


@dataclass(frozen=True, slots=True)
class BulkTarget:
    """What a bulk action (``/dlq-bulk/...``) acts on, as the ``authorize`` hook gets it.

    Attributes:
        status, operation_type, reason, agent, older_than: The filter (as the
            ``/dlq`` query string gives it; ``None``: not filtered on).
        dlq_ids: The records the confirmation page shows, in enqueue order: on
            the POST, exactly those the action will try (signed by the
            confirmation page, checked before anything is done); each is
            still re-checked by the DLQ (one no longer in the state the
            action needs is skipped).

    ``str(target)`` is ``"filter:status=pending, operation_type=..."``.
    """

    status: str
    operation_type: str | None
    reason: str | None
    agent: str | None
    older_than: str | None
    dlq_ids: tuple[str, ...]

    @classmethod
    def of(cls, flt: DlqFilter, dlq_ids: tuple[str, ...]) -> BulkTarget:
        return cls(flt.status, flt.operation_type, flt.reason, flt.agent, flt.older_than,
                   dlq_ids)

    def __str__(self) -> str:
        return "filter:" + DlqFilter(self.status, self.operation_type, self.reason,
                                     self.agent, self.older_than).describe()


Authorize = Callable[[Request, str, "str | BulkTarget"], "str | Awaitable[str | None] | None"]
"""``authorize(request, action, target) -> actor name | None`` (``None``: refused).
``action`` is ``"requeue"``, ``"abandon"`` or ``"purge"``; ``target`` the dlq_id (a
``str``) for one record, or a :class:`BulkTarget` (the filter and the exact ids) for
an action over a filter. May be a coroutine function."""


CSRF_COOKIE = "durabilis_csrf"
CSRF_FIELD = "csrf_token"
SELECTION_FIELD = "selection"
IDS_FIELD = "dlq_ids"
VERSIONS_FIELD = "versions"
ISSUED_FIELD = "issued"
NONCE_FIELD = "nonce"
CONFIRM_MAX_AGE_SECONDS = 900
"""A confirmation (its signed issue time) is refused once older than this."""
_NONCE_TTL_MS = (CONFIRM_MAX_AGE_SECONDS + 3600) * 1000  # kept well past that age
_NONCE = re.compile(r"[A-Za-z0-9_-]{22,64}")
_VERSION = re.compile(r"(\d{1,20}-\d{1,20}):(\d{1,20})")
_COOKIE_VALUE = re.compile(r"^[A-Za-z0-9_-]{20,100}$")
ACTIONS = ("requeue", "abandon", "purge")
_HERE = Path(__file__).resolve().parent


def _now() -> float:
    """The clock a confirmation's issue time is read from (seconds)."""
    return time.time()
_CSS = (_HERE / "static" / "console.css").read_bytes()


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """How a console app behaves (``create_app``'s keywords).

    Attributes:
        actions: Whether the action routes exist at all (403 otherwise).
        authorize: The host's hook; every action needs it to name an actor.
        redact: Error texts redacted after their code and type, payloads and
            checkpoint states hidden (as the CLI prints them by default).
            ``False``: shown in clear (the CLI's ``--show-errors``).
        title: Shown in the page header.
    """

    actions: bool = False
    authorize: Authorize | None = None
    redact: bool = True
    title: str = "durabilis"




class _Pages:
    """The route handlers of one app (its console, settings, templates, secret)."""

    def __init__(self, console: Console, settings: ConsoleSettings, secret: bytes) -> None:
        self.console = console
        self.settings = settings
        self.secret = secret
        self.router: Any = None  # set by create_app (url_path_for)
        env = Environment(loader=FileSystemLoader(str(_HERE / "templates")),
                          autoescape=True, undefined=StrictUndefined,
                          trim_blocks=True, lstrip_blocks=True)
        env.filters["cell"] = _cell
        env.filters["dt"] = _fmt_dt
        env.filters["err"] = self.error_text
        env.filters["json"] = _json_text
        self.env = env

    # -- helpers ----------------------------------------------------------------------

    def error_text(self, text: str | None) -> str:
        """A stored error text as the CLI prints it: redacted after its code and
        type (:func:`~durabilis.cli.describe_error_text`) unless ``redact=False``."""
        if text is None:
            return "-"
        return printable(describe_error_text(text, redacted=self.settings.redact) or "")

    def url(self, request: Request, route: str, query: Mapping[str, Any] | None = None, /,
            **params: Any) -> str:
        """A path under the app's mount point (``root_path``), with a query string."""
        path = self.router.url_path_for(
            route, **{k: quote(str(v), safe="") for k, v in params.items()})
        out: str = str(request.scope.get("root_path", "")).rstrip("/") + str(path)
        if query:
            out += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        return out

    def render(self, request: Request, template: str, status_code: int = 200,
               **context: Any) -> HTMLResponse:
        def url(route: str, query: Mapping[str, Any] | None = None, /, **params: Any) -> str:
            return self.url(request, route, query, **params)

        html = self.env.get_template(template).render(
            url=url, settings=self.settings, namespace=self.console.namespace,
            redacted=REDACTED, statuses=STATUSES, **context,
        )
        return HTMLResponse(html, status_code=status_code)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await run_in_threadpool(fn, *args)

    # -- read-only pages ---------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        totals, stats, samples = await self.run(self.console.overview)
        charts = _charts.overview_charts(samples)
        return self.render(request, "overview.html", title="Overview", totals=totals,
                           stats=stats, charts=charts, samples=len(samples))

    async def dlq_list(self, request: Request) -> Response:
        flt = DlqFilter.parse(request.query_params)
        limit = _page_size(request.query_params.get("limit"))
        after = request.query_params.get("after") or None
        page = await self.run(self.console.dlq_page, flt, after, limit)
        next_url = None
        if page.next_after is not None:
            next_url = self.url(request, "dlq_list",
                                {**flt.query(), "limit": limit, "after": page.next_after})
        return self.render(request, "dlq_list.html", title="Dead-letter queue", flt=flt,
                           page=page, limit=limit, next_url=next_url, after=after,
                           filter_query=flt.query())

    async def dlq_record(self, request: Request) -> Response:
        dlq_id = request.path_params["dlq_id"]
        record = await self.run(self.console.record, dlq_id)
        if record is None:
            raise HTTPException(404, f"no live DLQ record {printable(dlq_id)}")
        history, truncated = await self.run(self.console.history, record)
        return self.render(request, "dlq_record.html", title="DLQ record", record=record,
                           rows=_record_rows(record), history=history,
                           history_truncated=truncated, history_scan=_data.HISTORY_SCAN)

    async def breakers(self, request: Request) -> Response:
        rows, more = await self.run(self.console.breakers)
        return self.render(request, "breakers.html", title="Circuit breakers", rows=rows,
                           more=more, limit=_data.BREAKER_LIMIT)

    async def breaker(self, request: Request) -> Response:
        name = request.path_params["name"]
        found = await self.run(self.console.breaker, name)
        if found is None:
            raise HTTPException(404, f"unknown breaker {printable(name)}")
        row, transitions = found
        timeline = _charts.breaker_timeline(row.info, transitions)
        return self.render(request, "breaker.html", title=f"Breaker {_cell(name, 60)}",
                           row=row, transitions=transitions, timeline=timeline,
                           config=breaker_to_dict(row.config))

    async def checkpoints(self, request: Request) -> Response:
        task = request.query_params.get("task_id", "").strip()
        if task:
            agent = request.query_params.get("agent", "").strip()
            target = self.url(request, "checkpoint_task", {"agent": agent or None},
                              task_id=task)
            return Response(status_code=303, headers={"location": target})
        return self.render(request, "checkpoints.html", title="Checkpoints", task_id=None,
                           agent=None, found=None)

    async def checkpoint_task(self, request: Request) -> Response:
        task = request.path_params["task_id"]
        agent = request.query_params.get("agent", "").strip() or None
        found = await self.run(self.console.checkpoints, task, agent)
        return self.render(request, "checkpoints.html", title="Checkpoints", task_id=task,
                           agent=agent, found=found, checkpoint_limit=_data.CHECKPOINT_LIMIT)

    async def inflight(self, request: Request) -> Response:
        found = await self.run(self.console.inflight)
        return self.render(request, "inflight.html", title="In flight", found=found)

    async def config(self, request: Request) -> Response:
        fleet, local = await self.run(self.console.config)
        return self.render(
            request, "config.html", title="Configuration", fleet=fleet,
            retry={k: policy_to_dict(v) for k, v in sorted(fleet.retry_policies.items())},
            breakers={k: breaker_to_dict(v) for k, v in sorted(fleet.breakers.items())},
            local=config_to_dict(local),
        )

    async def css(self, request: Request) -> Response:
        return Response(_CSS, media_type="text/css")

    # -- actions ------------------------------------------------------------------------

    async def _actor(self, request: Request, action: str, target: str | BulkTarget) -> str:
        """The actor the host's hook names, or 403 (actions off, no hook, refused)."""
        hook = self.settings.authorize
        if not self.settings.actions or hook is None:
            raise HTTPException(403, "actions are disabled in this console")
        actor = hook(request, action, target)
        if inspect.isawaitable(actor):
            actor = await actor
        if not isinstance(actor, str) or not actor.strip():
            raise HTTPException(403, f"not authorized to {action} {printable(str(target))}")
        return actor

    def _csrf_cookie(self, request: Request) -> tuple[str, bool]:
        """This browser's CSRF cookie value, and whether it must be set now."""
        value = request.cookies.get(CSRF_COOKIE, "")
        if _COOKIE_VALUE.fullmatch(value):
            return value, False
        return secrets.token_urlsafe(32), True

    def _token(self, cookie: str) -> str:
        return hmac.new(self.secret, b"csrf:" + cookie.encode(), hashlib.sha256).hexdigest()

    def _check_csrf(self, request: Request, fields: Mapping[str, str]) -> None:
        """403 unless the form's token is the signature of this browser's cookie."""
        cookie = request.cookies.get(CSRF_COOKIE, "")
        sent = fields.get(CSRF_FIELD, "")
        if not _COOKIE_VALUE.fullmatch(cookie) or not sent or not hmac.compare_digest(
                sent.encode("utf-8", "surrogatepass"), self._token(cookie).encode()):
            raise HTTPException(403, "missing or wrong CSRF token: reload the confirmation "
                                "page and try again")

    def _selection(self, action: str, token: str, flt: DlqFilter | None,
                   ids: tuple[str, ...], fields: Mapping[str, str]) -> str:
        """The signature of a confirmation's frozen selection: bound to this
        browser's CSRF token, the action, the filter (canonical JSON; ``None``:
        one record's confirmation), the exact ids shown, each one's identity
        (stream id and parking count), the issue time and the nonce."""
        text = "\x00".join([
            "bulk" if flt is not None else "one", action, token,
            flt.canonical() if flt is not None else "", " ".join(ids),
            fields.get(VERSIONS_FIELD, ""), fields.get(ISSUED_FIELD, ""),
            fields.get(NONCE_FIELD, ""),
        ])
        return hmac.new(self.secret, text.encode("utf-8", "surrogatepass"),
                        hashlib.sha256).hexdigest()

    def _confirm(self, request: Request, action: str, target: str, post_url: str,
                 **context: Any) -> Response:
        cookie, fresh = self._csrf_cookie(request)
        token = self._token(cookie)
        records: list[DlqRecord] = context["records"]
        ids = tuple(r.dlq_id for r in records)
        fields = {
            VERSIONS_FIELD: " ".join(f"{r.stream_id}:{r.parkings}" for r in records),
            ISSUED_FIELD: str(int(_now())),
            NONCE_FIELD: secrets.token_urlsafe(24),
        }
        if context.get("flt") is not None:
            fields = {IDS_FIELD: " ".join(ids), **fields}
        fields[SELECTION_FIELD] = self._selection(action, token, context.get("flt"), ids,
                                                  fields)
        response = self.render(request, "confirm.html", title=f"Confirm: {action}",
                               action=action, target=target, csrf=token,
                               post_url=post_url, selection=fields, **context)
        if fresh:
            response.set_cookie(
                CSRF_COOKIE, cookie, httponly=True, samesite="strict",
                secure=request.url.scheme == "https",
                path=(request.scope.get("root_path", "") or "/"),
            )
        return response

    async def _check_selection(self, request: Request, action: str, flt: DlqFilter | None,
                               ids: tuple[str, ...], fields: Mapping[str, str]
                               ) -> dict[str, tuple[str, int]]:
        """403 unless the form is a confirmation this console signed for this
        browser, action, filter and ids, issued at most
        :data:`CONFIRM_MAX_AGE_SECONDS` ago and never used before (its nonce
        spent now). Returns each id's identity as the confirmation showed it."""
        token = self._token(request.cookies.get(CSRF_COOKIE, ""))
        sent = fields.get(SELECTION_FIELD, "")
        if not hmac.compare_digest(sent.encode("utf-8", "surrogatepass"),
                                   self._selection(action, token, flt, ids, fields).encode()):
            raise HTTPException(403, "the selection is not the one the confirmation page "
                                "showed: reload the confirmation page and try again")
        # Signed by this console: well formed (checked anyway, as cheap as it is).
        issued, nonce = fields.get(ISSUED_FIELD, ""), fields.get(NONCE_FIELD, "")
        versions = [_VERSION.fullmatch(v) for v in fields.get(VERSIONS_FIELD, "").split()]
        if (not issued.isdigit() or not _NONCE.fullmatch(nonce) or len(versions) != len(ids)
                or not all(versions)):
            raise HTTPException(403, "a malformed confirmation: reload the confirmation page")
        if _now() - int(issued) > CONFIRM_MAX_AGE_SECONDS:
            raise HTTPException(403, f"this confirmation is too old (more than "
                                f"{CONFIRM_MAX_AGE_SECONDS // 60} minutes): reload the "
                                "confirmation page and try again")
        if not await self.run(self.console.spend_nonce, nonce, _NONCE_TTL_MS):
            raise HTTPException(403, "this confirmation was used already (each one acts "
                                "once): reload the confirmation page to act again")
        return {i: (m[1], int(m[2])) for i, m in zip(ids, versions, strict=True) if m}

    def _enabled(self) -> None:
        """403 before anything else (even a 400 or 404) when actions are off."""
        if not self.settings.actions or self.settings.authorize is None:
            raise HTTPException(403, "actions are disabled in this console")

    async def record_action(self, request: Request) -> Response:
        if request.method == "HEAD":
            return _not_allowed()
        self._enabled()
        action = request.path_params["action"]
        dlq_id = request.path_params["dlq_id"]
        if action not in ACTIONS:
            raise HTTPException(404, "no such page")
        actor = await self._actor(request, action, dlq_id)
        if request.method == "GET":
            record = await self.run(self.console.record, dlq_id)
            if record is None:
                raise HTTPException(404, f"no live DLQ record {printable(dlq_id)}")
            return self._confirm(
                request, action, dlq_id,
                self.url(request, "dlq_action", dlq_id=dlq_id, action=action),
                records=[record], count=1, more=False, flt=None, actor=actor,
                back=self.url(request, "dlq_record", dlq_id=dlq_id))
        fields = await _read_form(request)
        self._check_csrf(request, fields)
        expected = await self._check_selection(request, action, None, (dlq_id,), fields)
        if action == "requeue":
            outcome = await self.run(self.console.requeue, dlq_id, actor, expected)
        elif action == "abandon":
            outcome = await self.run(self.console.abandon, dlq_id, actor, expected)
        else:
            outcome = (await self.run(self.console.purge, [dlq_id], actor, None,
                                      expected))[dlq_id]
        return self.render(request, "result.html", title=f"Done: {action}", action=action,
                           outcomes={dlq_id: outcome}, actor=actor, skipped=None,
                           back=self.url(request, "dlq_record", dlq_id=dlq_id)
                           if action != "purge" else self.url(request, "dlq_list"))

    async def bulk_action(self, request: Request) -> Response:
        """The confirmation (GET) freezes the selection: the exact ids it shows,
        signed with the CSRF token; the POST acts on those ids only (each still
        re-checked by the DLQ), never on what the filter selects by then."""
        if request.method == "HEAD":
            return _not_allowed()
        self._enabled()
        action = request.path_params["action"]
        if action not in ("requeue", "purge"):
            raise HTTPException(404, "no such page")
        if request.method == "GET":
            flt = DlqFilter.parse(request.query_params)
            records, more = await self.run(self.console.select, flt)
            target = BulkTarget.of(flt, tuple(r.dlq_id for r in records))
            actor = await self._actor(request, action, target)
            return self._confirm(request, action, str(target),
                                 self.url(request, "dlq_bulk", action=action),
                                 records=records, count=len(records), more=more, flt=flt,
                                 actor=actor, back=self.url(request, "dlq_list", flt.query()))
        # The filter and the frozen ids come back in the form: the hook judges them,
        # then the token and the selection's signature are checked, before anything.
        fields = await _read_form(request)
        flt = DlqFilter.parse(fields)
        ids = tuple(fields.get(IDS_FIELD, "").split())
        if len(ids) > ACTION_MAX:
            raise BadInput(f"at most {ACTION_MAX} records per confirmation")
        actor = await self._actor(request, action, BulkTarget.of(flt, ids))
        self._check_csrf(request, fields)
        expected = await self._check_selection(request, action, flt, ids, fields)
        results: dict[str, str] = {}
        done = "requeued" if action == "requeue" else "purged"
        if ids and action == "requeue":
            results = await self.run(self.console.requeue_many, ids, actor, expected)
        elif ids:
            status = None if flt.status == "all" else flt.status
            results = await self.run(self.console.purge, ids, actor, status, expected)
        skipped = sum(1 for outcome in results.values() if outcome != done)
        return self.render(request, "result.html", title=f"Done: {action}", action=action,
                           outcomes=results, actor=actor, skipped=skipped,
                           back=self.url(request, "dlq_list", flt.query()))

    # -- errors -------------------------------------------------------------------------

    async def http_error(self, request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        detail = getattr(exc, "detail", "") or "error"
        return self.render(request, "error.html", status_code=status, title=f"Error {status}",
                           status=status, message=str(detail))

    async def bad_input(self, request: Request, exc: Exception) -> Response:
        return self.render(request, "error.html", status_code=400, title="Error 400",
                           status=400, message=str(exc))

    async def unavailable(self, request: Request, exc: Exception) -> Response:
        return self.render(request, "error.html", status_code=503, title="Error 503",
                           status=503, message=f"Redis unavailable: {exc}")

    async def durabilis_error(self, request: Request, exc: Exception) -> Response:
        return self.render(request, "error.html", status_code=500, title="Error 500",
                           status=500, message=f"{type(exc).__name__}: {exc}")


def create_app(
    url_or_store: Any = None,
    *,
    namespace: str | None = None,
    config: DurabilityConfig | None = None,
    actions: bool = False,
    authorize: Authorize | None = None,
    redact: bool = True,
    secret_key: str | bytes | None = None,
    sample_interval_seconds: float = 5.0,
    history_size: int = 720,
    title: str = "durabilis",
) -> Starlette:
    """The web console as an ASGI app (Starlette), read-only unless actions are on.

    Args:
        url_or_store: A Redis URL (``durabilis.connect`` takes it; ``None``: the
            environment, as ``connect``) or a :class:`~durabilis.Store`.
        namespace: The namespace (with a URL; default ``"durabilis"``). With a
            store, its own (a different one here is a ``ConfigError``).
        config: The fleet's config (breakers, policies, DLQ settings); defaults
            when ``None``. What is published to the fleet config applies on top.
        actions: Enable the action routes (requeue, abandon, purge). They also
            need ``authorize`` to name an actor for each request.
        authorize: ``authorize(request, action, target) -> actor | None``
            (sync or async; ``target``: the dlq_id, or a :class:`BulkTarget`
            for a bulk action): the actor's name is written in the DLQ's log
            stream with the change; ``None`` refuses (403, nothing done).
        redact: Error texts redacted after their code and type, payloads and
            checkpoint states hidden (``False``: in clear, as the CLI's
            ``--show-errors``).
        secret_key: Signs the CSRF tokens. Give the same one to every replica
            behind one load balancer; a random one per app when ``None``.
        sample_interval_seconds: Minimum time between two samples of the
            overview's history (fleet-wide).
        history_size: Samples kept for the overview's charts (fleet-wide).
        title: The page header.

    Raises:
        ConfigError: A bad argument (before any I/O).
    """
    import durabilis  # noqa: PLC0415

    if not isinstance(actions, bool) or not isinstance(redact, bool):
        raise ConfigError("actions", "actions and redact must be True or False")
    if authorize is not None and not callable(authorize):
        raise ConfigError("authorize", "must be callable(request, action, target)")
    if actions and authorize is None:
        raise ConfigError("authorize", "actions=True needs an authorize hook (it names the "
                          "actor of each action, or refuses it)")
    if isinstance(secret_key, str):
        secret_key = secret_key.encode()
    if secret_key is not None and (not isinstance(secret_key, bytes) or len(secret_key) < 16):
        raise ConfigError("secret_key", "must be at least 16 bytes")
    if isinstance(url_or_store, str) or url_or_store is None:
        store = durabilis.connect(url_or_store, namespace=namespace or "durabilis")
        owned = True
    else:
        store = url_or_store
        owned = False
        if namespace is not None and namespace != store.keys.namespace:
            raise ConfigError("namespace", f"the store's namespace is "
                              f"{store.keys.namespace!r}, not {namespace!r}")
    console = Console(store, config, sample_interval_seconds=sample_interval_seconds,
                      history_size=history_size)
    settings = ConsoleSettings(actions, authorize, redact, title)
    pages = _Pages(console, settings, secret_key or secrets.token_bytes(32))
    both = ["GET", "POST"]
    routes = [
        Route("/", pages.overview, name="overview"),
        Route("/static/console.css", pages.css, name="static"),
        Route("/dlq", pages.dlq_list, name="dlq_list"),
        Route("/dlq-bulk/{action:str}", pages.bulk_action, methods=both, name="dlq_bulk"),
        Route("/dlq/{dlq_id:str}", pages.dlq_record, name="dlq_record"),
        Route("/dlq/{dlq_id:str}/{action:str}", pages.record_action, methods=both,
              name="dlq_action"),
        Route("/breakers", pages.breakers, name="breakers"),
        Route("/breakers/{name:path}", pages.breaker, name="breaker"),
        Route("/checkpoints", pages.checkpoints, name="checkpoints"),
        Route("/checkpoints/{task_id:path}", pages.checkpoint_task, name="checkpoint_task"),
        Route("/inflight", pages.inflight, name="inflight"),
        Route("/config", pages.config, name="config"),
    ]

    async def on_shutdown() -> None:
        console.close()
        if owned:
            store.close()

    from contextlib import asynccontextmanager  # noqa: PLC0415

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        yield
        await on_shutdown()

    app = Starlette(
        routes=routes,
        exception_handlers={
            HTTPException: pages.http_error,
            BadInput: pages.bad_input,
            StorageUnavailable: pages.unavailable,
            DurabilisError: pages.durabilis_error,
        },
        lifespan=lifespan,
    )
    pages.router = app.router
    app.add_middleware(_SecurityHeaders)
    app.state.console = console
    app.state.settings = settings
    return app
