"""The core promise under every input, interruption and interleaving (issue: fault simulator).

Each seed is one run of :class:`tests.sim.engine.Simulation`: workers, a
recoverer and a replayer stepped one plan step at a time on a real
redis-server, with faults injected at every step boundary, then checked:

- no operation with a completed record runs again;
- no two workers inside ``fn`` for one key at once while leases are respected;
- every operation whose ``fn`` had its effect ends recorded or parked; every
  caller that got a result finds it recorded, duplicates got the same answer,
  every ``RetryExhausted.dlq_id`` exists;
- nothing stuck: no claim in progress and no in-flight entry after recovery,
  no probe slot held by a plan that ended cleanly;
- every error that escaped is a ``DurabilisError``, the user's own,
  ``CancelledError``, or an interruption injected in ``fn`` (``SystemExit``,
  ``KeyboardInterrupt``); fencing tokens of one key only increase; a run after
  an earlier run's effect is told (``ctx.recovered``, a replay);
- the seams (see the engine's docstring): a forked child never acts on its
  parent's claims or counts; under a key secret rotation the checks above hold
  per logical operation (its key under each secret); the fleet never grants
  more retries than the strictest retry budget setting in use allows; the
  checks above hold when outcomes are left to the keep-alive at once and its
  own steps fail too.

``--sim-seeds N`` runs N seeds (default 2000, about 2 minutes), split in
``PARTS`` tests of consecutive seeds (so pytest-xdist spreads them over its
workers); ``--sim-seed S`` replays one and prints its trace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from durabilis.testing import INSTALL_HINT, RedisServer, find_redis_server
from tests.sim.engine import run_seed
from tests.support import figures

DEFAULT_SEEDS = 2000
#: The seeds are split in this many tests (consecutive slices), for pytest-xdist.
PARTS = 4


@pytest.fixture(scope="module")
def sim_redis_url(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A redis-server of the simulator's own (unless DURABILIS_TEST_REDIS_URL names
    one): its checks SCAN the keyspace after every seed, and on the session's
    server that walked every earlier test's keys (248 s of 300 in a full run,
    against ~100 s alone)."""
    if os.environ.get("DURABILIS_TEST_REDIS_URL"):
        yield redis_url
        return
    if find_redis_server() is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    server = RedisServer(tmp_path_factory.mktemp("sim-redis")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.mark.standalone_only
@pytest.mark.parametrize("part", range(PARTS), ids=lambda p: f"part{p + 1}of{PARTS}")
def test_the_core_promise_holds_for_every_seed(
    sim_redis_url: str, pytestconfig: pytest.Config, part: int
) -> None:
    """Seeds ``first .. first + count`` in ``PARTS`` consecutive slices, one per test,
    so that pytest-xdist can run them on different workers; together they are
    every seed, each run once."""
    redis_url = sim_redis_url
    one = pytestconfig.getoption("--sim-seed")
    if one is not None:
        if part:
            pytest.skip("--sim-seed: the replay runs in the first part")
        sim = run_seed(one, redis_url)
        print("\n".join(sim.trace))
        return
    count = pytestconfig.getoption("--sim-seeds") or DEFAULT_SEEDS
    first = pytestconfig.getoption("--sim-first")
    lo, hi = first + count * part // PARTS, first + count * (part + 1) // PARTS
    steps = lean = 0
    for seed in range(lo, hi):
        sim = run_seed(seed, redis_url)
        steps += sim.step_no
        lean += sim.lean_calls
    figures.note(f"fault simulator, part {part + 1} of {PARTS}: {hi - lo} seeds "
                 f"({lo}..{hi - 1} of {first}..{first + count - 1}), {steps} steps, "
                 f"{lean} sync lean calls run by the layer's own lean_call, "
                 "every invariant held")
    # The sync layer's lean path is stepped itself (tests/sim/threaded.py), not
    # only its plan twin: a wiring that stopped doing so would not show otherwise.
    assert lean > 0 or hi - lo < 50
