"""The web console's actions in a real Chromium: a record requeued through the UI
(its confirmation page, then the button) is replayed exactly once by a worker
process running the layer's ``replay_requeued`` loop; with actions off, or the
authorization hook saying no, or without the CSRF token, every action (requeue,
abandon, purge one, requeue or purge by filter) answers 403 and Redis is left as it was.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import durabilis
from durabilis.dlq import DeadLetterQueue, DlqStatus
from durabilis.testing import isolated_namespace
from tests.browser._support import (
    Filled,
    Page,
    by_id,
    console,
    effects_key,
    fill,
    finish,
    idle_key,
    replay_worker,
)
from tests.browser.hooks import ACTOR

# Standalone only: requeue and replay_requeued are covered on Cluster and Sentinel
# by the integration suites (test_cli_fleet...); what these tests add is the
# console's gate and forms, which do not depend on the topology. Serial: a
# console, a Chromium and worker processes each.
pytestmark = [pytest.mark.standalone_only, pytest.mark.serial, pytest.mark.timeout(60)]

ALLOW = ("--actions", "--authorize", "tests.browser.hooks:allow")
DENY = ("--actions", "--authorize", "tests.browser.hooks:deny")



def snapshot(raw: Any, namespace: str) -> dict[bytes, bytes]:
    """Every key of the namespace with its serialized value (``DUMP``)."""
    return {key: raw.dump(key) for key in raw.scan_iter(match=f"{namespace}:*", count=1000)}


def status_of(redis_url: str, namespace: str, dlq_id: str) -> DlqStatus | None:
    with durabilis.connect(redis_url, namespace=namespace) as store:
        record = DeadLetterQueue(store).get(dlq_id)
    return None if record is None else record.status


@pytest.fixture(scope="module")
def untouched(redis_url: str) -> Filled:
    """A filled namespace the refusal tests share (nothing may change it)."""
    return fill(redis_url, isolated_namespace("console"))


def action_paths(filled: Filled) -> list[str]:
    one = filled.requeue_id
    return [f"/dlq/{one}/requeue", f"/dlq/{one}/abandon", f"/dlq/{one}/purge",
            "/dlq-bulk/requeue?status=all", "/dlq-bulk/purge?status=all"]


def assert_every_action_refused(
    page: Page, base: str, filled: Filled, raw: Any, *, offered: bool
) -> None:
    """Every action route answers 403 (its confirmation page and its POST) and
    Redis is left as it was; the links are offered only when actions are on
    (the hook judges each request, not the page)."""
    p = page.page
    before = snapshot(raw, filled.namespace)
    for path in action_paths(filled):
        reply = p.goto(base + path)
        assert reply is not None and reply.status == 403, (path, reply and reply.status)
        assert by_id(p, "error-page").count() == 1
        assert by_id(p, "confirm-form").count() == 0
        posted = p.request.post(base + path, form={"csrf_token": "forged", "status": "all"},
                                max_redirects=0)
        assert posted.status == 403, (path, posted.status)
    assert snapshot(raw, filled.namespace) == before  # nothing changed in Redis
    p.goto(base + f"/dlq/{filled.requeue_id}")
    for action in ("action-requeue", "action-abandon", "action-purge-one"):
        assert by_id(p, action).count() == offered
    p.goto(base + "/dlq")
    for action in ("action-requeue-many", "action-purge"):
        assert by_id(p, action).count() == offered


def test_a_read_only_console_refuses_every_action_and_changes_nothing(
    page: Page, redis_url: str, raw: Any, untouched: Filled
) -> None:
    with console(redis_url, untouched.namespace) as base:
        page.page.goto(base + "/")
        assert by_id(page.page, "mode").inner_text().strip() == "read-only"
        assert_every_action_refused(page, base, untouched, raw, offered=False)


def test_actions_the_hook_says_no_to_are_refused_and_change_nothing(
    page: Page, redis_url: str, raw: Any, untouched: Filled
) -> None:
    with console(redis_url, untouched.namespace, *DENY) as base:
        assert_every_action_refused(page, base, untouched, raw, offered=True)


def test_an_action_posted_without_its_csrf_token_is_refused(
    page: Page, redis_url: str, raw: Any, untouched: Filled
) -> None:
    p = page.page
    with console(redis_url, untouched.namespace, *ALLOW) as base:
        for path in action_paths(untouched):
            p.goto(base + path)  # the confirmation page sets the CSRF cookie
            assert by_id(p, "confirm-form").count() == 1
            before = snapshot(raw, untouched.namespace)
            for form in ({"status": "all"}, {"csrf_token": "forged", "status": "all"}):
                posted = p.request.post(base + path, form=form, max_redirects=0)
                assert posted.status == 403, (path, form, posted.status)
            assert snapshot(raw, untouched.namespace) == before
    assert status_of(redis_url, untouched.namespace, untouched.requeue_id) is DlqStatus.PENDING


@pytest.fixture
def acting(redis_url: str) -> Iterator[Filled]:
    yield fill(redis_url, isolated_namespace("console"))


def test_a_record_requeued_in_the_ui_is_replayed_once_by_a_worker_process(
    page: Page, redis_url: str, raw: Any, acting: Filled
) -> None:
    p = page.page
    ns, target = acting.namespace, acting.requeue_id
    with replay_worker(redis_url, ns) as worker, console(redis_url, ns, *ALLOW) as base:
        p.goto(base + f"/dlq/{target}")
        assert by_id(p, "mode").inner_text().strip() == "actions enabled"
        by_id(p, "action-requeue").click()
        p.wait_for_load_state()
        assert target in by_id(p, "confirm-summary").inner_text()
        assert status_of(redis_url, ns, target) is DlqStatus.PENDING  # asked, not done
        by_id(p, "confirm-button").click()
        p.wait_for_load_state()
        assert "requeued" in by_id(p, "action-outcome").inner_text()

        deadline = time.monotonic() + 20
        while status_of(redis_url, ns, target) is not DlqStatus.REPLAYED:
            assert time.monotonic() < deadline, "the worker never replayed the record"
            time.sleep(0.05)

        # Requeued again through the UI: refused, the record is final.
        p.goto(base + f"/dlq/{target}/requeue")
        by_id(p, "confirm-button").click()
        p.wait_for_load_state()
        assert by_id(p, "action-outcome").inner_text().strip() == "final"
        # The worker's passes go on: let it make a few more, none may run it again.
        seen = int(raw.get(idle_key(ns)) or 0)
        deadline = time.monotonic() + 20
        while int(raw.get(idle_key(ns)) or 0) < seen + 5:
            assert time.monotonic() < deadline, "the worker stopped making passes"
            time.sleep(0.05)
        replayed = finish(worker)

        p.goto(base + f"/dlq/{target}")
        assert by_id(p, "field-status").inner_text().split()[-1] == "replayed"
        history = [(c.strip(), b.strip()) for c, b in zip(
            by_id(p, "history-change").all_inner_texts(),
            by_id(p, "history-by").all_inner_texts(), strict=True)]
        assert any("requeue" in c and ACTOR in b for c, b in history), history

    effects = {k.decode(): int(v) for k, v in raw.hgetall(effects_key(ns)).items()}
    assert effects == {"7": 1}  # exactly once, and nothing else was replayed
    lines = replayed.splitlines()
    assert lines[:-1] == [f"replayed {target}"], replayed  # one replay, of that record
    assert int(lines[-1].removeprefix("idle passes ")) >= 5, replayed  # and it kept looking


def test_abandon_and_purge_by_filter_in_the_ui_change_only_what_was_confirmed(
    page: Page, redis_url: str, acting: Filled
) -> None:
    p = page.page
    ns = acting.namespace
    with console(redis_url, ns, *ALLOW) as base:
        p.goto(base + f"/dlq/{acting.hostile_id}")
        by_id(p, "action-abandon").click()
        p.wait_for_load_state()
        by_id(p, "confirm-button").click()
        p.wait_for_load_state()
        assert by_id(p, "action-outcome").inner_text().strip() == "abandoned"
        assert status_of(redis_url, ns, acting.hostile_id) is DlqStatus.ABANDONED

        # Purge agent-1's pending send_email records: the list's filter, then its button.
        p.goto(base + "/dlq?status=pending&operation_type=send_email&agent=agent-1")
        selected = {r.get_attribute("data-dlq-id") for r in by_id(p, "dlq-row").all()}
        assert selected == set(acting.bulk_ids[::3])  # agent-1: every third one
        by_id(p, "action-purge").click()
        p.wait_for_load_state()
        assert by_id(p, "confirm-count").inner_text().strip() == str(len(selected))
        by_id(p, "confirm-button").click()
        p.wait_for_load_state()
        assert [t.strip() for t in by_id(p, "action-outcome").all_inner_texts()] == \
            ["purged"] * len(selected)

    kept = set(acting.bulk_ids) - selected
    assert all(status_of(redis_url, ns, i) is None for i in selected)
    assert all(status_of(redis_url, ns, i) is DlqStatus.PENDING for i in kept)
    assert status_of(redis_url, ns, acting.requeue_id) is DlqStatus.PENDING
