"""The I/O-free core: types, script call builders, reply decoders and plans.

Nothing here imports redis, asyncio or threading (a unit test checks it): a
plan is a generator of steps (:mod:`durabilis.core.steps`) that a driver
performs (``durabilis._steps.drive`` / ``adrive``, or the test suite's
simulator), so one plan serves the sync and the async shell. What the core
needs from the process (a lock, a clock, a logger, fresh ids) is handed to it
by the shell that builds it.

- :mod:`durabilis.core.steps`: the step vocabulary.
- :mod:`durabilis.core.breaker`: the circuit breaker.
- :mod:`durabilis.core.checkpoint`: checkpoints.
- :mod:`durabilis.core.retry`: retry policies, decisions, the budget's calls, the retry plan.
- :mod:`durabilis.core.lease`: the periodic chores' lease call.
"""
