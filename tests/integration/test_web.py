"""The web console (durabilis.web), server side: Starlette's TestClient against a
namespace on the real Redis the suite runs.

- every page renders a namespace whose stored strings hold HTML, control
  characters and 10 KB texts, without ever sending them back as markup;
- the DLQ's filters and cursor paging, bounded work per request;
- mounted under a prefix, every link and form points under it;
- actions: refused (403, nothing done) with actions off, with the hook saying
  no, and without the right CSRF token; done, and audited with the actor's
  name in the DLQ's log stream, when all three gates pass; a requeued record is
  replayed once by the fleet (``replay_requeued``);
- the overview's history: shared by every console replica, capped.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

import durabilis
from durabilis import OperationError
from durabilis.breaker import CircuitBreakerConfig, CircuitBreakerRegistry
from durabilis.checkpoint import CheckpointManager
from durabilis.config import ConfigSync
from durabilis.dlq import DeadLetterQueue, DlqStatus
from durabilis.layer import DurabilityLayer, OperationContext
from durabilis.testing import instant_retries
from durabilis.web import BulkTarget, create_app
from durabilis.web import _data as web_data
from tests.support.ports import free_port
from tests.support.waits import wait_until

with warnings.catch_warnings():  # (Starlette 1.x nudges towards httpx2: same client here)
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

pytestmark = pytest.mark.topologies("cluster")

CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>"
CONTROLS = "\x1b[31mred\x1b[0m\r\nforged line\u202eevil\x07"
BIG = "A" * 10_240 + "<script>alert('big')</script>"
CLI = str(Path(sys.executable).with_name("durabilis"))


def yes(actor: str = "alice") -> Callable[[Any, str, str], str]:
    def authorize(request: Any, action: str, target: str) -> str:
        return actor
    return authorize


class Links(HTMLParser):
    """Every href / action / src of a page, and every data-testid."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.testids: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.scripts += 1
        for name, value in attrs:
            if name in ("href", "action", "src") and value is not None:
                self.urls.append(value)
            if name == "data-testid" and value is not None:
                self.testids.append(value)
            if name.startswith("on") or name == "style":
                raise AssertionError(f"<{tag} {name}=...> on a console page")


def parsed(html: str) -> Links:
    links = Links()
    links.feed(html)
    return links


@pytest.fixture
def consoles(store: durabilis.Store) -> Iterator[Callable[..., TestClient]]:
    """``console(**create_app kwargs)`` -> a TestClient; every console is closed after."""
    apps: list[Starlette] = []

    def make(**options: Any) -> TestClient:
        app = create_app(store, **options)
        apps.append(app)
        return TestClient(app)

    yield make
    for app in apps:
        app.state.console.close()


@pytest.fixture
def layer(store: durabilis.Store) -> Iterator[DurabilityLayer]:
    with DurabilityLayer(store) as layer:
        yield layer


def _park(layer: DurabilityLayer, n: int, *, agent: str = "agent-1", op: str = "job",
          code: str = "NETWORK_TIMEOUT", text: str = "ledger down") -> list[str]:
    def down(ctx: OperationContext) -> Any:
        raise OperationError(code, text)

    ids = []
    with instant_retries():
        for i in range(n):
            with pytest.raises(durabilis.RetryExhausted) as info:
                layer.execute(agent, op, {"page": i, "agent": agent, "op": op}, down)
            ids.append(str(info.value.dlq_id))
    return ids


def _hostile_namespace(store: durabilis.Store, raw: Any) -> dict[str, str]:
    """Fill the namespace with stored strings that are HTML, controls and 10 KB."""
    dlq = DeadLetterQueue(store)
    ids = {
        "html": dlq.enqueue(HOSTILE, HOSTILE, {"html": HOSTILE, "big": BIG}, 3,
                            f"NETWORK_TIMEOUT: {HOSTILE}", metadata={"note": HOSTILE}),
        "controls": dlq.enqueue(CONTROLS, CONTROLS, {"c": CONTROLS}, 1, CONTROLS,
                                metadata={"c": CONTROLS}),
        "big": dlq.enqueue("agent-big", "big-op", {"big": BIG}, 2, BIG,
                           metadata={"big": BIG}),
    }
    registry = CircuitBreakerRegistry(store, [CircuitBreakerConfig(
        HOSTILE, min_request_count=1, failure_rate_threshold=0.1)])
    registry.after_call(HOSTILE, False, registry.before_call(HOSTILE))
    registry.force_open(HOSTILE)
    manager = CheckpointManager(store)
    first = manager.save("task<b>", HOSTILE, "phase<i>", {"s": HOSTILE})
    manager.save("task<b>", HOSTILE, CONTROLS, {"s": BIG})
    manager.fork(first.checkpoint_id, "task<b>-fork")
    ConfigSync(store, breakers=registry).publish_breaker(
        CircuitBreakerConfig(HOSTILE + "-published"))
    # An orphan awaiting recovery: a claim whose lease ended (as a dead worker leaves it).
    raw.zadd(store.keys.layer("inflight"), {f"{HOSTILE}:{CONTROLS}|nonce1": 1000})
    return ids


def _pages(ids: dict[str, str]) -> list[str]:
    return ["/", "/dlq", "/dlq?status=all", *(f"/dlq/{i}" for i in ids.values()),
            "/breakers", f"/breakers/{HOSTILE}", "/checkpoints", "/checkpoints/task<b>",
            "/checkpoints/task<b>-fork", "/inflight", "/config"]


