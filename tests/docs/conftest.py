"""The docs' test harness: every code block of README.md and docs/*.md runs.

Sybil (``sybil.parsers.markdown``, with the parsers and evaluators below) reads
each document; ``test_docs.py`` makes it one pytest item (``pytest`` with no
argument, or ``pytest tests/docs``), on the standalone pass only. One item per
document, not per block: its blocks share one namespace and run in order, as a
reader would run them, whatever worker pytest-xdist gives the item.

- ``python`` blocks run in-process; a block may use top-level ``await`` (as in
  ``python -m asyncio``): it then runs in a fresh event loop;
- ``toml`` blocks must pass ``durabilis config check`` (the console script);
- a ``text`` / ``console`` / ``sh`` / unlabelled block whose first line is
  ``$ durabilis ...`` runs each ``$`` line with the console script and compares what it
  prints (stdout, then stderr) with the lines shown, ``…`` matching anything;
- a block preceded by ``<!-- illustrative: REASON -->`` is not run (the reason
  stays in the source, where a reader sees it; the item lists it in its
  ``illustrative`` user property).

What a document finds:

- Redis: the session's ``redis-server`` (tests/conftest.py), database
  ``DOCS_DB``, flushed before each document: the default namespace
  ``durabilis`` is fresh for every document. ``DURABILIS_REDIS_URL`` points
  there, so ``durabilis.connect()`` and the ``$ durabilis`` commands go there;
  ``store`` is already connected to it.
- A working directory of its own (a temporary one) holding an empty
  ``durabilis.toml`` (the defaults).
- Stand-ins for the application the docs assume (``stand_ins()`` below: a
  ``wiki`` service, a ``charge`` function...), defined here.

After each document the harness stops what its blocks started (``ConfigSync``
pollers, layers, stores), and puts back the ``durabilis`` logger and
``instant_retries``'s setting.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import doctest
import inspect
import logging
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sybil import Document, Example, Region, Sybil
from sybil.evaluators.skip import Skipper
from sybil.parsers.markdown import CodeBlockParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, RawFencedCodeBlockLexer

import durabilis
from durabilis import DurabilityLayer
from durabilis._retry_core import TESTING
from durabilis.config import ConfigSync

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS_DB = 15
CLI = Path(sys.executable).parent / "durabilis"


# --- the evaluators -------------------------------------------------------------------------


def run_python(example: Example) -> None:
    """Run a ``python`` block in the document's namespace (top-level ``await`` allowed)."""
    __tracebackhide__ = True
    source = "\n" * (example.line + example.parsed.line_offset) + example.parsed
    code = compile(source, example.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                   dont_inherit=True)
    try:
        result = eval(code, example.namespace)
        if inspect.iscoroutine(result):
            asyncio.run(result)
    finally:
        example.namespace.pop("__builtins__", None)
        # what a later block rebinds is still stopped at the end of the document
        harness: Harness = example.namespace["__harness__"]
        harness.left.extend(v for v in example.namespace.values()
                            if _closable(v) and all(v is not w for w in harness.left))


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env=env)


def check_toml(example: Example) -> None:
    """A ``toml`` block passes ``durabilis config check``, as printed."""
    harness: Harness = example.namespace["__harness__"]
    path = harness.cwd / f"example-{example.line}.toml"
    path.write_text(example.parsed, encoding="utf-8")
    done = _cli(["config", "check", str(path)], harness.cwd, harness.env())
    assert done.returncode == 0, f"durabilis config check: {done.stderr or done.stdout}"
    assert done.stdout.startswith(f"{path}: ok ("), done.stdout


def _commands(block: str) -> Iterator[tuple[str, str]]:
    """``($ line, the lines shown after it)`` for each ``$`` line of a block."""
    command: str | None = None
    shown: list[str] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            if command is not None:
                yield command, "\n".join(shown)
            command, shown = line[2:], []
        else:
            shown.append(line)
    if command is not None:
        yield command, "\n".join(shown)


def run_console(example: Example) -> None:
    """Each ``$ durabilis ...`` line of the block, run: it prints what is shown."""
    harness: Harness = example.namespace["__harness__"]
    checker = doctest.OutputChecker()
    for command, shown in _commands(example.parsed):
        argv = shlex.split(command)
        assert argv[0] == "durabilis", (
            f"{command!r}: only `$ durabilis ...` lines run; mark the block "
            "<!-- illustrative: REASON --> if it cannot")
        done = _cli(argv[1:], harness.cwd, harness.env())
        got = done.stdout + done.stderr
        want = shown.strip("\n").replace("…", "...") + "\n"
        if not checker.check_output(want, got, doctest.ELLIPSIS):
            raise AssertionError(f"$ {command}\n(exit {done.returncode})\n"
                                 + checker.output_difference(
                                     doctest.Example(command, want), got, doctest.ELLIPSIS))


# --- the parsers ----------------------------------------------------------------------------


class IllustrativeParser:
    """``<!-- illustrative: REASON -->``: the next block is skipped with that reason."""

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(directive="illustrative", arguments=".+?")
        self.skipper = Skipper("illustrative")

    def __call__(self, document: Document) -> Iterable[Region]:
        for lexed in self.lexer(document):
            reason = "illustrative: " + lexed.lexemes["arguments"].strip()
            yield Region(lexed.start, lexed.end, ("next", repr(reason)), self.skipper)


