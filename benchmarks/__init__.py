"""durabilis benchmarks: run with `python -m benchmarks` (see benchmarks/README.md)."""