@pytest.mark.parametrize("redact", [True, False])
def test_every_page_renders_stored_html_controls_and_10kb_strings_as_text_never_markup(
    store: durabilis.Store, raw: Any, consoles: Callable[..., TestClient], redact: bool,
) -> None:
    ids = _hostile_namespace(store, raw)
    client = consoles(redact=redact)
    for path in _pages(ids):
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:2000])
        html = response.text
        assert "<script" not in html.lower(), path
        assert "<img" not in html.lower(), path
        assert "\x1b" not in html and "\u202e" not in html and "\x07" not in html, path
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"
        links = parsed(html)
        assert links.scripts == 0
    record = client.get(f"/dlq/{ids['html']}").text
    assert "&lt;script&gt;alert(" in record  # shown, as text
    assert "agent-big" in client.get("/dlq").text
    big = client.get(f"/dlq/{ids['big']}").text
    listing = client.get("/dlq").text
    assert len(listing) < 60_000, "a list page cuts each 10 KB field"
    assert "\\x1b[31mred" in client.get(f"/dlq/{ids['controls']}").text  # the CLI's escapes
    if redact:
        assert 'data-testid="record-operation" class="muted">hidden' in big  # no payload
        assert "big&#39;)&lt;/script&gt;" not in big.split('"record-metadata"')[0]  # error
        assert "NETWORK_TIMEOUT: [REDACTED]" in record
    else:
        assert "AAAAAAAAAA" * 100 in big  # the whole payload, in clear
        assert "NETWORK_TIMEOUT: &lt;script&gt;" in record
    breaker = client.get(f"/breakers/{HOSTILE}").text
    assert len(re.findall(r'data-testid="transition-row"', breaker)) >= 1
    assert 'class="seg open"' in breaker
    lineage = client.get("/checkpoints/task<b>-fork").text
    assert len(re.findall(r'data-testid="lineage-row"', lineage)) == 2  # fork <- its source
    assert 'data-testid="orphan-row"' in client.get("/inflight").text
    assert "-published" in client.get("/config").text


CONTRACT = {
    "/": ["nav", "nav-overview", "nav-dlq", "nav-breakers", "nav-checkpoints", "nav-inflight",
          "nav-config", "page-title", "namespace", "mode", "overview-totals", "total-started",
          "total-succeeded", "total-retries", "total-parked", "total-in-flight",
          "total-dlq-backlog", "chart-started", "chart-succeeded", "chart-retried",
          "chart-parked", "chart-in-flight", "chart-dlq-backlog", "history-samples"],
    "/dlq": ["dlq-filters", "filter-status", "filter-operation-type", "filter-reason",
             "filter-agent", "filter-older-than", "filter-submit", "dlq-summary", "dlq-table",
             "dlq-row", "dlq-link", "dlq-status", "dlq-operation-type", "dlq-agent",
             "dlq-error", "action-requeue-many", "action-purge"],
    "/dlq/{id}": ["dlq-record", "record-fields", "field-status", "field-agent_id",
                  "field-last_error", "record-metadata", "record-operation", "record-history",
                  "history-row", "history-change", "history-by", "action-requeue",
                  "action-abandon", "action-purge-one"],
    "/breakers": ["breakers-table", "breaker-row", "breaker-link", "breaker-state",
                  "breaker-failure-rate", "breaker-window", "breaker-probes"],
    "/breakers/{b}": ["breaker-detail", "breaker-timeline", "breaker-transitions",
                      "transition-row"],
    "/checkpoints": ["checkpoint-lookup", "lookup-task-id", "lookup-agent", "lookup-submit"],
    "/checkpoints/{t}": ["checkpoint-table", "checkpoint-row", "checkpoint-lineage",
                         "lineage-row", "checkpoint-state"],
    "/inflight": ["inflight-counts", "inflight-table", "inflight-row", "orphans-empty"],
    "/config": ["config-version", "config-updated", "config-retry", "config-breakers",
                "config-local"],
    "/dlq/{id}/requeue": ["confirm-summary", "confirm-form", "confirm-button",
                          "confirm-cancel"],
    "/dlq-bulk/purge": ["confirm-summary", "confirm-count", "confirm-form", "confirm-button"],
    "/nowhere": ["error-page", "error-message"],
}


def test_the_pages_carry_the_testids_the_contract_in_durabilis_web_names(
    store: durabilis.Store, layer: DurabilityLayer, consoles: Callable[..., TestClient],
) -> None:
    from durabilis import web

    (dlq_id,) = _park(layer, 1)
    registry = CircuitBreakerRegistry(store, [CircuitBreakerConfig("ledger")])
    registry.after_call("ledger", True, registry.before_call("ledger"))  # (names it in Redis)
    registry.force_open("ledger")
    CheckpointManager(store).save("t1", "a1", "p1", {"x": 1})
    client = consoles(actions=True, authorize=yes())
    for _ in range(2):  # found in Redis only: read with defaults, and said so, every time
        row = client.get("/breakers").text.split('data-breaker="ledger"')[1].split("</tr>")[0]
        assert "no (defaults)" in row and ">open<" in row
    release = threading.Event()

    def held(ctx: OperationContext) -> str:  # a claim in flight while the page is read
        release.wait(30)
        return "ok"

    worker = threading.Thread(target=layer.execute, args=("a1", "slow", {"n": 1}, held))
    worker.start()
    try:
        wait_until(lambda: layer.stats().in_flight == 1, what="the claim in flight")
        paths = {"/dlq/{id}": f"/dlq/{dlq_id}", "/breakers/{b}": "/breakers/ledger",
                 "/checkpoints/{t}": "/checkpoints/t1", "/dlq/{id}/requeue":
                 f"/dlq/{dlq_id}/requeue", "/dlq-bulk/purge": "/dlq-bulk/purge?status=all"}
        for page, testids in CONTRACT.items():
            response = client.get(paths.get(page, page))
            found = set(parsed(response.text).testids)
            missing = set(testids) - found
            assert not missing, f"{page}: {sorted(missing)}"
            for testid in testids:  # and the contract's docstring names each of them
                assert f"``{testid}``" in (web.__doc__ or "") or testid.startswith(
                    ("field-", "total-", "chart-")), testid
    finally:
        release.set()
        worker.join()


def _walk(client: TestClient, query: str) -> tuple[list[str], int]:
    """Every dlq_id the list pages show, following dlq-next; and how many pages."""
    shown: list[str] = []
    url: str | None = "/dlq?" + query
    pages = 0
    while url is not None:
        html = client.get(url).text
        pages += 1
        shown += re.findall(r'data-dlq-id="([^"]+)"', html)
        nxt = re.search(r'data-testid="dlq-next" href="([^"]+)"', html)
        url = nxt[1].replace("&amp;", "&") if nxt else None
        assert pages < 100
    return shown, pages


