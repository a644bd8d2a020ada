"""Fixtures of the web console's browser tests: a real Chromium (Debian's
``chromium``, driven by Playwright: no browser download), a namespace filled
through the library's API, ``durabilis web`` as a subprocess.

A missing chromium fails loudly with the install hint: it is never a skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from durabilis.testing import isolated_namespace
from tests.browser._support import (
    CHROMIUM_HINT,
    Filled,
    Page,
    console,
    fill,
    find_chromium,
    in_flight_and_orphan,
)

VIEWPORT = {"width": 1280, "height": 860}
WAIT_MS = 10_000  # every Playwright wait and action: bounded


@pytest.fixture(scope="session")
def chromium_path() -> str:
    found = find_chromium()
    if found is None:
        pytest.fail(CHROMIUM_HINT, pytrace=False)
    return found


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Any]:
    # Module scope, not session: Playwright's sync API keeps an event loop running
    # in this thread while it is open, and every later test of this xdist worker
    # calling asyncio.run() would fail ("cannot be called from a running event
    # loop"). Closed at the end of each browser module, the thread is clean again.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # --no-sandbox: chromium refuses to start as root (CI containers) without it
        launched = pw.chromium.launch(executable_path=chromium_path, args=["--no-sandbox"],
                                      timeout=30_000)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Page]:
    # bypass_csp: the console's Content-Security-Policy forbids every script, which
    # would hide an escaping bug from the ``window.__xss`` check; the tests look at
    # what escaping alone does (test_console_pages checks the header separately).
    context = browser.new_context(viewport=VIEWPORT, bypass_csp=True)
    context.set_default_timeout(WAIT_MS)
    context.set_default_navigation_timeout(WAIT_MS)
    try:
        checked = Page(context.new_page())
        yield checked
        checked.check_nothing_ran()
    finally:
        context.close()


@pytest.fixture(scope="module")
def filled(redis_url: str) -> Iterator[Filled]:
    """A fresh namespace filled through the library's API, with one operation in
    flight and one orphan while the module's tests run."""
    made = fill(redis_url, isolated_namespace("console"))
    with in_flight_and_orphan(redis_url, made.namespace):
        yield made


@pytest.fixture(scope="module")
def read_only(redis_url: str, filled: Filled) -> Iterator[str]:
    """The console over ``filled``, read-only (the default), payloads shown: its URL."""
    with console(redis_url, filled.namespace, "--show-errors") as base:
        yield base
