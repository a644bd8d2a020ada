"""Cross-process guarantee: one winner per key among real processes."""

from __future__ import annotations

import multiprocessing

import pytest

import durabilis
from tests.integration._idem_workers import claim_rounds

pytestmark = pytest.mark.serial

PROCESSES = 16
ROUNDS = 200


def test_sixteen_processes_claiming_the_same_key_get_exactly_one_new_per_round(
    redis_url: str, namespace: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=claim_rounds, args=(redis_url, namespace, ROUNDS, barrier, out, i))
        for i in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    winners_per_round = [sum(results[i][r] for i in range(PROCESSES)) for r in range(ROUNDS)]
    assert winners_per_round == [1] * ROUNDS  # zero double winners, zero rounds without one
    # Every loser saw the winner's claim, and the store holds one record per round.
    store = durabilis.connect(redis_url, namespace=namespace)
    try:
        assert durabilis.idempotency.IdempotencyGuard(store).record_count() == ROUNDS
    finally:
        store.close()