def test_dlq_filters_select_by_status_type_reason_agent_and_age_and_pages_follow_the_cursor(
    store: durabilis.Store, layer: DurabilityLayer, consoles: Callable[..., TestClient],
) -> None:
    a = _park(layer, 12, agent="agent-a", op="job")
    b = _park(layer, 5, agent="agent-b", op="mail", code="RATE_LIMITED")
    layer.dlq.abandon(a[0], by="ops")
    layer.dlq.requeue([a[1]], by="ops")
    client = consoles()
    shown, pages = _walk(client, "limit=5")
    assert shown == a[1:] + b and pages == 4  # pending, oldest first, each once
    assert _walk(client, "status=all&limit=7")[0] == a + b
    assert _walk(client, "status=abandoned")[0] == [a[0]]
    assert _walk(client, "status=requeued")[0] == [a[1]]
    assert _walk(client, "operation_type=mail")[0] == b
    assert _walk(client, "status=all&operation_type=job")[0] == a
    assert _walk(client, "reason=RATE_LIMITED")[0] == b
    assert _walk(client, "agent=agent-a&limit=3")[0] == a[1:]
    assert _walk(client, "older_than=1d")[0] == []
    assert _walk(client, "older_than=0s")[0] == a[1:] + b
    empty = client.get("/dlq?agent=nobody").text
    assert 'data-testid="dlq-empty"' in empty and 'data-testid="dlq-next"' not in empty
    for bad in ("status=bogus", "limit=0", "limit=201", "older_than=soon", "after=x%3Cy"):
        response = client.get("/dlq?" + bad)
        assert response.status_code == 400, bad
        assert 'data-testid="error-message"' in response.text


def test_a_list_page_examines_a_bounded_number_of_records_and_goes_on_from_there(
    store: durabilis.Store, layer: DurabilityLayer, consoles: Callable[..., TestClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(web_data, "SCAN_BOUND", 10)  # (1000 in production)
    ids = _park(layer, 25, agent="agent-a") + _park(layer, 1, agent="agent-z")
    client = consoles()
    first = client.get("/dlq?agent=agent-z").text
    assert 'data-testid="dlq-scan-note"' in first and 'data-dlq-id' not in first
    shown, pages = _walk(client, "agent=agent-z")
    assert shown == ids[-1:] and pages == 3  # 10 + 10 + 6 records looked at


def test_mounted_under_a_prefix_every_link_and_form_points_under_it(
    store: durabilis.Store, layer: DurabilityLayer,
) -> None:
    (dlq_id,) = _park(layer, 1)
    registry = CircuitBreakerRegistry(store, [CircuitBreakerConfig("a/b c")])
    registry.after_call("a/b c", True, registry.before_call("a/b c"))
    console = create_app(store, actions=True, authorize=yes("bob"))
    gateway = Starlette(routes=[Mount("/ops/durabilis", app=console)])
    client = TestClient(gateway)
    try:
        seen: set[str] = set()
        todo = ["/ops/durabilis/", "/ops/durabilis/dlq?status=all"]
        while todo:
            url = todo.pop()
            if url in seen:
                continue
            seen.add(url)
            response = client.get(url)
            assert response.status_code == 200, (url, response.text[:1000])
            for link in parsed(response.text).urls:
                assert link.startswith("/ops/durabilis/"), (url, link)
                if "/requeue" in link or "/abandon" in link or "/purge" in link:
                    continue  # (confirmation pages: checked below)
                todo.append(link)
        assert any(u.startswith("/ops/durabilis/breakers/a%2Fb%20c") for u in seen)
        assert f"/ops/durabilis/dlq/{dlq_id}" in seen
        page = client.get(f"/ops/durabilis/dlq/{dlq_id}/requeue")
        assert f'action="/ops/durabilis/dlq/{dlq_id}/requeue"' in page.text
        token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text)
        assert token is not None
        assert client.cookies.get("durabilis_csrf")
        done = client.post(f"/ops/durabilis/dlq/{dlq_id}/requeue", data=_hidden(page.text))
        assert "requeued" in done.text
        assert layer.dlq.get(dlq_id).requeued_by == "bob"  # type: ignore[union-attr]
        assert client.get("/ops/durabilis/static/console.css").headers[
            "content-type"].startswith("text/css")
    finally:
        console.state.console.close()


def _action_routes(dlq_id: str) -> list[str]:
    return [f"/dlq/{dlq_id}/requeue", f"/dlq/{dlq_id}/abandon", f"/dlq/{dlq_id}/purge",
            "/dlq-bulk/requeue?status=all", "/dlq-bulk/purge?status=all"]


def _log(raw: Any, store: durabilis.Store, dlq_id: str) -> list[tuple[str, str]]:
    return [(f[b"change"].decode(), f.get(b"by", b"").decode())
            for _, f in raw.xrange(store.keys.dlq("log")) if f[b"dlq_id"].decode() == dlq_id]


def _assert_untouched(layer: DurabilityLayer, raw: Any, store: durabilis.Store, dlq_id: str
                      ) -> None:
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.status is DlqStatus.PENDING
    assert record.requeued_at is None
    assert _log(raw, store, dlq_id) == [("parked", "")]


@pytest.mark.parametrize("setup", ["actions off", "hook says no", "hook says empty"])
def test_every_action_and_its_confirmation_is_refused_and_does_nothing_without_the_hooks_yes(
    store: durabilis.Store, raw: Any, layer: DurabilityLayer,
    consoles: Callable[..., TestClient], setup: str,
) -> None:
    (dlq_id,) = _park(layer, 1)
    asked: list[tuple[str, str]] = []

    def authorize(request: Any, action: str, target: Any) -> str | None:
        asked.append((action, str(target)))  # a bulk action's target: str() names its filter
        return "" if setup == "hook says empty" else None

    client = (consoles() if setup == "actions off"
              else consoles(actions=True, authorize=authorize))
    listing = client.get("/dlq").text + client.get(f"/dlq/{dlq_id}").text
    if setup == "actions off":
        assert "action-" not in listing  # no button shown either
        for nowhere in ("/dlq-bulk/purge?status=bogus", f"/dlq/{dlq_id}/frobnicate",
                        "/dlq-bulk/abandon"):
            assert client.get(nowhere).status_code == 403, nowhere  # not even a 400 / 404
    for route in _action_routes(dlq_id):
        path = route.split("?")[0]
        query = dict(p.split("=") for p in route.split("?")[1:])
        get = client.get(route)
        assert get.status_code == 403, route
        assert 'data-testid="error-page"' in get.text and "csrf_token" not in get.text
        post = client.post(path, data={"csrf_token": "0" * 64, **query})
        assert post.status_code == 403, route
    _assert_untouched(layer, raw, store, dlq_id)
    if setup != "actions off":
        assert ("requeue", dlq_id) in asked and ("purge", "filter:status=all") in asked


def test_a_post_without_the_right_csrf_token_is_refused_and_does_nothing(
    store: durabilis.Store, raw: Any, layer: DurabilityLayer,
    consoles: Callable[..., TestClient],
) -> None:
    (dlq_id,) = _park(layer, 1)
    client = consoles(actions=True, authorize=yes())
    other = consoles(actions=True, authorize=yes())  # another browser: its own cookie
    page = other.get(f"/dlq/{dlq_id}/requeue").text
    foreign = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert foreign is not None
    client.get(f"/dlq/{dlq_id}/abandon")  # this browser has a cookie of its own now
    for route in _action_routes(dlq_id):
        path = route.split("?")[0]
        query = dict(p.split("=") for p in route.split("?")[1:])
        for data in ({}, {"csrf_token": ""}, {"csrf_token": "deadbeef"},
                     {"csrf_token": "é" * 64}, {"csrf_token": foreign[1]}):
            response = client.post(path, data={**data, **query})
            assert response.status_code == 403, (route, data)
        # The right token, but as JSON (no form): refused too.
        assert client.post(path, json={"csrf_token": foreign[1]}).status_code == 403
    # Without any cookie, even a token that matched another cookie is refused.
    bare = consoles(actions=True, authorize=yes())
    assert bare.post(f"/dlq/{dlq_id}/requeue",
                     data={"csrf_token": foreign[1]}).status_code == 403
    _assert_untouched(layer, raw, store, dlq_id)


def _confirm_and_post(client: TestClient, route: str) -> str:
    page = client.get(route)
    assert page.status_code == 200, page.text[:1000]
    token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text)
    assert token is not None
    fields = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">',
                             page.text))
    action = re.search(r'data-testid="confirm-form" method="post" action="([^"]+)"', page.text)
    assert action is not None
    done = client.post(action[1], data=fields)
    assert done.status_code == 200, done.text[:1000]
    assert 'data-testid="action-result"' in done.text
    return done.text


