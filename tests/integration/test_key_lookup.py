"""Keys as their users know them (issue 32): ``durabilis idem show KEY`` and
``dlq ls --key KEY`` find a caller's key as given (its agent's, or every
agent's), an HTTP key under its tenant, and the stored forms as before; the
``redis-cli`` recipes of docs/dlq.md and docs/http.md, run as written, find
them too."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durabilis
from durabilis import OperationError
from durabilis.cli import EXIT_NOT_FOUND, EXIT_OK
from durabilis.config import load_config
from durabilis.layer import DurabilityLayer, OperationContext
from durabilis.testing import instant_retries
from tests.integration._cli_support import fleet_toml
from tests.integration._http_app import build
from tests.integration.test_dlq_durability import redis_cli
from tests.integration.test_http_middleware import serve

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FLEET = fleet_toml(lease=5, breaker="""
failure_rate_threshold = 0.99
min_request_count = 50
window_size = 100
""")


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(textwrap.dedent(FLEET), encoding="utf-8")
    return path


@pytest.fixture
def layer(store: durabilis.Store, config_file: Path) -> Iterator[DurabilityLayer]:
    made = DurabilityLayer(store, load_config(config_file, environ={}))
    yield made
    made.close()


def done(layer: DurabilityLayer, agent: str, key: str, payload: Any) -> None:
    layer.execute(agent, "job", payload, lambda ctx: {"ok": key}, idempotency_key=key)


def parked(layer: DurabilityLayer, agent: str, key: str, payload: Any) -> str:
    def down(ctx: OperationContext) -> None:
        raise OperationError("NETWORK_TIMEOUT", "upstream timed out")

    with instant_retries(), pytest.raises(durabilis.RetryExhausted) as info:
        layer.execute(agent, "job", payload, down, idempotency_key=key)
    assert info.value.dlq_id is not None
    return info.value.dlq_id


def durabilis_cli(redis_url: str, namespace: str, *args: str) -> tuple[int, str, str]:
    """The ``durabilis`` console script in a fresh process: (exit code, stdout, stderr)."""
    script = Path(sys.executable).parent / "durabilis"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DURABILIS_CONFIG")}
    done_ = subprocess.run(
        [str(script), *args, "--url", redis_url, "--namespace", namespace],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    return done_.returncode, done_.stdout, done_.stderr


def js(result: tuple[int, str, str]) -> Any:
    code, out, err = result
    assert code == EXIT_OK, err
    return json.loads(out)


# --- idem show / dlq ls --key -----------------------------------------------------------


def test_idem_show_finds_a_caller_key_as_given_done_or_parked(
    redis_url: str, namespace: str, layer: DurabilityLayer
) -> None:
    done(layer, "gw-1", "order-o-1", {"o": 1})
    dlq_id = parked(layer, "gw-1", "order-o-2", {"o": 2})

    shown = js(durabilis_cli(redis_url, namespace, "idem", "show", "order-o-1", "--json"))
    assert (shown["status"], shown["agent"], shown["stored_key"]) == (
        "done", "gw-1", "%raw:gw-1:order-o-1")
    assert shown["key"] == "order-o-1" and shown["result"] == {"ok": "order-o-1"}

    # Parked: no idempotency record, but the pending DLQ record carries the key.
    shown = js(durabilis_cli(redis_url, namespace, "idem", "show", "order-o-2", "--json"))
    assert shown["status"] == "in_dlq" and shown["agent"] == "gw-1"
    (record,) = shown["dlq_records"]
    assert (record["dlq_id"], record["status"]) == (dlq_id, "pending")
    code, out, _ = durabilis_cli(redis_url, namespace, "idem", "show", "order-o-2")
    assert code == EXIT_OK and "the operation is in the DLQ" in out and dlq_id in out

    # --agent: exactly that agent's caller key.
    shown = js(durabilis_cli(redis_url, namespace, "idem", "show", "order-o-1", "--agent",
                             "gw-1", "--json"))
    assert shown["stored_key"] == "%raw:gw-1:order-o-1"
    code, _, err = durabilis_cli(redis_url, namespace, "idem", "show", "order-o-1",
                                 "--agent", "gw-2")
    assert code == EXIT_NOT_FOUND and "agent 'gw-2'" in err

    # The old forms still work: the stored form, and a content key.
    shown = js(durabilis_cli(redis_url, namespace, "idem", "show", "%raw:gw-1:order-o-1",
                             "--json"))
    assert shown["status"] == "done" and shown["agent"] == "gw-1"
    layer.execute("gw-1", "job", {"c": 1}, lambda ctx: 1)
    content = str(durabilis.IdempotencyKey.new("gw-1", "job", {"c": 1}))
    shown = js(durabilis_cli(redis_url, namespace, "idem", "show", content, "--json"))
    assert shown["status"] == "done" and shown["agent"] is None

    code, _, err = durabilis_cli(redis_url, namespace, "idem", "show", "order-o-9")
    assert code == EXIT_NOT_FOUND and "nor as any agent's caller key" in err


@pytest.mark.topologies("cluster")  # the agents are found by a SCAN of every primary
def test_idem_show_lists_every_agent_of_a_shared_caller_key_and_agent_picks_one(
    redis_url: str, namespace: str, layer: DurabilityLayer
) -> None:
    done(layer, "gw-1", "order-7", {"o": 1})
    done(layer, "gw:2", "order-7", {"o": 2})  # an agent id that needs escaping
    dlq_id = parked(layer, "gw-3", "order-7", {"o": 3})
    done(layer, "gw-1", "x-order-7", {"o": 4})  # ends alike: not the same key

    shown = js(durabilis_cli(redis_url, namespace, "idem", "show", "order-7", "--json"))
    assert shown["status"] == "ambiguous"
    assert shown["agents"] == ["gw-1", "gw-3", "gw:2"]
    assert {(r["agent"], r["stored_key"]) for r in shown["records"]} == {
        ("gw-1", "%raw:gw-1:order-7"), ("gw:2", "%raw:gw%3A2:order-7")}
    assert [r["dlq_id"] for r in shown["dlq_records"]] == [dlq_id]
    code, out, _ = durabilis_cli(redis_url, namespace, "idem", "show", "order-7")
    assert code == EXIT_OK and "names 3 operations" in out and "--agent" in out

    shown = js(durabilis_cli(redis_url, namespace, "idem", "show", "order-7", "--agent",
                             "gw:2", "--json"))
    assert (shown["status"], shown["stored_key"]) == ("done", "%raw:gw%3A2:order-7")

    # Glob characters and braces in a key are matched literally.
    done(layer, "gw-1", "a*{b}", {"o": 5})
    done(layer, "gw-2", "aX{b}", {"o": 6})
    shown = js(durabilis_cli(redis_url, namespace, "idem", "show", "a*{b}", "--json"))
    assert (shown["status"], shown["stored_key"]) == ("done", "%raw:gw-1:a*{b}")


@pytest.mark.topologies("cluster")  # HSCAN of the by-key index routed to its slot's node
def test_dlq_ls_key_lists_the_records_of_a_caller_key_as_given(
    redis_url: str, namespace: str, layer: DurabilityLayer
) -> None:
    first = parked(layer, "gw-1", "order-o-2", {"o": 2})
    second = parked(layer, "gw-2", "order-o-2", {"o": 2})
    parked(layer, "gw-1", "order-o-3", {"o": 3})
    layer.dlq.abandon(second)

    listing = js(durabilis_cli(redis_url, namespace, "dlq", "ls", "--key", "order-o-2",
                               "--json"))
    assert [r["dlq_id"] for r in listing["records"]] == [first]  # pending by default
    listing = js(durabilis_cli(redis_url, namespace, "dlq", "ls", "--key", "order-o-2",
                               "--status", "all", "--json"))
    assert [r["dlq_id"] for r in listing["records"]] == [first, second]
    listing = js(durabilis_cli(redis_url, namespace, "dlq", "ls", "--key", "order-o-2",
                               "--agent", "gw-2", "--status", "all", "--json"))
    assert [r["dlq_id"] for r in listing["records"]] == [second]
    # The stored form, as before the key could be typed as given.
    listing = js(durabilis_cli(redis_url, namespace, "dlq", "ls", "--key",
                               "%raw:gw-1:order-o-2", "--json"))
    assert [r["dlq_id"] for r in listing["records"]] == [first]
    code, out, _ = durabilis_cli(redis_url, namespace, "dlq", "ls", "--key", "order-o-2")
    assert code == EXIT_OK and first in out and "%raw:gw-1:order-o-2" in out


def test_idem_show_and_dlq_ls_find_an_http_key_under_its_tenant(
    redis_url: str, namespace: str
) -> None:
    async def body(c: Any, mw: Any, raw: Any) -> None:
        response = await c.post("/orders", json={"item": 1}, headers={"Idempotency-Key": "abc"})
        assert response.status_code == 201

    async def main() -> None:
        mw, raw = build(redis_url, namespace)
        await serve(mw, body, raw)

    asyncio.run(main())
    shown = js(durabilis_cli(redis_url, namespace, "idem", "show", "abc", "--json"))
    assert (shown["status"], shown["agent"], shown["stored_key"]) == (
        "done", "http", "%raw:http:abc")
    shown = js(durabilis_cli(redis_url, namespace, "idem", "show", "abc", "--agent", "http",
                             "--json"))
    assert shown["status"] == "done"


# --- the redis-cli recipes, run as documented ---------------------------------------------


def recipe(doc: Path, title: str) -> list[str]:
    """The ``redis-cli`` lines of the ``sh`` block under ``title`` in ``doc``."""
    text = doc.read_text(encoding="utf-8")
    start = text.index(title)
    block = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert block is not None, f"no sh block under {title!r} in {doc.name}"
    return [line for line in block.group(1).splitlines() if line.startswith(("NS=", "KEY=",
                                                                               "AGENT=",
                                                                               "redis-cli"))]


def run_recipe(lines: list[str], redis_url: str, variables: dict[str, str]) -> list[str]:
    """Each ``redis-cli`` line through ``sh`` as written (after the variables
    are set as given, and ``redis-cli`` pointed at the test's server); every
    output line."""
    cli = redis_cli()
    script = "\n".join(
        [f"{name}='{value}'" for name, value in variables.items()]
        + [line.replace("redis-cli", f"'{cli}' -u '{redis_url}'", 1)
           for line in lines if line.startswith("redis-cli")]
    )
    out = subprocess.run(["sh", "-ec", script], capture_output=True, timeout=60,
                         encoding="utf-8", errors="replace",
                         check=True)
    return out.stdout.splitlines()


def test_the_redis_cli_recipes_in_the_docs_find_caller_and_http_keys_as_printed(
    redis_url: str, namespace: str, layer: DurabilityLayer
) -> None:
    done(layer, "gw-1", "order-o-1", {"o": 1})
    dlq_id = parked(layer, "gw-1", "order-o-2", {"o": 2})
    layer.execute("http", "http_request", {"r": 1}, lambda ctx: 1,
                  idempotency_key=durabilis.IdempotencyKey.from_raw("abc", payload={"r": 1}))

    dlq_lines = recipe(DOCS / "dlq.md", "### A caller's key with `redis-cli`")
    assert any("--scan --pattern" in line for line in dlq_lines)
    out = run_recipe(dlq_lines, redis_url, {"NS": namespace, "KEY": "order-o-2",
                                            "AGENT": "gw-1"})
    assert f"{namespace}:idem:{{%25raw:gw-1:order-o-2}}" in out  # the record (a tombstone)
    assert dlq_id in out  # the by-key index names the parked record
    out = run_recipe(dlq_lines, redis_url, {"NS": namespace, "KEY": "order-o-1",
                                            "AGENT": "gw-1"})
    assert f"{namespace}:idem:{{%25raw:gw-1:order-o-1}}" in out and "d" in out

    http_lines = recipe(DOCS / "http.md", "### Finding a key with `redis-cli`")
    out = run_recipe(http_lines, redis_url, {"NS": namespace, "KEY": "abc"})
    assert f"{namespace}:idem:{{%25raw:http:abc}}" in out
