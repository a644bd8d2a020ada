"""The retry pillar's core: policies, backoff, decisions, budget calls, the retry plan.

No I/O, no sleeping, no clock of its own (the shells hand in ``clock``,
``rng`` and the exception classifier). After each failed attempt ``i``
(numbered from 0) :func:`decide_coded` applies, in this order (DESIGN
Appendix, "Retry execute"):

1. no policy for the operation type (and no ``"*"``): stop, ``EXHAUSTED``
   (exactly one attempt, unclassified);
2. the error's code is not retryable: stop, ``NON_RETRYABLE`` (no DLQ);
3. ``i + 1 >= max_attempts``: stop, ``EXHAUSTED`` (never sleep after the last);
4. the delay would reach the deadline: stop, ``DEADLINE_EXCEEDED``;
5. otherwise retry after the delay (a budgeted policy then asks the retry
   budget: a refusal stops with ``RETRY_BUDGET_EXHAUSTED``).

:func:`retry_loop` is that loop as a plan whose every step is a hook's
(:class:`RetryHooks`). :func:`retry_plan` is the engines' hooks on it (``Run``,
``Sleep``, the budget's ``ScriptCall``), which
:class:`~durabilis.retry.RetryEngine` and
:class:`~durabilis.retry.AsyncRetryEngine` drive; the composed layer drives the
same loop with its own hooks (``durabilis.core.layer.attempts``: the claim's
lease, the breaker's admission and report, the DLQ).

- :mod:`durabilis.core.retry.types`: policy, budget, decision, outcome, ``TESTING``.
- :mod:`durabilis.core.retry.plans`: decisions, the budget's calls, the plan.
- :mod:`durabilis.core.retry.defaults`: the policies shipped (gateway's and seed's).
"""

from durabilis.core.retry.defaults import default_policies, gateway_policies
from durabilis.core.retry.plans import (
    BudgetOps,
    BudgetState,
    RetryHooks,
    Stopped,
    decide_coded,
    retry_loop,
    retry_plan,
)
from durabilis.core.retry.types import *  # noqa: F403
from durabilis.core.retry.types import __all__ as _TYPES

__all__ = [  # noqa: PLE0604
    *_TYPES,
    "BudgetOps",
    "BudgetState",
    "RetryHooks",
    "Stopped",
    "decide_coded",
    "default_policies",
    "gateway_policies",
    "retry_loop",
    "retry_plan",
]