def test_requeue_with_actions_on_marks_the_record_for_the_fleet_which_replays_it_once(
    store: durabilis.Store, raw: Any, layer: DurabilityLayer,
    consoles: Callable[..., TestClient],
) -> None:
    (dlq_id, other) = _park(layer, 2)
    client = consoles(actions=True, authorize=yes("alice@ops"))
    text = _confirm_and_post(client, f"/dlq/{dlq_id}/requeue")
    assert re.findall(r'data-testid="action-outcome">([^<]*)<', text) == ["requeued"]
    record = layer.dlq.get(dlq_id)
    assert record is not None and record.requeued_by == "alice@ops"
    assert _log(raw, store, dlq_id)[-1] == ("requeued", "alice@ops")
    history = client.get(f"/dlq/{dlq_id}").text
    assert re.findall(r'data-testid="history-by">([^<]*)<', history)[0] == "alice@ops"
    runs: list[Any] = []
    summary = layer.replay_requeued({"job": lambda ctx: runs.append(ctx.payload) or "ok"})
    assert summary.replayed == 1 and runs == [{"page": 0, "agent": "agent-1", "op": "job"}]
    assert layer.replay_requeued({"job": lambda ctx: runs.append(ctx.payload)}).replayed == 0
    assert len(runs) == 1
    assert layer.dlq.get(dlq_id).status is DlqStatus.REPLAYED  # type: ignore[union-attr]
    assert layer.dlq.get(other).requeued_at is None  # type: ignore[union-attr]
    # Again: already replayed, so final: nothing changes.
    again = _confirm_and_post(client, f"/dlq/{dlq_id}/requeue")
    assert re.findall(r'data-testid="action-outcome">([^<]*)<', again) == ["final"]


def test_abandon_and_purge_name_the_actor_in_the_log_stream(
    store: durabilis.Store, raw: Any, layer: DurabilityLayer,
    consoles: Callable[..., TestClient],
) -> None:
    (first, second) = _park(layer, 2)

    async def authorize(request: Any, action: str, target: str) -> str:  # an async hook
        return f"carol:{action}"

    client = consoles(actions=True, authorize=authorize)
    _confirm_and_post(client, f"/dlq/{first}/abandon")
    assert layer.dlq.get(first).abandoned_by == "carol:abandon"  # type: ignore[union-attr]
    assert _log(raw, store, first)[-1] == ("abandoned", "carol:abandon")
    _confirm_and_post(client, f"/dlq/{second}/purge")
    assert layer.dlq.get(second) is None
    assert _log(raw, store, second)[-1] == ("purged", "carol:purge")


def test_purge_with_a_filter_removes_only_the_records_it_selects(
    store: durabilis.Store, raw: Any, layer: DurabilityLayer,
    consoles: Callable[..., TestClient],
) -> None:
    mail = _park(layer, 3, op="mail", code="RATE_LIMITED")
    jobs = _park(layer, 2, op="job")
    client = consoles(actions=True, authorize=yes("dave"))
    confirm = client.get("/dlq-bulk/purge?status=pending&operation_type=mail").text
    assert re.search(r'data-testid="confirm-count">3<', confirm)
    text = _confirm_and_post(client, "/dlq-bulk/purge?status=pending&operation_type=mail")
    assert re.findall(r'data-testid="action-outcome">([^<]*)<', text) == ["purged"] * 3
    assert all(layer.dlq.get(i) is None for i in mail)
    assert all(_log(raw, store, i)[-1] == ("purged", "dave") for i in mail)
    assert [r.dlq_id for r in layer.dlq.list_pending()] == jobs
    requeued = _confirm_and_post(client, "/dlq-bulk/requeue?reason=NETWORK_TIMEOUT")
    assert re.findall(r'data-testid="action-outcome">([^<]*)<', requeued) == ["requeued"] * 2
    assert {r.dlq_id for r in layer.dlq.list_requeued()} == set(jobs)


