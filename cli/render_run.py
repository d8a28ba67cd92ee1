"""Rich rendering of a ``run-report``: the run's figures, then one row per rank."""

from __future__ import annotations

import statistics

from rich.console import Group
from rich.table import Table

from dl_nfv.artifacts.runreport import CATEGORIES, RunReport

from .render_graph import _bytes


def render(report: RunReport) -> Group:
    head = Table(title=f"run of a {report.planner} plan ({report.mode.value}, "
                       f"{report.world_size} ranks, {report.backend})",
                 title_justify="left", show_header=False)
    head.add_column()
    head.add_column()
    head.add_row("plan", f"{report.plan_path or '-'} (sha256 {report.plan_sha256[:12]}...)")
    if report.model:
        head.add_row("model", f"{report.model}, batch {report.batch_size}")
    head.add_row("steps", f"{report.steps} ({report.warmup} warm-up)")
    head.add_row("iteration (median)", f"{report.iteration_ms:.3f} ms")
    if report.predicted_iteration_ms is not None:
        pred = report.predicted_iteration_ms
        err = (pred - report.iteration_ms) / report.iteration_ms if report.iteration_ms else 0.0
        head.add_row("planner's prediction", f"{pred:.3f} ms ({err:+.1%})")
    if report.losses:
        head.add_row("loss first / last", f"{report.losses[0]:.5g} / {report.losses[-1]:.5g}")
    if report.trace_path:
        head.add_row("trace", report.trace_path)
    for note in report.notes:
        head.add_row("note", note)
    ranks = Table(title="ranks", title_justify="left")
    cols = ["rank", "device", "host", "threads", "median ms", "compute ms", "wait ms", "cpu ms",
            "peak memory"]
    sent = any(r.sent_bytes for r in report.per_rank)
    if sent:
        cols.append("gradient bytes sent")
    for col in cols:
        ranks.add_column(col, justify="right" if col.endswith(("ms", "memory", "sent")) else "left")
    for r in sorted(report.per_rank, key=lambda r: r.rank):
        measured = r.iteration_ms[report.warmup:]
        cells = [str(r.rank), r.device, r.host or "-",
                 _threads(report.threads if r.threads is None else r.threads, r.cpus),
                 f"{statistics.median(measured):.3f}", f"{r.compute_ms:.3f}", f"{r.wait_ms:.3f}",
                 "-" if r.cpu_ms is None else f"{r.cpu_ms:.3f}", _bytes(r.peak_memory_bytes)]
        if sent:
            cells.append(_sent(r.sent_bytes))
        ranks.add_row(*cells)
    parts = [head, ranks]
    if any(r.breakdown_ms for r in report.per_rank):
        parts.append(_breakdown(report))
    return Group(*parts)


def _breakdown(report: RunReport) -> Table:
    """Per rank, the median over measured steps of each category of its timeline."""
    table = Table(title="where each rank's step goes (median ms over measured steps)",
                  title_justify="left")
    table.add_column("rank")
    table.add_column("device")
    for category in CATEGORIES:
        table.add_column(category, justify="right")
    for r in sorted(report.per_rank, key=lambda r: r.rank):
        if not r.breakdown_ms:
            continue
        table.add_row(str(r.rank), r.device, *(
            f"{statistics.median(r.breakdown_ms[c][report.warmup:]):.3f}"
            if c in r.breakdown_ms else "-" for c in CATEGORIES))
    return table


def _sent(sent_bytes: dict[str, int]) -> str:
    """``12.0 MiB (allreduce 8.0 MiB, sfb 4.0 MiB)``: a rank's last step, by method."""
    if not sent_bytes:
        return "-"
    total = _bytes(sum(sent_bytes.values()))
    if len(sent_bytes) == 1:
        (method, n), = sent_bytes.items()
        return f"{total} ({method})"
    return f"{total} (" + ", ".join(f"{m} {_bytes(n)}" for m, n in sorted(sent_bytes.items())) + ")"


def _threads(threads: int, cpus: tuple[int, ...]) -> str:
    """``2 @0-1`` (two threads pinned to CPUs 0 and 1), ``1 @3``, ``2`` (not pinned)."""
    if not cpus:
        return str(threads)
    if len(cpus) > 1 and list(cpus) == list(range(cpus[0], cpus[-1] + 1)):
        return f"{threads} @{cpus[0]}-{cpus[-1]}"
    return f"{threads} @{','.join(map(str, cpus))}"
