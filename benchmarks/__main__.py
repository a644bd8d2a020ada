"""``python -m benchmarks``: the whole suite (``--quick`` for a smoke run of seconds)."""

from benchmarks.suite import main

main()