def test_the_overview_history_is_shared_by_console_replicas_and_capped(
    store: durabilis.Store, raw: Any, layer: DurabilityLayer,
    consoles: Callable[..., TestClient],
) -> None:
    one = consoles(history_size=4, sample_interval_seconds=0.001)
    two = consoles(history_size=4, sample_interval_seconds=0.001)

    def samples(client: TestClient) -> int:
        html = client.get("/").text
        return int(re.search(r'data-testid="history-samples">(\d+)<', html)[1])  # type: ignore[index]

    assert samples(one) == 1
    layer.execute("a", "job", {"n": 1}, lambda ctx: "ok")
    layer.stats()  # (sends this process's batch of counts now)
    wait_until(lambda: samples(two) >= 2, what="a second sample, by the other replica")
    html = one.get("/").text
    assert re.search(r'data-testid="total-succeeded"><th>Succeeded</th><td>1<', html)
    started = html[html.index('data-testid="chart-started"'):]
    assert float(re.search(r"max (\d+\.\d+)", started)[1]) > 0  # type: ignore[index]
    for _ in range(6):
        samples(one)
        samples(two)
    key = store.keys.layer("console-history")
    assert raw.xlen(key) == 4  # capped, whoever sampled
    assert raw.pttl(key) > 0  # and it expires
    assert one.get("/").text.count("<polyline") == 6
    # A replica that samples rarely sees the others' samples all the same.
    rare = consoles(history_size=4, sample_interval_seconds=3600)
    assert samples(rare) == 4


def test_create_app_refuses_actions_without_a_hook_and_bad_arguments(
    store: durabilis.Store,
) -> None:
    with pytest.raises(durabilis.ConfigError):
        create_app(store, actions=True)
    with pytest.raises(durabilis.ConfigError):
        create_app(store, namespace=store.keys.namespace + "-other")
    with pytest.raises(durabilis.ConfigError):
        create_app(store, secret_key="short")
    with pytest.raises(durabilis.ConfigError):
        create_app(store, history_size=1)


