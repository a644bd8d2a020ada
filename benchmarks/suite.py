"""The whole benchmark suite in one run: ``python -m benchmarks`` (see benchmarks/README.md).

It starts its own redis-server (loopback, no persistence), measures in the
same run the Redis floor, the durable call (1 process and 1..8 processes,
sync and async, distinct keys and contention), each pillar alone, the peers,
and the cost in Redis commands and memory; prints a table; writes the JSON
results and the text table; and draws the chart of calls/s against the
number of processes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import bench_http, bench_layer, bench_lean, bench_peers, bench_pillars
from benchmarks._harness import (
    MODES,
    Settings,
    machine,
    measure_processes,
    measure_single,
    quiet,
    ratio,
    redis_server,
)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

PING = "redis PING"
PING_ASYNC = "redis PING (asyncio, 1 connection)"
ASYNC_64 = "durable call (async, 64 in flight)"
EVALSHA = "redis EVALSHA (return 1)"
DURABLE = "durable call (sync)"
RAW_SCRIPTS = "durable call's 2 scripts, no layer (sync)"
IDEM = "idempotency claim+record"
POWERTOOLS = "powertools idempotency (Redis)"
STACK = bench_peers.STACK
RETRY_PAIR = "durabilis execute / tenacity Retrying"


def run_suite(settings: Settings, out_dir: Path | None = None) -> dict[str, Any]:
    """Measure everything; write ``<stem>.json``, ``<stem>.txt`` and the chart.

    Args:
        settings: How much to measure (``MODES["full"]``, ``["quick"]``, ``["smoke"]``).
        out_dir: Where to write; by default ``benchmarks/results/latest.*`` and
            ``benchmarks/throughput.png`` for a full run, ``results/<mode>.*``
            otherwise (so a quick run never overwrites the README's figures).

    Returns:
        The results (the JSON's content) with ``paths`` added.
    """
    quiet()
    started = time.monotonic()
    errors: list[str] = []
    results: dict[str, Any] = {
        "meta": {
            "mode": settings.mode,
            "started_at": datetime.datetime.now(datetime.UTC).isoformat(
                timespec="seconds"
            ),
            "settings": settings.as_dict(),
        }
    }
    took: dict[str, float] = {}

    def section(name: str, measure: Callable[[], Any]) -> None:
        began = time.monotonic()
        results[name] = measure()
        took[name] = round(time.monotonic() - began, 1)

    with redis_server() as (url, admin):
        results["meta"]["machine"] = machine(admin)
        section("single", lambda: measure_single(
            url,
            {**bench_pillars.FLOOR, **bench_layer.SINGLE, **bench_pillars.SINGLE,
             **bench_peers.SINGLE},
            settings, admin=admin, errors=errors,
        ))
        section("processes", lambda: measure_processes(
            url,
            {**bench_pillars.PROCESSES, **bench_layer.PROCESSES, **bench_peers.PROCESSES},
            settings, admin=admin, errors=errors,
        ))
        section("breaker", lambda: bench_peers.breaker_comparison(
            settings, url=url, admin=admin, errors=errors
        ))
        section("retry", lambda: bench_peers.retry_overhead(settings, url=url, errors=errors))
        section("http", lambda: bench_http.run(url, settings.rounds, settings.seconds))
        section("lean", lambda: bench_lean.measure(url, admin, settings.mode))
        section("cost", lambda: {
            "per_operation": bench_pillars.costs(
                url, admin, {**bench_pillars.COST, **bench_peers.COST}, settings.cost_ops,
                errors,
            ),
            "memory": {
                **bench_pillars.memory(url, admin, settings.memory_records, errors),
                **bench_peers.memory(url, admin, settings.memory_records, errors),
            },
        })
    results["meta"]["section_seconds"] = took
    results["targets"] = targets(results)
    results["fleet_targets"] = fleet_targets(results)
    results["ratios"] = more_ratios(results)
    results["floors"] = floors(results)
    results["errors"] = errors
    results["meta"]["duration_s"] = round(time.monotonic() - started, 1)

    if out_dir is None:
        out_dir = RESULTS
        stem = "latest" if settings.mode == "full" else settings.mode
        chart = HERE / "throughput.png" if settings.mode == "full" else out_dir / f"{stem}.png"
    else:
        stem = "results"
        chart = out_dir / "throughput.png"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "table": out_dir / f"{stem}.txt"}
    paths["json"].write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    paths["table"].write_text(report(results) + "\n")
    if draw_chart(results, chart):
        paths["chart"] = chart
    results["paths"] = {k: str(v) for k, v in paths.items()}
    return results


# --- targets ----------------------------------------------------------------------------


def _target(
    name: str, value: float | None, target: float, comparison: str, detail: str
) -> dict[str, Any]:
    met = None
    if value is not None:
        met = value >= target if comparison == ">=" else value <= target
    return {
        "name": name,
        "ratio": None if value is None else round(value, 3),
        "target": round(target, 3),
        "comparison": comparison,
        "met": met,
        "detail": detail,
    }


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets, each a ratio of figures measured in this run."""
    single, procs = results.get("single", {}), results.get("processes", {})
    out = []
    ping = single.get(PING, {}).get("median")
    durable = single.get(DURABLE, {}).get("median")
    out.append(_target(
        "full durable call, 1 process, vs PING round trips/s / 2",
        durable / (ping / 2) if durable and ping else None, 0.8, ">=",
        f"'{DURABLE}' / ('{PING}' / 2), in-process, interleaved rounds",
    ))
    breaker = results.get("breaker", {}).get("ratios", {}).get("1", {})
    out.append(_target(
        "breaker-guarded call vs pybreaker CircuitRedisStorage (1 process)",
        breaker.get("durabilis/pybreaker"), 1.0, ">=",
        f"registry.call / pybreaker call ({results.get('breaker', {}).get('source')})",
    ))
    out.append(_target(
        "idempotent call vs powertools idempotency with Redis (1 process)",
        ratio(single.get(IDEM), single.get(POWERTOOLS)), 1.5, ">=",
        f"'{IDEM}' / '{POWERTOOLS}', in-process, interleaved rounds",
    ))
    for n in (1, 4):
        # 1 process: in-process rounds; 4: the multi-process figures.
        durable_n = single.get(DURABLE) if n == 1 else procs.get(DURABLE, {}).get(str(n))
        stack = single.get(STACK) if n == 1 else procs.get(STACK, {}).get(str(n))
        out.append(_target(
            f"durable call vs the peer stack (tenacity+pybreaker+powertools), {n} process(es)",
            ratio(durable_n, stack), 1.5, ">=",
            f"'{DURABLE}' / '{STACK}', {'in-process' if n == 1 else f'{n} processes'}",
        ))
    out.append(_target(
        "async durable calls, 64 in flight, vs asyncio PING/s on 1 connection",
        ratio(single.get(ASYNC_64), single.get(PING_ASYNC)), 1.0, ">=",
        f"'{ASYNC_64}' / '{PING_ASYNC}', in-process, interleaved rounds",
    ))
    retry = results.get("retry", {}).get("ratios", {})
    out.append(_target(
        "retry overhead vs tenacity's (successful call)",
        retry.get(RETRY_PAIR), 1 / 3, "<=",
        f"bench_retry: '{RETRY_PAIR}' overhead (per-call time minus a bare call)",
    ))
    return out


FLEET_PROCESSES = 8
"""The process count of the fleet row ("durable calls/s over N processes")."""


def _over(ours: float | None, theirs: float | None) -> float | None:
    return float(ours) / float(theirs) if ours is not None and theirs else None


def fleet_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The fleet-scale table (issue 15's), every row measured in this run.

    Its bars are the issue's own; where a row repeats a ratio of :func:`targets`
    with another bar (the durable call against PING/2, idempotency against
    powertools), both are printed. Cluster rows are ``bench_cluster``'s, which
    needs a local Cluster: they are named here, not measured.
    """
    single, procs = results.get("single", {}), results.get("processes", {})
    cost = results.get("cost", {})
    per_op, memory = cost.get("per_operation", {}), cost.get("memory", {})
    ping = single.get(PING, {}).get("median")
    durable = single.get(DURABLE, {}).get("median")
    new_key = per_op.get("durable call (new key)", {})
    ping_cost = per_op.get(PING, {})
    n = str(FLEET_PROCESSES)
    ping_n = procs.get(PING, {}).get(n, {}).get("median")
    durable_n = procs.get(DURABLE, {}).get(n, {}).get("median")
    breaker = results.get("breaker", {}).get("ratios", {}).get("1", {})
    record = memory.get("durable call record", {}).get("bytes")
    retry = results.get("retry", {}).get("ratios", {})
    return [
        _target(
            "durable call, sync, 1 process / (PING/s / 2)",
            _over(durable, ping and ping / 2), 0.65, ">=",
            f"'{DURABLE}' / ('{PING}' / 2)",
        ),
        _target(
            "durable call / powertools idempotency alone (1 process)",
            ratio(single.get(DURABLE), single.get(POWERTOOLS)), 1.0, ">=",
            f"'{DURABLE}' / '{POWERTOOLS}'",
        ),
        _target(
            "idempotency claim+record / powertools (1 process)",
            ratio(single.get(IDEM), single.get(POWERTOOLS)), 1.2, ">=",
            f"'{IDEM}' / '{POWERTOOLS}'",
        ),
        _target(
            "breaker-guarded call / pybreaker CircuitRedisStorage (1 process)",
            breaker.get("durabilis/pybreaker"), 1.0, ">=", "registry.call / pybreaker call",
        ),
        _target(
            "Redis server CPU per durable call / per PING",
            _over(new_key.get("server_cpu_us"), ping_cost.get("server_cpu_us")), 2.5, "<=",
            "cost table: 'durable call (new key)' / 'redis PING', server CPU us",
        ),
        _target(
            "Redis commands per durable call (new key)",
            new_key.get("commands"), 10, "<=",
            "cost table: INFO commandstats, the EVALSHAs and Lua's commands",
        ),
        _target(
            f"durable calls/s over {n} processes / (PING/s over {n} / 2)",
            _over(durable_n, ping_n and ping_n / 2), 0.6, ">=",
            f"'{DURABLE}' / ('{PING}' / 2), {n} processes each",
        ),
        _target(
            "async, 64 in flight / one-connection asyncio PING/s",
            ratio(single.get(ASYNC_64), single.get(PING_ASYNC)), 1.0, ">=",
            f"'{ASYNC_64}' / '{PING_ASYNC}'",
        ),
        _target(
            "durable-call record, MEMORY USAGE (bytes)",
            None if record is None else float(record), 250, "<=",
            "memory: 'durable call record'",
        ),
        _target(
            "retry overhead / tenacity's",
            retry.get(RETRY_PAIR), 1 / 3, "<=", f"bench_retry: '{RETRY_PAIR}'",
        ),
    ]


FLEET_BAR_1_PROCESS = 0.65
"""Issue 15's bar for the durable call against PING/2 (1 process)."""


def floors(results: dict[str, Any]) -> dict[str, float | None]:
    """What the durable call could reach here, from this run's figures.

    ``RAW_SCRIPTS`` sends the durable call's own two scripts with no layer
    around them: its rate over PING/2 is the ceiling of the design's 2 round
    trips on this machine, and the time per call between it and the durable
    call is what the layer's Python costs, live. The budget is the time per
    call the 0.65 bar leaves that Python (one call at a time, so the client's
    and the server's time add up). The same scripts over ``FLEET_PROCESSES``
    processes are the ceiling of the fleet row. On the server's side (the cost
    table), two scripts of ``return 1`` are what any design of two script round
    trips costs before its scripts do anything, against the 2.5 bar.
    """
    single, procs = results.get("single", {}), results.get("processes", {})
    ping = single.get(PING, {}).get("median")
    durable = single.get(DURABLE, {}).get("median")
    raw = single.get(RAW_SCRIPTS, {}).get("median")
    if not (ping and durable and raw):
        return {}
    n = str(FLEET_PROCESSES)
    ping_n = procs.get(PING, {}).get(n, {}).get("median")
    raw_n = procs.get(RAW_SCRIPTS, {}).get(n, {}).get("median")
    per_op = results.get("cost", {}).get("per_operation", {})
    ping_cpu = per_op.get(PING, {}).get("server_cpu_us")
    bar = FLEET_BAR_1_PROCESS * ping / 2
    out: dict[str, float | None] = {
        "the durable call's 2 scripts, no layer / (PING/s / 2)": raw / (ping / 2),
        "durable call / its 2 scripts with no layer": durable / raw,
        "the layer's time per call, us (durable call - its 2 scripts)":
            1e6 / durable - 1e6 / raw,
        f"the layer's budget per call under the {FLEET_BAR_1_PROCESS} bar, us":
            1e6 / bar - 1e6 / raw,
        "client CPU per call, us: the durable call's 2 scripts, no layer": single.get(
            RAW_SCRIPTS, {}).get("client_cpu_us"),
        "client CPU per call, us: the durable call": single.get(DURABLE, {}).get(
            "client_cpu_us"),
        f"{n} processes: the durable call's 2 scripts, no layer / (PING/s / 2)":
            _over(raw_n, ping_n and ping_n / 2),
        # The server's side (cost table): any 2 script round trips, then these 2.
        "server CPU per call / PING's: 2 x EVALSHA of 'return 1'": _over(
            per_op.get("redis EVALSHA (return 1)", {}).get("server_cpu_us"),
            ping_cpu and ping_cpu / 2),
        "server CPU per call / PING's: the durable call's 2 scripts, no layer": _over(
            per_op.get("durable call's 2 scripts, no layer", {}).get("server_cpu_us"), ping_cpu),
    }
    return {k: None if v is None else round(float(v), 3) for k, v in out.items()}


def more_ratios(results: dict[str, Any]) -> dict[str, float | None]:
    """Other ratios of this run that help read the targets (not targets themselves)."""
    single, procs = results.get("single", {}), results.get("processes", {})
    evalsha = single.get(EVALSHA, {}).get("median")
    durable = single.get(DURABLE, {}).get("median")
    out: dict[str, float | None] = {
        "durable call / (EVALSHA round trips/s / 2)": (
            durable / (evalsha / 2) if durable and evalsha else None
        ),
        "idempotency duplicate / powertools duplicate (completed key, 1 process)": ratio(
            single.get("idempotency duplicate (completed key)"),
            single.get("powertools duplicate (completed key)"),
        ),
        "durable call duplicate / powertools duplicate (completed key, 1 process)": ratio(
            single.get("durable call, completed duplicate (sync)"),
            single.get("powertools duplicate (completed key)"),
        ),
        "durable call (async, 16 in flight) / durable call (sync), 1 process": ratio(
            single.get("durable call (async, 16 in flight)"), single.get(DURABLE)
        ),
    }
    for n in results["meta"]["settings"]["processes"][1:]:
        key = str(n)
        out[f"idempotency claim+record / powertools, {n} processes"] = ratio(
            procs.get(IDEM, {}).get(key), procs.get(POWERTOOLS, {}).get(key)
        )
        out[f"durable call / powertools, {n} processes"] = ratio(
            procs.get(DURABLE, {}).get(key), procs.get(POWERTOOLS, {}).get(key)
        )
    for n, r in results.get("breaker", {}).get("ratios", {}).items():
        if n != "1" and "durabilis/pybreaker" in r:
            out[f"breaker-guarded call / pybreaker, {n} processes"] = r["durabilis/pybreaker"]
    return {k: None if v is None else round(v, 3) for k, v in out.items()}


# --- the table ----------------------------------------------------------------------------


def _rate(f: dict[str, Any] | None) -> str:
    if not f:
        return "-"
    if "skipped" in f:
        return "skipped"
    return f"{f['median']:,.0f}"


def _spread(f: dict[str, Any] | None) -> str:
    if not f or "median" not in f:
        return ""
    return f"{f['min']:,.0f}-{f['max']:,.0f}"


def _target_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for t in rows:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        value = "-" if t["ratio"] is None else f"{t['ratio']:.3f}"
        lines.append(
            f"  {t['name']:<66} {value:>7} (target {t['comparison']} {t['target']:.3f}) {verdict}"
        )
    return lines


def report(results: dict[str, Any]) -> str:  # noqa: PLR0912  (one table, read top-down)
    """The results as a text table."""
    meta = results["meta"]
    m = meta.get("machine", {})
    s = meta["settings"]
    lines = [
        f"durabilis benchmark suite, {meta['mode']} run, {meta['started_at']}, "
        f"{meta.get('duration_s', '?')} s",
        f"machine: {m.get('nproc')} CPUs ({m.get('cpu_model')}), Python {m.get('python')}, "
        f"redis-server {m.get('redis_server')}, redis-py {m.get('packages', {}).get('redis')}",
        f"figures: median of {s['rounds']} rounds (1 process) / {s['pool_repeats']} runs "
        f"(N processes), spread = min-max; CPU = median us per call",
        "",
    ]
    single = results.get("single", {})
    groups = [
        ("The floor (raw redis-py, one connection)", list(bench_pillars.FLOOR)),
        ("The durable call (full layer, 1 process)", list(bench_layer.SINGLE)),
        ("Each pillar alone (1 process)", list(bench_pillars.SINGLE)),
        ("Peers (1 process, same server, same rounds)", list(bench_peers.SINGLE)),
    ]
    head = f"  {'':<40} {'calls/s':>9} {'spread':>15} {'client CPU':>11} {'server CPU':>11}"
    for title, kinds in groups:
        lines.append(title)
        lines.append(head)
        for kind in kinds:
            f = single.get(kind)
            cpu = ""
            if f and "median" in f:
                cpu = f"{f['client_cpu_us']:>11.1f} {f['server_cpu_us']:>11.1f}"
            lines.append(f"  {kind:<40} {_rate(f):>9} {_spread(f):>15} {cpu}")
        lines.append("")

    procs = results.get("processes", {})
    counts = [str(n) for n in s["processes"]]
    lines.append("Processes (calls/s summed over N processes; one breaker, one Redis; "
                 f"{m.get('nproc')} CPUs)")
    lines.append(f"  {'':<40} " + " ".join(f"{'N=' + n:>10}" for n in counts))
    for kind, by_n in procs.items():
        lines.append(f"  {kind:<40} " + " ".join(f"{_rate(by_n.get(n)):>10}" for n in counts))
    breaker = results.get("breaker", {})
    b_counts = list(breaker.get("processes", {}))
    if b_counts:
        lines.append(f"  breaker-guarded no-op ({breaker.get('source')}):")
        lines.append(f"  {'':<40} " + " ".join(f"{'N=' + n:>10}" for n in b_counts))
        kinds = list(next(iter(breaker["processes"].values())))
        for kind in kinds:
            row = " ".join(
                f"{_rate(breaker['processes'][n].get(kind)):>10}" for n in b_counts
            )
            lines.append(f"  {'  ' + kind:<40} {row}")
    contention = procs.get("contention: same keys (sync)", {})
    mixes = [
        f"N={n}: " + ", ".join(f"{k} {v:.0%}" for k, v in f.get("outcomes", {}).items())
        for n, f in contention.items() if "outcomes" in f
    ]
    if mixes:
        lines.append("  contention outcome mix: " + "; ".join(mixes))
    lines.append("")

    retry = results.get("retry", {})
    if "overhead_us" in retry:
        lines.append(
            "Retry overhead on a successful call (bench_retry; us per call over a bare call)"
        )
        for kind, f in retry["overhead_us"].items():
            lines.append(f"  {kind:<40} {f['median']:>9.3f} {f['min']:>7.3f}-{f['max']:.3f}")
        lines.append("")
    elif retry:
        lines.append(f"Retry overhead: {retry.get('skipped')}")
        lines.append("")

    if "http" in results:
        lines.append("HTTP: DurableIdempotencyMiddleware vs the bare app (bench_http; one "
                     "request at a time, in-process ASGI)")
        lines += bench_http.report(results["http"])
        lines.append("")

    if "lean" in results:
        lines += bench_lean.report_lines(results["lean"])
        lines.append("")

    cost = results.get("cost", {})
    lines.append("Cost per logical operation (round trips written by the client; Redis commands "
                 "executed, Lua's included; server CPU)")
    lines.append(
        f"  {'':<40} {'round trips':>11} {'commands':>9} {'in scripts us':>14} "
        f"{'server CPU us':>14}"
    )
    for kind, c in cost.get("per_operation", {}).items():
        if "skipped" in c:
            lines.append(f"  {kind:<40} skipped: {c['skipped']}")
            continue
        lines.append(
            f"  {kind:<40} {c['round_trips']:>11.2f} {c['commands']:>9.2f} "
            f"{c['script_us']:>14.1f} {c['server_cpu_us']:>14.1f}"
        )
    lines.append("Redis memory (MEMORY USAGE, bytes)")
    for kind, c in cost.get("memory", {}).items():
        if "skipped" in c:
            lines.append(f"  {kind:<40} skipped: {c['skipped']}")
            continue
        lines.append(f"  {kind:<40} {c['bytes']:>9,}  {c.get('what', '')}")
    lines.append("")

    lines.append("Targets (ratios measured in this run)")
    lines += _target_lines(results.get("targets", []))
    lines.append("Fleet-scale targets (issue 15's table and bars, measured in this run)")
    lines += _target_lines(results.get("fleet_targets", []))
    lines.append("  Cluster rows (2 round trips; >= 0.8 x standalone): "
                 "python -m benchmarks.bench_cluster")
    if results.get("floors"):
        lines.append(f"The floor of the durable call ('{RAW_SCRIPTS}', same rounds)")
        for name, value in results["floors"].items():
            lines.append(f"  {name:<72} {'-' if value is None else f'{value:.2f}':>8}")
    lines.append("Other ratios of this run")
    for name, value in results.get("ratios", {}).items():
        lines.append(f"  {name:<72} {'-' if value is None else f'{value:.2f}':>6}")
    for e in results.get("errors", []):
        lines.append(f"  error: {e}")
    return "\n".join(lines)


# --- the chart ------------------------------------------------------------------------------


def draw_chart(results: dict[str, Any], path: Path) -> bool:
    """Calls/s against the number of processes; ``False`` without matplotlib."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        results.setdefault("errors", []).append("no chart: matplotlib is not installed")
        return False
    series: dict[str, dict[str, dict[str, Any]]] = dict(results.get("processes", {}))
    for n, figs in results.get("breaker", {}).get("processes", {}).items():
        for kind in ("durabilis", "pybreaker"):
            if kind in figs:
                label = f"breaker-guarded no-op: {kind}"
                series.setdefault(label, {})[n] = figs[kind]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, by_n in series.items():
        points = sorted((int(n), f) for n, f in by_n.items() if "median" in f)
        if not points:
            continue
        xs = [p[0] for p in points]
        med = [p[1]["median"] for p in points]
        low = [p[1]["median"] - p[1]["min"] for p in points]
        high = [p[1]["max"] - p[1]["median"] for p in points]
        peer = label.startswith(("powertools", "breaker-guarded no-op: pybreaker"))
        floor = label == PING
        ax.errorbar(
            xs, med, yerr=[low, high], label=label, marker="o", capsize=3,
            linestyle=":" if floor else ("--" if peer else "-"),
        )
    m = results["meta"].get("machine", {})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([int(n) for n in results["meta"]["settings"]["processes"]])
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("processes")
    ax.set_ylabel("calls/s, summed over the processes (log)")
    ax.set_title(
        f"durabilis vs peers ({results['meta']['mode']} run): {m.get('nproc')} CPUs, "
        f"Python {m.get('python')}, redis-server {m.get('redis_server')}",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=(__doc__ or "").splitlines()[0]
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--quick", action="store_true", help="a short run (about 20 s) of every section"
    )
    group.add_argument("--smoke", action="store_true", help="the test suite's tiny run")
    parser.add_argument("--out", type=Path, default=None, help="write the results here instead")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "smoke" if args.smoke else "full"
    results = run_suite(MODES[mode], args.out)
    print(report(results))
    print()
    for what, path in results["paths"].items():
        print(f"{what}: {path}")
    return results
