"""The web console's pages in a real Chromium, over a namespace a fixture filled
through the library's API (tests/browser/_support.py: parked operations, hostile
fields, a tripped breaker, checkpoints with a fork, an operation in flight and an
orphan, a published fleet config), served read-only by ``durabilis web`` as a
subprocess.

Every test also checks, at its end, that no injected script ran (no dialog, no
``window.__xss``) and that the page holds no ``<script>`` at all (the ``page``
fixture).
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.browser._support import (
    BIG,
    BULK_RECORDS,
    CONTROL,
    HOSTILE_AGENT,
    HOSTILE_TYPE,
    IMG_TAG,
    SCRIPT_TAG,
    Filled,
    Page,
    by_id,
    console,
    texts,
)

# Standalone only: the console reads Redis state through the library's public
# API, whose behaviour on Cluster and Sentinel the integration suites cover; the
# pages cannot differ with the topology. Serial: each module runs a console, a
# Chromium and worker processes.
pytestmark = [pytest.mark.standalone_only, pytest.mark.serial, pytest.mark.timeout(60)]

PENDING = 4 + BULK_RECORDS  # hostile, evil agent, evil type, requeue target + send_email


def dlq_ids(page: Any) -> list[str]:
    return [r.get_attribute("data-dlq-id") for r in by_id(page, "dlq-row").all()]


def test_every_page_is_reachable_from_the_nav_and_says_namespace_and_mode(
    page: Page, read_only: str, filled: Filled
) -> None:
    p = page.page
    p.goto(read_only + "/")
    seen = []
    for link in ("nav-overview", "nav-dlq", "nav-breakers", "nav-checkpoints",
                 "nav-inflight", "nav-config"):
        by_id(p, link).click()
        p.wait_for_load_state()
        assert p.url.startswith(read_only)
        seen.append(by_id(p, "page-title").inner_text())
        assert by_id(p, "namespace").inner_text().strip() == filled.namespace
        assert by_id(p, "mode").inner_text().strip() == "read-only"
        page.check_nothing_ran()
    assert len(set(seen)) == 6, seen  # six different pages


def test_overview_shows_the_totals_and_a_chart_for_each_counter(
    page: Page, read_only: str, filled: Filled
) -> None:
    p = page.page
    p.goto(read_only + "/")
    totals = by_id(p, "overview-totals")

    def total(name: str) -> int:
        text = by_id(totals, name).inner_text()
        return int(re.findall(r"\d[\d,]*", text)[-1].replace(",", ""))

    assert total("total-dlq-backlog") == PENDING
    assert total("total-in-flight") == 1  # the live worker's (the orphan's lease ended)
    assert total("total-parked") >= 5  # five operations the layer parked
    assert total("total-retries") >= 5
    for chart in ("chart-started", "chart-succeeded", "chart-retried", "chart-parked",
                  "chart-in-flight", "chart-dlq-backlog"):
        figure = by_id(p, chart)
        assert figure.evaluate("e => e.tagName") == "FIGURE"
        assert figure.locator("svg").count() == 1
    # a load takes a sample (at most one per sample interval, fleet-wide)
    samples = by_id(p, "history-samples").inner_text()
    assert int(re.findall(r"\d+", samples)[0]) >= 1, samples


def test_dlq_list_pages_through_every_pending_record_once_oldest_first(
    page: Page, read_only: str, filled: Filled
) -> None:
    p = page.page
    p.goto(read_only + "/dlq")
    assert str(PENDING) in by_id(p, "dlq-summary").inner_text()
    first = dlq_ids(p)
    assert len(first) == 50  # the default page size
    assert set(texts(p, "dlq-status")) == {"pending"}
    shown = list(first)
    for _ in range(5):
        nxt = by_id(p, "dlq-next")
        if nxt.count() == 0:
            break
        nxt.click()
        p.wait_for_load_state()
        shown += dlq_ids(p)
    expected = {filled.hostile_id, filled.evil_agent_id, filled.evil_type_id, filled.requeue_id,
                *filled.bulk_ids}
    assert len(shown) == len(set(shown)) == PENDING
    assert set(shown) == expected
    bulk_order = [i for i in shown if i in set(filled.bulk_ids)]
    assert bulk_order == filled.bulk_ids  # oldest first


def test_dlq_filters_select_by_status_type_reason_agent_and_age(
    page: Page, read_only: str, filled: Filled
) -> None:
    p = page.page
    p.goto(read_only + "/dlq")

    def search(status: str = "all", op: str = "", reason: str = "", agent: str = "",
               older: str = "") -> set[str]:
        form = by_id(p, "dlq-filters")
        by_id(form, "filter-status").select_option(status)
        by_id(form, "filter-operation-type").fill(op)
        by_id(form, "filter-reason").fill(reason)
        by_id(form, "filter-agent").fill(agent)
        by_id(form, "filter-older-than").fill(older)
        by_id(form, "filter-submit").click()
        p.wait_for_load_state()
        return set(dlq_ids(p))

    jobs = {filled.hostile_id, filled.evil_agent_id, filled.requeue_id}
    assert search("pending", op="job") == jobs
    assert search("all", op="job") == jobs | {filled.abandoned_id, filled.replayed_id}
    assert search("abandoned") == {filled.abandoned_id}
    assert search("replayed") == {filled.replayed_id}
    assert search("pending", op="job", agent="agent-2") == {filled.requeue_id}
    assert search("pending", op="job", agent=HOSTILE_AGENT) == {filled.evil_agent_id}
    assert search("pending", op=HOSTILE_TYPE) == {filled.evil_type_id}
    assert search("pending", reason="UNKNOWN_TYPE") == {filled.evil_type_id}
    assert search("all", reason="NETWORK_TIMEOUT") == jobs | {filled.abandoned_id,
                                                               filled.replayed_id}
    assert len(search("pending", reason="SERVICE_UNAVAILABLE", older="")) == 50  # a page
    assert search("all", older="7d") == set()
    assert by_id(p, "dlq-empty").count() == 1
    # the filter is in the URL: a page of results can be bookmarked and shared
    assert "older_than=7d" in p.url


def test_hostile_fields_are_shown_as_text_and_nothing_they_hold_runs(
    page: Page, read_only: str, filled: Filled
) -> None:
    p = page.page
    query = urlencode({"status": "pending", "operation_type": "job", "agent": HOSTILE_AGENT})
    p.goto(read_only + "/dlq?" + query)
    row = by_id(p, "dlq-row")
    assert row.count() == 1
    assert by_id(row, "dlq-agent").inner_text().strip() == HOSTILE_AGENT  # text, not a <b>
    assert row.locator("b").count() == 0

    query = urlencode({"status": "pending", "operation_type": HOSTILE_TYPE})
    p.goto(read_only + "/dlq?" + query)
    row = by_id(p, "dlq-row")
    assert row.count() == 1
    assert by_id(row, "dlq-operation-type").inner_text().strip() == HOSTILE_TYPE
    assert p.locator("svg").count() == 0

    p.goto(read_only + f"/dlq/{filled.hostile_id}")
    assert p.locator("img").count() == 0
    error = by_id(p, "field-last_error").inner_text()
    assert SCRIPT_TAG in error and IMG_TAG in error
    operation = by_id(p, "record-operation").inner_text()  # the payload as JSON
    for shown in (SCRIPT_TAG, json.dumps(IMG_TAG)[1:-1], BIG[:200], "10KB-end", "bell", " end"):
        assert shown in operation, shown
    # the control characters are shown as escapes, never sent raw
    assert not any(c in p.content() for c in CONTROL if not c.isprintable())
    assert "bell\\x07" in error
    # a 10 KB field wraps or scrolls inside its box: the page keeps its width
    assert p.evaluate("document.documentElement.scrollWidth") <= p.viewport_size["width"]


def test_every_page_forbids_scripts_by_its_content_security_policy(
    page: Page, read_only: str, filled: Filled
) -> None:
    p = page.page
    for path in ("/", "/dlq", f"/dlq/{filled.hostile_id}", "/breakers", "/breakers/mail",
                 "/checkpoints", "/checkpoints/task-1", "/inflight", "/config"):
        reply = p.goto(read_only + path)
        assert reply is not None and reply.status == 200, path
        csp = reply.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src" not in csp, (path, csp)


def test_a_record_shows_its_fields_and_its_history(
    page: Page, read_only: str, filled: Filled
) -> None:
    p = page.page
    p.goto(read_only + "/dlq")
    p.locator(f'[data-dlq-id="{filled.requeue_id}"]').get_by_test_id("dlq-link").click()
    p.wait_for_load_state()
    assert filled.requeue_id in p.url
    assert by_id(p, "field-status").inner_text().split()[-1] == "pending"
    assert "agent-2" in by_id(p, "field-agent_id").inner_text()
    assert '"page": 7' in by_id(p, "record-operation").inner_text()  # (--show-errors)
    assert by_id(p, "history-row").count() >= 1
    assert by_id(p, "action-requeue").count() == 0  # read-only: no action offered

    p.goto(read_only + f"/dlq/{filled.abandoned_id}")
    assert by_id(p, "field-status").inner_text().split()[-1] == "abandoned"
    changes = " ".join(texts(p, "history-change"))
    assert "abandon" in changes


def test_an_unknown_record_is_a_404_page(page: Page, read_only: str) -> None:
    p = page.page
    reply = p.goto(read_only + "/dlq/0123456789abcdef0123456789abcdef")
    assert reply is not None and reply.status == 404
    assert by_id(p, "error-page").count() == 1
    assert by_id(p, "error-message").inner_text().strip()


def test_breakers_show_state_window_probes_and_a_timeline_of_transitions(
    page: Page, read_only: str, filled: Filled
) -> None:
    p = page.page
    p.goto(read_only + "/breakers")
    mail = p.locator('[data-breaker="mail"]')
    svc = p.locator('[data-breaker="svc"]')
    assert "open" in by_id(mail, "breaker-state").inner_text().lower()
    assert "half" not in by_id(mail, "breaker-state").inner_text().lower()
    assert "closed" in by_id(svc, "breaker-state").inner_text().lower()
    # the fleet's config (--config): 4 failures in a window of 10, 1 probe permit
    assert re.search(r"\b4\b\D+\b10\b", by_id(mail, "breaker-window").inner_text())
    assert re.search(r"\b0\b\D+\b1\b", by_id(mail, "breaker-probes").inner_text())

    by_id(mail, "breaker-link").click()
    p.wait_for_load_state()
    assert by_id(p, "breaker-detail").count() == 1
    assert by_id(p, "breaker-timeline").locator("svg").count() == 1
    rows = texts(p, "transition-row")
    assert len(rows) == 3, rows
    norm = [re.sub(r"[^a-z]", "", r.lower()) for r in rows]  # "... closed open ..."
    assert "closedopen" in norm[0], rows  # oldest first
    assert "openhalfopen" in norm[1], rows
    assert "halfopenopen" in norm[2], rows
    reply = p.goto(read_only + "/breakers/no-such-breaker")
    assert reply is not None and reply.status == 404


def test_checkpoints_of_a_task_and_the_lineage_of_a_fork(
    page: Page, read_only: str, filled: Filled
) -> None:
    p = page.page
    p.goto(read_only + "/checkpoints")
    form = by_id(p, "checkpoint-lookup")
    by_id(form, "lookup-task-id").fill("task-1")
    by_id(form, "lookup-submit").click()
    p.wait_for_load_state()
    ids = {r.get_attribute("data-checkpoint-id") for r in by_id(p, "checkpoint-row").all()}
    assert ids == set(filled.checkpoint_ids.values())
    assert SCRIPT_TAG in " ".join(texts(p, "checkpoint-state"))  # as text

    p.goto(read_only + "/checkpoints")
    by_id(p, "lookup-task-id").fill("task-1-retry")
    by_id(p, "lookup-submit").click()
    p.wait_for_load_state()
    ids = {r.get_attribute("data-checkpoint-id") for r in by_id(p, "checkpoint-row").all()}
    assert ids == {filled.fork_id}
    lineage = " ".join(texts(p, "lineage-row"))
    assert filled.fork_id in lineage and filled.checkpoint_ids["publish"] in lineage
    assert lineage.index(filled.fork_id) < lineage.index(filled.checkpoint_ids["publish"])

    p.goto(read_only + "/checkpoints/no-such-task")
    assert by_id(p, "checkpoints-empty").count() == 1


def test_inflight_shows_the_live_claim_and_the_orphan_awaiting_recovery(
    page: Page, read_only: str, filled: Filled
) -> None:
    p = page.page
    p.goto(read_only + "/inflight")
    live = texts(p, "inflight-row")
    orphans = texts(p, "orphan-row")
    assert len(live) == 1 and "agent-hold" in live[0], live
    assert len(orphans) == 1 and "agent-dies" in orphans[0], orphans
    counts = by_id(p, "inflight-counts").inner_text()
    assert re.match(r"1 in flight, 1 with their lease ended", counts), counts


def test_config_shows_the_fleet_config_in_force_and_its_version(
    page: Page, read_only: str, filled: Filled
) -> None:
    p = page.page
    p.goto(read_only + "/config")
    assert str(filled.config_version) in by_id(p, "config-version").inner_text()
    assert by_id(p, "config-updated").inner_text().strip()
    retry = texts(p, "config-retry-row")
    breakers = texts(p, "config-breaker-row")
    assert len(retry) == 1 and "job" in retry[0], retry
    assert len(breakers) == 1 and "svc" in breakers[0], breakers
    assert by_id(p, "config-local").inner_text().strip()


def test_without_the_opt_in_error_texts_and_payloads_are_redacted(
    page: Page, redis_url: str, filled: Filled
) -> None:
    with console(redis_url, filled.namespace) as base:
        p = page.page
        p.goto(base + f"/dlq/{filled.hostile_id}")
        assert "hidden" in by_id(p, "record-operation").inner_text()
        error = by_id(p, "field-last_error").inner_text()
        assert "NETWORK_TIMEOUT" in error  # the code stays, the text is redacted
        assert "window.__xss" not in error and "upstream said" not in error
        assert "window.__xss" not in p.content()