class ConsoleParser:
    """A ``text``, ``console``, shell or unlabelled block whose first line is ``$ ...``."""

    def __init__(self) -> None:
        self.lexer = RawFencedCodeBlockLexer(
            info_pattern=re.compile(r"(?P<language>text|console|sh|bash|shell|)$\n", re.MULTILINE))

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in self.lexer(document):
            source = region.lexemes["source"]
            if source.startswith("$ "):
                yield Region(region.start, region.end, source, run_console)


DOCS = Sybil(
    parsers=[
        IllustrativeParser(),
        CodeBlockParser("python", run_python),
        CodeBlockParser("toml", check_toml),
        ConsoleParser(),
    ],
)


# --- what a document finds ------------------------------------------------------------------


class _Wiki:
    """The wiki service of the examples: records what it was sent."""

    def __init__(self) -> None:
        self.pages: list[dict[str, Any]] = []

    def put(self, payload: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
        self.pages.append({"payload": payload, "headers": dict(headers or {})})
        return {"saved": len(self.pages)}

    def write(self, **fields: Any) -> dict[str, Any]:
        return self.put(fields)


class _Client:
    """The MCP client of the retry examples."""

    def call(self, tool: str, args: Any) -> dict[str, Any]:
        return {"tool": tool, "args": args}

    async def acall(self, tool: str, args: Any) -> dict[str, Any]:
        return self.call(tool, args)


async def _starlette_app(scope: Any, receive: Any, send: Any) -> None:
    """The ASGI application the HTTP middleware wraps."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def stand_ins() -> dict[str, Any]:
    """The application the docs assume, fresh for each document."""
    wiki = _Wiki()
    return {
        "wiki": wiki,                                       # a service taking idempotency keys
        "edit_wiki": lambda *a, **k: wiki.put({"args": a, **k}),
        "order": {"order_id": "o-1", "amount": 10},         # breaker.md: charge(order)
        "charge": lambda order: {"charged": order},
        "fetch_pages": lambda: [1, 2],                      # checkpoint.md: a task's phases
        "parse": lambda pages: [{"page": p} for p in pages],
        "store_all": len,
        "handle": lambda page: None,                        # dlq.md: a page of records
        "client": _Client(), "tool": "search", "args": {"q": "x"},  # retry.md
        "use": lambda result: None, "park": lambda error, reason: None,
        "starlette_app": _starlette_app,                    # http.md
        "api_account_of": lambda scope: "acct-1",
    }


class Harness:
    """One document's Redis database, working directory and environment."""

    def __init__(self, url: str, cwd: Path) -> None:
        self.url, self.cwd = url, cwd
        self.left: list[Any] = []  # the pollers, layers and stores the blocks made
        self.namespace: dict[str, Any] = {}  # what the document's first block finds

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DURABILIS", "REDIS_URL"))}
        env["DURABILIS_REDIS_URL"] = self.url
        return env


def _docs_url(redis_url: str) -> str:
    match = re.fullmatch(r"(redis://[^/]+)(/\d+)?", redis_url)
    if match is None:
        pytest.fail(f"the docs pass needs the suite's redis:// server, not {redis_url!r}",
                    pytrace=False)
    return f"{match.group(1)}/{DOCS_DB}"


def _closable(value: Any) -> bool:
    return isinstance(value, (ConfigSync, durabilis.Store, DurabilityLayer))


def _shut(value: Any) -> None:
    """Stop a poller, close a layer or a store a block left behind."""
    if isinstance(value, ConfigSync):
        value.stop()
    else:
        value.close()


@pytest.fixture
def docs_harness(redis_url: str) -> Iterator[Harness]:
    """A document's Redis database (flushed), environment, working directory and
    namespace (``harness.namespace``: the stand-ins and ``store``); afterwards
    what its blocks started is stopped and the process-wide settings put back."""
    if os.environ.get("DURABILIS_TEST_REDIS_URL"):
        pytest.skip(f"the docs pass flushes database {DOCS_DB}: it runs only on the "
                    "suite's own redis-server")
    url = _docs_url(redis_url)
    logger = logging.getLogger("durabilis")
    saved_logging = (logger.level, list(logger.handlers), logger.propagate,
                     logging.root.level, list(logging.root.handlers))
    saved_retries = (TESTING.instant, TESTING.max_attempts)
    with tempfile.TemporaryDirectory(prefix="durabilis-docs-") as tmp, \
            pytest.MonkeyPatch.context() as mp:
        cwd = Path(tmp)
        (cwd / "durabilis.toml").write_text("", encoding="utf-8")
        harness = Harness(url, cwd)
        for name in [k for k in os.environ if k.startswith(("DURABILIS", "REDIS_URL"))]:
            mp.delenv(name)
        mp.setenv("DURABILIS_REDIS_URL", url)
        mp.chdir(cwd)
        store = durabilis.connect(url)
        store.client.flushdb()
        harness.namespace.update(stand_ins(), store=store, __harness__=harness)
        try:
            yield harness
        finally:
            for value in reversed(harness.left):  # pollers and layers before their stores
                with contextlib.suppress(Exception):  # a block's object, in a state of its own
                    _shut(value)
            store.close()
            logger.setLevel(saved_logging[0])
            logger.handlers[:] = saved_logging[1]
            logger.propagate = saved_logging[2]
            logging.root.setLevel(saved_logging[3])
            logging.root.handlers[:] = saved_logging[4]
            TESTING.instant, TESTING.max_attempts = saved_retries
