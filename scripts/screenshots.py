#!/usr/bin/env python3
"""Screenshots of the web console's pages, for docs/console/ (README, docs/console.md).

Starts a throw-away redis-server, fills a namespace as the browser tests do
(tests/browser/_support.py: parked operations, hostile fields, a tripped breaker,
checkpoints with a fork, an operation in flight and an orphan, a published fleet
config), serves it with ``durabilis web --actions`` (hook: tests.browser.hooks:allow)
and saves one PNG per page at a fixed 1280x860 viewport (the record's page whole,
after a requeue through the UI), with Debian's chromium through Playwright::

    .venv/bin/python scripts/screenshots.py [--out docs/console]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import structlog  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

import durabilis  # noqa: E402
from durabilis import OperationError, RetryExhausted  # noqa: E402
from durabilis.layer import DurabilityLayer, OperationContext  # noqa: E402
from durabilis.testing import start_redis_server  # noqa: E402
from tests.browser._support import (  # noqa: E402
    CHROMIUM_HINT,
    console,
    console_config,
    fill,
    find_chromium,
    in_flight_and_orphan,
)

VIEWPORT = {"width": 1280, "height": 860}
OVERVIEW_SAMPLES = 7  # overview loads, a sample interval apart: the charts fill
SAMPLE_SECONDS = 5.2  # create_app's sample_interval_seconds (5) and a margin


def traffic(url: str, namespace: str, step: int) -> None:
    """Some operations between two samples (successes, retries, a parking), so
    the overview's charts have a shape; breaker ``mail`` closes, then trips again."""
    store = durabilis.connect(url, namespace=namespace)
    layer = DurabilityLayer(store, console_config(), replica_id="traffic")
    flaky = {"left": step % 3}

    def send(ctx: OperationContext) -> str:
        if flaky["left"]:
            flaky["left"] -= 1
            raise OperationError("NETWORK_TIMEOUT", "upstream timed out")
        return "sent"

    try:
        mail = layer.breakers
        if step == 1:  # a probe succeeds: mail closes for a while (the timeline shows it)
            mail.after_call("mail", True, mail.before_call("mail"))
        if step == 4:  # and trips again
            for _ in range(4):
                mail.after_call("mail", False, mail.before_call("mail"))
        for n in range(5 + 3 * step):
            with contextlib.suppress(RetryExhausted):
                layer.execute(f"agent-{n % 3 + 1}", "job", {"page": 1000 + 100 * step + n}, send)
    finally:
        layer.close()
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "console")
    args = parser.parse_args()
    chromium = find_chromium()
    if chromium is None:
        print(CHROMIUM_HINT, file=sys.stderr)
        return 1
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="durabilis-shots-") as tmp:
        server = start_redis_server(tmp)
        try:
            filled = fill(server.url, "shop")
            with in_flight_and_orphan(server.url, filled.namespace), \
                    console(server.url, filled.namespace, "--actions", "--authorize",
                            "tests.browser.hooks:allow") as base, sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport=VIEWPORT)
                page.set_default_timeout(15_000)
                for i in range(OVERVIEW_SAMPLES - 1):
                    page.goto(base + "/")
                    traffic(server.url, filled.namespace, i)
                    time.sleep(SAMPLE_SECONDS)

                def shot(name: str, path: str | None = None, *, full_page: bool = False) -> None:
                    if path is not None:
                        page.goto(base + path)
                    target = args.out / f"{name}.png"
                    page.screenshot(path=str(target), full_page=full_page)
                    print(f"{target.relative_to(ROOT)}  ({page.url.removeprefix(base)})")

                shot("overview", "/")
                shot("dlq-list", "/dlq?status=all")
                # A requeue through the UI: its confirmation, then the record's
                # history shows it with the actor the hook named.
                shot("requeue-confirm", f"/dlq/{filled.requeue_id}/requeue")
                page.get_by_test_id("confirm-button").click()
                page.wait_for_load_state()
                shot("record", f"/dlq/{filled.requeue_id}", full_page=True)
                shot("breakers", "/breakers")
                shot("breaker-timeline", "/breakers/mail")
                shot("checkpoints", "/checkpoints/task-1-retry")
                shot("inflight", "/inflight")
                shot("config", "/config")
                browser.close()
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
