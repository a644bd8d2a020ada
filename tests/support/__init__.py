"""Shared test machinery: a local Redis Cluster, fault injection, effect counting, garbage.

Everything here is pillar-neutral so later suites (retry, breaker, checkpoint,
DLQ, the composed layer) reuse it by adding tests, not harness code.
"""
