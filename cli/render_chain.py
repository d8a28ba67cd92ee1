"""Rich rendering of ``chain-report`` and ``chain-bench`` (``dl-nfv nfv chain``)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from dl_nfv.artifacts.chainreport import ChainBench, ChainReport


def _drops(dropped: dict[str, int]) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in sorted(dropped.items())) or "-"


def render_report(report: ChainReport) -> Group:
    head = Table(title=f"chain-report: {report.config} on {report.trace} with {report.engine} "
                       f"({report.device}, batches of {report.batch_size})",
                 title_justify="left")
    for col in ("packets in", "out", "Mpps", "Gbps", "batches", "p50 ms", "p90 ms", "p99 ms"):
        head.add_column(col, justify="right")
    lat = report.latency
    head.add_row(str(report.packets_in), str(report.packets_out), f"{report.mpps:.3f}",
                 f"{report.gbps:.3f}", str(report.batches), f"{lat.p50_ms:.2f}",
                 f"{lat.p90_ms:.2f}", f"{lat.p99_ms:.2f}")
    if report.ingress_dropped:
        head.caption = f"not forwarded at ingress: {_drops(report.ingress_dropped)}"
    stages = Table(title="stages", title_justify="left")
    for col, justify in (("nf", "left"), ("in", "right"), ("out", "right"),
                         ("dropped", "left"), ("time s", "right")):
        stages.add_column(col, justify=justify)
    for s in report.stages:
        stages.add_row(s.nf, str(s.packets_in), str(s.packets_out), _drops(s.dropped),
                       f"{s.time_s:.4f}")
    parts = [head, stages]
    if report.nat is not None:
        nat = report.nat
        parts.append(f"NAT: {nat.translations} translations, {nat.exhausted} flows found the "
                     f"pool empty; {nat.in_use}/{nat.pool_size} bindings in use "
                     f"(peak {nat.peak_in_use})")
    if report.lb:
        lb = Table(title="LB flows per backend", title_justify="left")
        lb.add_column("backend")
        lb.add_column("flows", justify="right")
        for name, flows in report.lb.items():
            lb.add_row(name, str(flows))
        parts.append(lb)
    if report.monitor is not None:
        m = report.monitor
        parts.append(f"monitor: {m.flows} flows held ({m.packets} packets, {m.bytes} bytes), "
                     f"{m.exported} exported when idle")
    if report.written is not None:
        parts.append(f"wrote {report.written} packets")
    return Group(*parts)


def render_bench(bench: ChainBench) -> Group:
    table = Table(title=f"chain-bench: {bench.config} on {bench.trace} ({bench.packets} packets)",
                  title_justify="left")
    for col in ("engine", "device", "batch", "Mpps", "Gbps", "p50 ms", "p99 ms", "out"):
        table.add_column(col, justify="left" if col in ("engine", "device") else "right")
    for r in bench.rows:
        table.add_row(r.engine, r.device, str(r.batch_size), f"{r.mpps:.3f}", f"{r.gbps:.3f}",
                      f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", str(r.packets_out))
    return Group(table)
