"""``doctor``: is this Redis fit for durable state."""

from __future__ import annotations

from collections.abc import Callable

from durabilis.cli._base import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, MAX_PINGS, CliError
from durabilis.cli._output import print_json, printable
from durabilis.cli._session import Session


def _doctor(s: Session) -> int:
    from durabilis.doctor import run_doctor  # noqa: PLC0415

    if s.args.pings < 1 or s.args.scan_limit < 1:
        raise CliError(EXIT_USAGE, "--pings and --scan-limit must be >= 1")
    if s.args.pings > MAX_PINGS:
        raise CliError(EXIT_USAGE, f"--pings must be at most {MAX_PINGS}")
    # A wrong namespace is one of doctor's checks ("namespace"), not exit 5.
    config = s.config() if s.config_path is not None else None
    report = run_doctor(s.store(), pings=s.args.pings, scan_limit=s.args.scan_limit,
                        config=config)
    if s.json:
        print_json(report.to_dict())
    else:
        print(f"durabilis doctor: {printable(report.url)} (namespace {report.namespace!r})")
        width = max(len(c.name) for c in report.checks)
        for c in report.checks:
            print(f"{c.status.upper():<4}  {c.name.ljust(width)}  {printable(c.summary)}")
    if report.ok or (s.args.allow_warnings and not report.failed):
        return EXIT_OK
    return EXIT_NOT_FOUND


COMMANDS: dict[tuple[str, str | None], Callable[[Session], int]] = {
    ("doctor", None): _doctor,
}
