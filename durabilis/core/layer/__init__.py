"""The layer's core: the whole logic of the layer, as plans of steps
(``durabilis.core.steps``), and the values it hands out. No I/O here: it
imports no redis, asyncio, threading or logging (``tests/unit/test_core_purity.py``);
what it takes from the process (interruptions, error classification, tracing
hooks) the shells hand in as a :class:`Runtime`, its events go to
:mod:`durabilis.core.logsink`.

One class, :class:`LayerCore`, stacked from one module per concern, each a
class over the one before it (so each sees what it calls, for mypy too):

- ``types``: the context ``fn`` is handed, ``LayerStats``, the layer's codes;

- ``base``: what the plans read of the shells (``StoreShape``, ``Policies``,
  the core's ``BreakerBook``), constants, reply predicates, the request and
  claim records, the state (``_Base``);
- ``requests``: request building and keys; ``notes``: counts, index notes,
  the keep-alive's calls, stats;
- ``record``: the record step; ``park``: parking, abandoning a claim;
  ``attempts``: the retry loop; ``claim``: the claim step;
- ``lean``: ``execute_plan`` and the lean path;
- ``recovery`` (over ``park``) and ``replay`` (over ``lean``).

The rules that make the core promise hold (``docs/layer.md``):

- **Check before the effect.** Everything checkable (the payload in the
  encoding of every pillar that may store it, every key part against every
  cap, checkpoint ids) is checked in :meth:`_LayerCore.request`, before the
  claim. That a failure can be parked in the DLQ is checked there too (its
  names, and its size: bounded by the envelope's); the record itself is built
  only when the operation is parked, from the envelope.
- **The lean path.** The common case (standalone, a new key, ``fn`` succeeds)
  runs as one flat plan (:meth:`_LayerCore._lean_plan`) whose steps are those
  the plans send for it; at the first reply that is not the common case the
  plans take over from where it stands.
- **After the effect, record first.** Once ``fn`` returned, nothing raises
  before the outcome is recorded: an unstorable result is recorded as
  "completed, result not stored"; a record step that fails is sent again
  (shielded, with backoff) while the claim's lease lasts.
- **Steps are all-or-nothing.** The claim step gates on the claim and the
  breaker: a refusal by either writes nothing (standalone) or is compensated
  (Cluster). Every claim carries a nonce, so it can be released, and its
  probe slot freed, even when the reply that named them was lost.
- **Entries are owned.** An in-flight index entry is ``<key>|<nonce>``: only
  its own claim removes it, recovery drops it once another claim holds the key.
- **Interruptions.** A cancellation (or ``KeyboardInterrupt``) before the
  outcome releases the claim and the probe slot (shielded) and re-raises.
  Once ``fn`` has started, the claim goes back *touched*: the next delivery
  runs with ``ctx.recovered`` (same key, higher token), never as if untouched.
"""

from durabilis.core.layer.base import (
    _CLAIM_AGAIN,
    DUPLICATES_FLUSH_SECONDS,
    SIM_BUCKETS,
    Policies,
    Runtime,
    StoreShape,
    Tracing,
    _ClaimAgain,
    _Request,
    dlq_id_for,
)
from durabilis.core.layer.core import _LayerCore

LayerCore = _LayerCore
"""The layer's plans and state, one per layer (the shells build it)."""

Request = _Request
"""One operation, validated and encoded (the plans' input)."""
ClaimAgain = _ClaimAgain
"""Raised by a plan whose parking's guard dropped it: the call claims again."""
CLAIM_AGAIN = _CLAIM_AGAIN
"""Returned by such a plan, for the same."""

__all__ = [
    "CLAIM_AGAIN",
    "DUPLICATES_FLUSH_SECONDS",
    "SIM_BUCKETS",
    "ClaimAgain",
    "LayerCore",
    "Policies",
    "Request",
    "Runtime",
    "StoreShape",
    "Tracing",
    "_LayerCore",
    "dlq_id_for",
]