@pytest.mark.standalone_only  # one uvicorn process over loopback: no topology in it
def test_the_durabilis_web_command_serves_the_console_read_only_by_default(
    redis_url: str, namespace: str, store: durabilis.Store, tmp_path: Path,
) -> None:
    DeadLetterQueue(store).enqueue("a", "job", {"x": 1}, 1, "NETWORK_TIMEOUT: down")
    refused = subprocess.run([CLI, "web", "--actions", "--url", redis_url], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2 and "--authorize" in refused.stderr
    port = free_port()
    proc = subprocess.Popen(
        [CLI, "web", "--url", redis_url, "--namespace", namespace, "--port", str(port),
         "--root-path", "/console"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        def page() -> httpx.Response | None:
            try:
                # (as a reverse proxy that strips /console forwards it)
                return httpx.get(f"http://127.0.0.1:{port}/dlq", timeout=2)
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()
                return None

        response = wait_until(page, timeout=30, what="durabilis web answering")
        assert response.status_code == 200
        assert 'data-testid="dlq-row"' in response.text
        assert 'href="/console/dlq/' in response.text
        assert "read-only" in response.text
        assert response.headers["content-security-policy"] == CSP
        assert httpx.get(f"http://127.0.0.1:{port}/dlq-bulk/purge?status=all",
                         timeout=5).status_code == 403
    finally:
        proc.terminate()
        proc.wait(30)


def _operator_rules(namespace: str, password: str) -> tuple[str, list[str]]:
    """The operator's ACL line of docs/production.md, for this namespace."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "production.md").read_text("utf-8")
    words = text.split("<!-- operator-acl -->", 1)[1].split("```", 2)[1].split()
    assert words[:2] == ["ACL", "SETUSER"]
    rules = [">" + password if r.startswith(">") else f"~{namespace}:*" if r.startswith("~")
             else r for r in words[3:]]
    return f"{words[2]}-{namespace}", rules


def test_every_page_and_action_works_under_the_operators_documented_acl(
    redis_url: str, raw: Any, namespace: str, store: durabilis.Store, layer: DurabilityLayer,
) -> None:
    ids = _hostile_namespace(store, raw)
    (parked,) = _park(layer, 1)
    user, rules = _operator_rules(namespace, "ops-pw-for-tests")
    nodes = ([raw.get_redis_connection(n) for n in raw.get_nodes()]
             if hasattr(raw, "get_nodes") else [raw])
    for node in nodes:
        node.execute_command("ACL", "SETUSER", user, *rules)
        node.execute_command("ACL", "LOG", "RESET")
    try:
        url = redis_url.replace("://", f"://{user}:ops-pw-for-tests@", 1)
        with durabilis.connect(url, namespace=namespace) as operator:
            app = create_app(operator, actions=True, authorize=yes("erin"),
                             sample_interval_seconds=0.001)
            try:
                client = TestClient(app)
                for path in [*_pages(ids), "/", f"/dlq/{parked}"]:
                    assert client.get(path).status_code == 200, path
                _confirm_and_post(client, f"/dlq/{parked}/requeue")
                _confirm_and_post(client, f"/dlq/{ids['big']}/abandon")
                _confirm_and_post(client, "/dlq-bulk/purge?status=abandoned")
            finally:
                app.state.console.close()
        assert layer.dlq.get(parked).requeued_by == "erin"  # type: ignore[union-attr]
        assert layer.dlq.get(ids["big"]) is None
        denied = [(e.get("reason"), e.get("object")) for node in nodes
                  for e in node.acl_log() if e.get("username") == user
                  and str(e.get("object")).split("|")[0] != "client"]
        assert denied == []  # no command or key refused: no right beyond the operator's
    finally:
        for node in nodes:
            node.execute_command("ACL", "DELUSER", user)


@pytest.mark.standalone_only  # INFO's command counter is per node: one node here
def test_a_list_page_costs_no_more_redis_commands_for_a_larger_backlog(
    store: durabilis.Store, raw: Any, consoles: Callable[..., TestClient],
) -> None:
    dlq = DeadLetterQueue(store)
    client = consoles()

    def cost(path: str) -> int:
        before = int(raw.info("stats")["total_commands_processed"])
        assert client.get(path).status_code == 200
        return int(raw.info("stats")["total_commands_processed"]) - before

    def fill(n: int) -> None:
        for i in range(n):
            dlq.enqueue(f"agent-{i % 7}", f"op-{i % 3}", {"i": i}, 1, "NETWORK_TIMEOUT: x")

    pages = ["/dlq?limit=50", "/dlq?status=all&limit=50", "/dlq?operation_type=op-1&limit=20",
             "/dlq?agent=nobody"]
    fill(1100)
    small = [cost(p) for p in pages]
    fill(1900)  # 3000 records: nearly 3 times as many, and no page costs more (give or
    # take the logarithm of an index's size: the oldest pending record's search)
    for page, before, after in zip(pages, small, [cost(p) for p in pages], strict=True):
        assert after <= before * 1.05 + 10, (page, before, after)


def test_a_record_parked_with_a_trace_context_shows_it(
    store: durabilis.Store, consoles: Callable[..., TestClient],
) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    dlq_id = DeadLetterQueue(store).enqueue("a", "job", {"x": 1}, 1, "NETWORK_TIMEOUT: x",
                                            metadata={"traceparent": parent})
    html = consoles().get(f"/dlq/{dlq_id}").text
    row = html.split('data-testid="field-trace"')[1].split("</tr>")[0]
    assert parent in row


# -- the review's findings (adv_web): bulk actions, bounded walks, history, breakers ------


def _hidden(html: str) -> dict[str, str]:
    return dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">', html))


def test_a_bulk_action_acts_only_on_the_records_its_confirmation_showed(
    store: durabilis.Store, raw: Any, layer: DurabilityLayer,
    consoles: Callable[..., TestClient],
) -> None:
    shown = _park(layer, 3, op="job")
    client = consoles(actions=True, authorize=yes("erin"))
    page = client.get("/dlq-bulk/purge?status=pending&operation_type=job").text
    assert re.search(r'data-testid="confirm-count">3<', page)
    assert all(f'data-dlq-id="{i}"' in page for i in shown)  # every id it will act on
    late = _park(layer, 4, op="job", agent="agent-late")  # parked after the confirmation
    layer.dlq.abandon(shown[0], by="ops")  # and one shown record changed meanwhile
    form = _hidden(page)
    # The frozen selection is signed: a form naming other ids is refused, nothing done.
    forged = {**form, "dlq_ids": " ".join(shown[1:] + late[:1])}
    assert client.post("/dlq-bulk/purge", data=forged).status_code == 403
    assert layer.dlq.get(late[0]) is not None
    done = client.post("/dlq-bulk/purge", data=form)
    assert done.status_code == 200
    outcomes = dict(re.findall(
        r'<code>([^<]*)</code></td><td data-testid="action-outcome">([^<]*)<', done.text))
    assert outcomes == {shown[0]: "other:abandoned", shown[1]: "purged", shown[2]: "purged"}
    assert re.search(r'data-testid="action-skipped">1<', done.text)
    assert all(layer.dlq.get(i) is not None for i in late)  # never shown: never touched
    assert all(_log(raw, store, i) == [("parked", "")] for i in late)
    # Requeue too: the records parked after its confirmation keep their place.
    page = client.get("/dlq-bulk/requeue?status=pending").text
    later = _park(layer, 2, op="job", agent="agent-later")
    text = client.post("/dlq-bulk/requeue", data=_hidden(page)).text
    assert re.findall(r'data-testid="action-outcome">([^<]*)<', text) == ["requeued"] * 4
    assert {r.dlq_id for r in layer.dlq.list_requeued()} == set(late)
    assert all(layer.dlq.get(i).requeued_at is None for i in later)  # type: ignore[union-attr]


def test_the_authorize_hook_gets_a_bulk_actions_filter_and_ids_and_head_is_405(
    store: durabilis.Store, layer: DurabilityLayer, consoles: Callable[..., TestClient],
) -> None:
    ids = _park(layer, 2, op="mail", agent="agent-m")
    asked: list[tuple[str, Any]] = []

    def authorize(request: Any, action: str, target: Any) -> str:
        asked.append((action, target))
        return "frank"

    client = consoles(actions=True, authorize=authorize)
    page = client.get("/dlq-bulk/purge?operation_type=mail&agent=agent-m").text
    target = asked[-1][1]
    assert isinstance(target, BulkTarget)
    assert (target.status, target.operation_type, target.agent, target.reason,
            target.older_than, target.dlq_ids) == ("pending", "mail", "agent-m", None, None,
                                                   tuple(ids))
    assert str(target) == "filter:status=pending, operation_type=mail, agent=agent-m"
    client.post("/dlq-bulk/purge", data=_hidden(page))
    assert asked[-1][0] == "purge" and asked[-1][1].dlq_ids == tuple(ids)
    asked.clear()
    for path in (f"/dlq/{ids[0]}/purge", "/dlq-bulk/purge", "/dlq-bulk/requeue"):
        head = client.request("HEAD", path)
        assert head.status_code == 405, path
        assert set(head.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}
    assert asked == []  # HEAD never reaches the hook


def test_a_list_page_bounds_the_index_entries_it_examines_expired_ones_included(
    store: durabilis.Store, consoles: Callable[..., TestClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(web_data, "SCAN_BOUND", 10)  # (1000 in production)
    dlq = DeadLetterQueue(store)
    dead = [dlq.enqueue("agent-a", "job", {"i": i}, 1, "NETWORK_TIMEOUT: x", ttl_seconds=0.2)
            for i in range(25)]
    wait_until(lambda: all(dlq.get(i) is None for i in dead), what="the records' expiry")
    live = dlq.enqueue("agent-a", "job", {"live": 1}, 1, "NETWORK_TIMEOUT: x")
    client = consoles()
    for query in ("", "status=all", "operation_type=job", "status=all&agent=agent-a"):
        first = client.get("/dlq?" + query).text
        assert 'data-testid="dlq-scan-note"' in first and "data-dlq-id" not in first, query
        shown, pages = _walk(client, query)
        assert shown == [live] and pages == 3, query  # 10 + 10 + 6 entries looked at
    # The listing API's bound: the DLQ's own page stops there too, and says where.
    page = dlq.scan(limit=5, max_examined=10)
    assert page.records == [] and page.examined == 10 and page.next_after is not None
    rest = dlq.scan(limit=5, after=page.next_after, max_examined=100)
    assert [r.dlq_id for r in rest.records] == [live] and rest.next_after is None
    assert [r.dlq_id for r in dlq.list_pending()] == [live]  # unbounded as before


def test_the_overview_history_shows_the_newest_samples_and_no_replica_trims_the_others(
    store: durabilis.Store, raw: Any, consoles: Callable[..., TestClient],
) -> None:
    key = store.keys.layer("console-history")
    big = consoles(history_size=50, sample_interval_seconds=0.001)
    for n in range(1, 9):
        wait_until(lambda n=n: (big.get("/"), raw.xlen(key))[1] >= n, what=f"sample {n}")
    newest = [int(f[b"t"]) for _, f in raw.xrevrange(key, "+", "-", count=3)][::-1]
    rare = consoles(history_size=3, sample_interval_seconds=3600)
    _, _, samples = rare.app.state.console.overview()  # type: ignore[attr-defined]
    assert [round(s.at.timestamp() * 1000) for s in samples] == newest  # the newest 3
    small = consoles(history_size=3, sample_interval_seconds=0.001)
    wait_until(lambda: (small.get("/"), raw.xlen(key))[1] >= 9, what="the small one's sample")
    assert raw.xlen(key) == 9  # the fleet's largest cap holds: nobody's history wiped


def test_a_record_page_shows_its_newest_log_entries_first_and_says_when_it_stopped(
    store: durabilis.Store, raw: Any, consoles: Callable[..., TestClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(web_data, "HISTORY_SCAN", 50)  # (5000 in production)
    dlq = DeadLetterQueue(store)
    dlq_id = dlq.enqueue("a", "job", {"x": 1}, 1, "NETWORK_TIMEOUT: x")
    for k in range(120):  # a busy DLQ: others' entries after this record's parking
        dlq.enqueue("b", "other", {"k": k}, 1, "NETWORK_TIMEOUT: y")
    client = consoles(actions=True, authorize=yes("gina"))
    _confirm_and_post(client, f"/dlq/{dlq_id}/requeue")
    html = client.get(f"/dlq/{dlq_id}").text
    changes = re.findall(r'data-testid="history-change">([^<]*)<', html)
    assert changes[0] == "requeued"  # newest first: the console's own audit entry
    assert re.findall(r'data-testid="history-by">([^<]*)<', html)[0] == "gina"
    assert 'data-testid="history-truncated"' in html  # the parking is past the bound
    monkeypatch.setattr(web_data, "HISTORY_SCAN", 5000)
    html = client.get(f"/dlq/{dlq_id}").text
    assert re.findall(r'data-testid="history-change">([^<]*)<', html) == ["requeued", "parked"]
    assert 'data-testid="history-truncated"' not in html


def test_the_breakers_pages_read_a_bounded_part_of_a_large_names_set_and_find_any_breaker(
    store: durabilis.Store, raw: Any, consoles: Callable[..., TestClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(web_data, "BREAKER_LIMIT", 20)  # (500 in production)
    names = [f"dep-{i:04d}" for i in range(600)]
    raw.sadd(store.keys.breaker_names(), *names)  # names other processes registered
    client = consoles()
    listing = client.get("/breakers").text
    rows = listing.count('data-testid="breaker-row"')
    assert 0 < rows <= 20
    assert 'data-testid="breakers-more"' in listing  # says the list stops there
    for name in ("dep-0000", "dep-0599"):  # any stored one has its page, first or last
        assert client.get(f"/breakers/{name}").status_code == 200, name
    assert client.get("/breakers/dep-9999").status_code == 404


def _outcomes(html: str) -> dict[str, str]:
    return dict(re.findall(
        r'<code>([^<]*)</code></td><td data-testid="action-outcome">([^<]*)<', html))


def test_an_old_confirmation_skips_a_record_parked_again_under_the_same_id_since(
    store: durabilis.Store, raw: Any, layer: DurabilityLayer,
    consoles: Callable[..., TestClient],
) -> None:
    # An id derives from the operation's key: purged then parked again, or parked
    # again into the listed record (a merge), it is the same id but not the
    # record the operator saw. The old confirmation skips it ("changed").
    (purged_again, merged, kept) = _park(layer, 3)
    client = consoles(actions=True, authorize=yes("alice"))
    bulk = {action: _hidden(client.get(f"/dlq-bulk/{action}?status=pending").text)
            for action in ("purge", "requeue")}
    single = {action: _hidden(client.get(f"/dlq/{merged}/{action}").text)
              for action in ("purge", "requeue", "abandon")}
    assert layer.dlq.purge([purged_again], by="bob") == {purged_again: "purged"}
    assert _park(layer, 2) == [purged_again, merged]  # the same operations fail again
    assert layer.dlq.get(merged).parkings == 2  # type: ignore[union-attr]
    for action in ("requeue", "purge"):
        done = client.post(f"/dlq/{merged}/{action}", data=single[action])
        assert done.status_code == 200, done.text[:1000]
        assert _outcomes(done.text) == {merged: "changed"}
    done = client.post(f"/dlq/{merged}/abandon", data=single["abandon"])
    assert done.status_code == 200, done.text[:1000]
    assert _outcomes(done.text) == {merged: "not abandoned"}
    assert layer.dlq.get(merged).status is DlqStatus.PENDING  # type: ignore[union-attr]
    done = client.post("/dlq-bulk/requeue", data=bulk["requeue"])
    assert _outcomes(done.text) == {purged_again: "changed", merged: "changed",
                                    kept: "requeued"}
    assert re.search(r'data-testid="action-skipped">2<', done.text)
    done = client.post("/dlq-bulk/purge", data=bulk["purge"])
    assert _outcomes(done.text) == {purged_again: "changed", merged: "changed",
                                    kept: "purged"}
    for dlq_id in (purged_again, merged):  # the newer parkings are all still there
        record = layer.dlq.get(dlq_id)
        assert record is not None and record.requeued_at is None
        assert _log(raw, store, dlq_id)[-1][0] in ("parked", "parked_again")


def test_a_confirmation_acts_once_and_is_refused_once_it_is_too_old(
    store: durabilis.Store, raw: Any, layer: DurabilityLayer,
    consoles: Callable[..., TestClient], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from durabilis.web import _app as web_app

    (one, two, three) = _park(layer, 3)
    client = consoles(actions=True, authorize=yes("alice"))
    bulk = _hidden(client.get("/dlq-bulk/requeue?status=pending").text)
    single = _hidden(client.get(f"/dlq/{one}/requeue").text)
    assert client.post(f"/dlq/{one}/requeue", data=single).status_code == 200
    assert client.post("/dlq-bulk/requeue", data=bulk).status_code == 200
    # The fleet's replay fails: the marks go. The same forms, posted again, are
    # refused (each confirmation acts once) and mark nothing.
    assert layer.replay_requeued({"job": lambda ctx: 1 / 0}).failed == 3
    assert layer.dlq.list_requeued() == []
    again = client.post(f"/dlq/{one}/requeue", data=single)
    assert again.status_code == 403 and "used" in again.text
    again = client.post("/dlq-bulk/requeue", data=bulk)
    assert again.status_code == 403 and "used" in again.text
    assert layer.dlq.list_requeued() == []
    # A confirmation older than its bound is refused, even unused.
    bulk = _hidden(client.get("/dlq-bulk/purge?status=pending").text)
    single = _hidden(client.get(f"/dlq/{two}/purge").text)
    now = web_app._now()
    monkeypatch.setattr(web_app, "_now", lambda: now + web_app.CONFIRM_MAX_AGE_SECONDS + 60)
    for path, form in ((f"/dlq/{two}/purge", single), ("/dlq-bulk/purge", bulk)):
        late = client.post(path, data=form)
        assert late.status_code == 403 and "too old" in late.text
    assert all(layer.dlq.get(i) is not None for i in (one, two, three))
    # A forged issue time or nonce breaks the signature.
    monkeypatch.setattr(web_app, "_now", lambda: now)
    for path, form in ((f"/dlq/{two}/purge", single), ("/dlq-bulk/purge", bulk)):
        for name in ("issued", "nonce"):
            forged = {**form, name: form[name] + "1"}
            assert client.post(path, data=forged).status_code == 403
    assert all(layer.dlq.get(i) is not None for i in (one, two, three))


def test_a_confirmation_signed_for_one_filter_is_refused_for_another_that_reads_alike(
    store: durabilis.Store, layer: DurabilityLayer, consoles: Callable[..., TestClient],
) -> None:
    (dlq_id,) = _park(layer, 1)
    client = consoles(actions=True, authorize=yes("alice"))
    confirm = client.get("/dlq-bulk/purge",
                         params={"reason": "NETWORK_TIMEOUT, agent=agent-1"}).text
    form = _hidden(confirm)
    assert form["dlq_ids"] == ""  # the reason matches nothing
    forged = {**form, "reason": "NETWORK_TIMEOUT", "agent": "agent-1"}
    assert client.post("/dlq-bulk/purge", data=forged).status_code == 403
    assert layer.dlq.get(dlq_id) is not None


@pytest.mark.standalone_only  # (validation before any I/O: no topology involved)
def test_an_id_ending_in_a_newline_is_refused_everywhere(
    store: durabilis.Store, layer: DurabilityLayer, consoles: Callable[..., TestClient],
) -> None:
    with pytest.raises(durabilis.errors.DurabilisError):
        layer.dlq.enqueue("agent", "job", {"p": 1}, 1, "X: y", dlq_id="abc\n")
    assert layer.dlq.get("abc\n") is None
    assert layer.dlq.purge(["abc\n"]) == {"abc\n": "not_found"}
    client = consoles()
    assert client.get("/dlq", params={"after": "1-1\n"}).status_code == 400


def test_the_checkpoint_page_reads_and_shows_a_bounded_number_of_a_tasks_checkpoints(
    store: durabilis.Store, consoles: Callable[..., TestClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(web_data, "CHECKPOINT_LIMIT", 3, raising=False)
    manager = CheckpointManager(store)
    for i in range(200):  # a hash past the small-hash encoding: HSCAN pages it
        manager.save("big-task", f"agent-{i:03}", "p1", {"i": i})
    manager.save("small-task", "a1", "p1", {"x": 1})
    client = consoles()
    page = client.get("/checkpoints/big-task").text
    assert len(re.findall(r'data-testid="checkpoint-row"', page)) == 3
    assert 'data-testid="checkpoints-more"' in page
    assert len(re.findall(r'<h3>Agent ', page)) == 3
    small = client.get("/checkpoints/small-task").text
    assert len(re.findall(r'data-testid="checkpoint-row"', small)) == 1
    assert 'data-testid="checkpoints-more"' not in small
    one = client.get("/checkpoints/big-task", params={"agent": "agent-007"}).text
    assert len(re.findall(r'data-testid="checkpoint-row"', one)) == 1
    assert 'data-testid="checkpoints-more"' not in one
    # The library's own callers still get every checkpoint.
    assert len(manager.list_current("big-task")) == 200
