"""Rich tables of result tables and traces: ``plan-comparison``, ``nfv-bench``,
``network-probe``, a Chrome trace's summary."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from dl_nfv.artifacts.chrome_trace import TraceSummary
from dl_nfv.artifacts.results import NetworkProbe, NfvBench, PlanComparison

GIB = 2**30


def _num(value, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, fmt) + suffix


def render_comparison(result: PlanComparison) -> Table:
    table = Table(title=f"{result.graph} on {result.topology} ({result.optimizer}, seed "
                        f"{result.seed})", title_justify="left")
    for col in ("planner", "stages", "microbatches", "iteration ms", "vs dp", "/ bound",
                "peak mem GiB", "plan s", "note"):
        table.add_column(col, justify="left" if col in ("planner", "note") else "right")
    for r in result.rows:
        if not r.feasible:
            table.add_row(r.planner, "", "", "", "", "", "", "", f"infeasible: {r.error}")
            continue
        peak = r.peak_memory_bytes
        table.add_row(r.planner, _num(r.stages, "d"), _num(r.microbatches, "d"),
                      _num(r.iteration_ms, ".2f"), _num(r.speedup_vs_dp, ".2f", "x"),
                      _num(r.ratio_to_bound, ".2f"),
                      _num(peak / GIB if peak is not None else None, ".2f"),
                      _num(r.plan_s, ".2f"), "")
    return table


def gpu_note(device: str, gpu_share: float) -> str:
    """What to say about where the tensor ("GPU") path ran: nothing on a GPU."""
    if device.startswith("cuda") or gpu_share == 0:
        return ""
    return f"no GPU used: the GPU path ran on {device}"


def render_bench(result: NfvBench) -> Group:
    table = Table(title=f"engines on {result.trace} ({result.flows} flows, {result.messages} "
                        f"messages); NF outputs identical: {result.outputs_identical}",
                  title_justify="left")
    for col in ("engine", "Gbps", "messages/s", "GPU share", "batches", "device", "workers",
                "alerts", "note"):
        table.add_column(col, justify="left" if col in ("engine", "note") else "right")
    for e in result.engines:
        table.add_row(e.engine, f"{e.gbps:.3f}", f"{e.messages_per_s:,.0f}",
                      f"{e.gpu_message_share:.0%}", str(e.batches), e.device, str(e.workers),
                      str(e.alerts), gpu_note(e.device, e.gpu_message_share))
    return Group(table)


def render_trace(summary: TraceSummary, name: str) -> Table:
    table = Table(title=f"trace {name}: {summary.events} events on {len(summary.tracks)} tracks "
                        f"over {summary.span_ms:,.3f} ms ({summary.start_ms:,.3f} to "
                        f"{summary.end_ms:,.3f} ms)", title_justify="left")
    for col in ("process", "thread", "events", "busy ms", "first ms", "last ms"):
        table.add_column(col, justify="left" if col in ("process", "thread") else "right")
    for t in summary.tracks:
        table.add_row(t.process, t.thread, str(t.events), f"{t.busy_ms:,.3f}",
                      f"{t.first_ms:,.3f}", f"{t.last_ms:,.3f}")
    return table


def render_probe(probe: NetworkProbe) -> Group:
    ranks = Table(title=f"network probe: {probe.world_size} ranks over {probe.backend}",
                  title_justify="left")
    for col in ("rank", "host", "device", "matmul GFLOP/s", "memory GB/s"):
        ranks.add_column(col, justify="left" if col in ("host", "device") else "right")
    for r in range(probe.world_size):
        ranks.add_row(str(r), probe.hosts[r], probe.devices[r],
                      _num(_at(probe.matmul_gflops, r), ",.1f"),
                      _num(_at(probe.memory_gb_per_s, r), ",.2f"))
    pairs = Table(title="point-to-point fits (latency + size / bandwidth)", title_justify="left")
    for col in ("ranks", "latency us", "bandwidth Gbps"):
        pairs.add_column(col, justify="left" if col == "ranks" else "right")
    for pair, fit in probe.fits.items():
        pairs.add_row(pair, _num(fit.get("latency_us"), ",.1f"), _num(fit.get("bandwidth_gbps"), ",.3f"))
    sizes = Table(title="one-way and AllReduce time per message size (ms)", title_justify="left")
    sizes.add_column("bytes", justify="right")
    for pair in probe.p2p_one_way_s:
        sizes.add_column(f"ranks {pair}", justify="right")
    sizes.add_column("AllReduce", justify="right")
    for i, size in enumerate(probe.sizes_bytes):
        sizes.add_row(f"{size:,}", *(_num(t[i] * 1e3, ".3f") for t in probe.p2p_one_way_s.values()),
                      _num(_at(probe.allreduce_s, i, 1e3), ".3f"))
    return Group(ranks, pairs, sizes)


def _at(values: tuple[float, ...], i: int, scale: float = 1.0) -> float | None:
    return values[i] * scale if i < len(values) else None
