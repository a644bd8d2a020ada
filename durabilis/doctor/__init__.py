"""``durabilis doctor``: is this Redis fit to hold the durable state of a fleet?

Checks, each ``ok``, ``info``, ``warn`` or ``fail``:

- ``connection``: PING answers.
- ``version``: Redis >= 6.2 on every primary (durabilis uses no newer command).
- ``mode``: standalone, Sentinel or Cluster (and the cluster's state).
- ``persistence``: AOF on (``appendonly yes``); ``appendfsync always`` or
  ``everysec`` (up to a second of acknowledged writes lost in a crash).
- ``eviction``: ``maxmemory-policy noeviction``. Every durabilis record carries
  a TTL, so a ``volatile-*`` policy evicts exactly those records (an evicted
  idempotency record runs an operation twice; an evicted DLQ record is a lost
  operation), and an ``allkeys-*`` policy evicts them too.
- ``memory``: used memory under 90 % of ``maxmemory`` (writes fail above it under noeviction).
- ``replication``: each primary's replicas, their offsets and lag (bytes behind
  the primary); fails when fewer are online than ``acks="replicas:N"`` needs.
- ``sentinel`` (``redis+sentinel://`` only): the primary the Sentinels name,
  its flags, how many Sentinels answer, the quorum and ``SENTINEL CKQUORUM``.
- ``scripts``: every Lua script loads (``SCRIPT LOAD`` each, SHA1 checked).
- ``latency``: median and worst of N PINGs.
- ``keys``: keys of the namespace per pillar (one SCAN).
- ``namespace``: fails when the namespace holds no key while other durabilis
  namespaces exist in this Redis (a wrong ``--namespace`` / ``DURABILIS_NAMESPACE``);
  the namespaces found are named (a bounded SCAN: "at least" when it stopped early).

The classification is pure (tested without Redis); :func:`run_doctor` gathers
the facts. It needs a user allowed ``INFO`` and ``CONFIG GET`` besides what
the application's user has (``docs/production.md``); refused facts are
reported as warnings, not crashes.
"""

from __future__ import annotations

# The package's modules: _checks (the verdicts, pure), _gather (the facts, and run_doctor).
from durabilis.doctor._checks import *  # noqa: F403  (its __all__)
from durabilis.doctor._checks import MEMORY_HIGH as MEMORY_HIGH
from durabilis.doctor._checks import MIN_VERSION as MIN_VERSION
from durabilis.doctor._checks import PILLARS as PILLARS
from durabilis.doctor._checks import SLOW_MEDIAN_MS as SLOW_MEDIAN_MS
from durabilis.doctor._checks import __all__ as _CHECKS
from durabilis.doctor._checks import check_replication as check_replication
from durabilis.doctor._checks import check_sentinel as check_sentinel
from durabilis.doctor._checks import hide_password as hide_password
from durabilis.doctor._checks import parse_version as parse_version
from durabilis.doctor._gather import NAMESPACE_SEARCH_SECONDS as NAMESPACE_SEARCH_SECONDS
from durabilis.doctor._gather import check_config as check_config
from durabilis.doctor._gather import replicas_of as replicas_of
from durabilis.doctor._gather import (
    run_doctor,
    survey_namespaces,
)

__all__ = [*_CHECKS, "run_doctor", "survey_namespaces"]  # noqa: PLE0604
