"""Pieces the CLI suites share: a fleet TOML for op type ``job`` behind breaker
``svc``, and a runner of ``durabilis`` commands in-process."""

from __future__ import annotations

import pytest

from durabilis.cli import main


def fleet_toml(*, lease: float, breaker: str, retry_extra: str = "") -> str:
    """Quick retries for ``job`` (2 attempts, NETWORK_TIMEOUT), guarded by ``svc``
    with the ``breaker`` fields given (TOML lines); no seed defaults."""
    return f"""
[idempotency]
in_progress_ttl_seconds = {lease}

[retry]
include_defaults = false

[retry.job]
max_attempts = 2
initial_delay_ms = 1
max_delay_ms = 2
jitter = false
retryable_errors = ["NETWORK_TIMEOUT"]
{retry_extra}
[circuit_breaker]
include_defaults = false

[circuit_breaker.svc]
{breaker.strip()}

[dependencies]
include_defaults = false
job = "svc"
"""


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``durabilis ARGS`` in this process: ``(exit code, stdout, stderr)``."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err
