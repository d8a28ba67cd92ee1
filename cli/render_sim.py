"""Rich rendering of a ``sim-report``: summary, devices, busiest links, critical path."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from dl_nfv.artifacts.simreport import SimReport

from .render_graph import _bytes

TOP_LINKS = 10
TOP_STEPS = 20


def render(report: SimReport) -> Group:
    head = Table(title=f"simulated iteration of a {report.planner} plan for {report.model or '?'} "
                       f"on {report.topology or '?'}", title_justify="left", show_header=False)
    head.add_column()
    head.add_column()
    head.add_row("iteration", f"{report.iteration_ms:.3f} ms")
    if report.planner_prediction_ms is not None:
        head.add_row("planner's prediction", f"{report.planner_prediction_ms:.3f} ms")
    head.add_row("longest dependency chain", f"{report.critical_path_ms:.3f} ms")
    head.add_row("memory", "fits" if report.feasible else
                 f"[bold red]overflows on {len(report.overflows)} device(s)[/]")
    head.add_row("tasks", f"{report.tasks} ({report.compute_tasks} compute, {report.transfers} "
                          f"transfers, {report.collectives} collectives)")
    head.add_row("compute / communication", f"{report.compute_ms:.3f} / {report.comm_ms:.3f} ms "
                                            f"(summed over tasks)")
    head.add_row("communication hidden", f"{100 * report.comm_hidden_fraction:.1f}%")
    if report.microbatches > 1:
        head.add_row("microbatches", str(report.microbatches))
    for note in report.notes:
        head.add_row("note", note)
    parts = [head]
    if report.comparison is not None:
        c = report.comparison
        cmp_table = Table(title=f"measured run {c.run_report}", title_justify="left",
                          show_header=False)
        cmp_table.add_column()
        cmp_table.add_column()
        cmp_table.add_row("measured iteration", f"{c.measured_iteration_ms:.3f} ms ({c.steps} steps)")
        cmp_table.add_row("predicted iteration", f"{c.predicted_iteration_ms:.3f} ms")
        cmp_table.add_row("prediction error", f"{100 * c.error_fraction:+.1f}%")
        parts.append(cmp_table)
        parts.append(_per_device(report))
        if c.measured_breakdown_ms_by_device:
            parts.append(_breakdown(c))
    devices = Table(title="devices", title_justify="left")
    for col in ("device", "type", "busy ms", "busy", "idle", "comm ms", "hidden", "peak memory",
                "capacity"):
        devices.add_column(col, justify="left" if col in ("device", "type") else "right")
    for d in report.devices:
        devices.add_row(d.device, d.type, f"{d.busy_ms:.3f}", f"{100 * d.busy_fraction:.0f}%",
                        f"{100 * d.idle_fraction:.0f}%", f"{d.comm_ms:.3f}",
                        f"{100 * d.hidden_comm_ms / d.comm_ms:.0f}%" if d.comm_ms else "-",
                        _bytes(d.peak_memory_bytes), _bytes(d.memory_bytes),
                        style="red" if d.peak_memory_bytes > d.memory_bytes else None)
    parts.append(devices)
    if report.overflows:
        over = Table(title="memory overflows", title_justify="left")
        for col in ("device", "at ms", "short by"):
            over.add_column(col)
        for o in report.overflows:
            over.add_row(o.device, f"{o.time_ms:.3f}", _bytes(o.shortfall_bytes))
        parts.append(over)
    if report.links:
        links = Table(title=f"busiest links (of {len(report.links)})", title_justify="left")
        for col in ("link", "Gbps", "busy ms", "busy", "transfer bytes", "collective bytes"):
            links.add_column(col, justify="left" if col == "link" else "right")
        for lk in report.links[:TOP_LINKS]:
            links.add_row(f"{lk.src} -> {lk.dst}", f"{lk.bandwidth_gbps:g}", f"{lk.busy_ms:.3f}",
                          f"{100 * lk.busy_fraction:.0f}%", _bytes(lk.transfer_bytes),
                          _bytes(lk.collective_bytes))
        parts.append(links)
    if report.critical_path:
        steps = report.critical_path
        path = Table(title=f"critical path ({len(steps)} steps"
                           f"{f', first {TOP_STEPS} by duration' if len(steps) > TOP_STEPS else ''})",
                     title_justify="left")
        for col in ("start ms", "ms", "kind", "where", "tasks"):
            path.add_column(col, justify="right" if "ms" in col or col == "tasks" else "left")
        shown = sorted(steps, key=lambda c: c.start_ms - c.end_ms)[:TOP_STEPS]
        for c in sorted(shown, key=lambda c: c.start_ms):
            path.add_row(f"{c.start_ms:.3f}", f"{c.end_ms - c.start_ms:.3f}", c.kind, c.where,
                         f"{c.tasks}  {c.name}")
        parts.append(path)
    return Group(*parts)


def _pair(predicted: float | None, measured: float | None) -> str:
    """``predicted / measured (error)`` in ms; ``-`` for a side that is missing."""
    if measured is None:
        return "-" if predicted is None else f"{predicted:.1f} / -"
    if predicted is None:
        return f"- / {measured:.1f}"
    error = f" ({100 * (predicted / measured - 1):+.0f}%)" if measured > 0 else ""
    return f"{predicted:.1f} / {measured:.1f}{error}"


def _per_device(report: SimReport) -> Table:
    """Per device, predicted beside measured: the step, the compute, the time not computing
    (the run's time blocked in communication), and the CPU time of a CPU's worker (compute
    plus the transfers and collectives its cores do)."""
    c = report.comparison
    table = Table(title="per device: predicted / measured ms (prediction error)",
                  title_justify="left")
    for col in ("device", "step", "compute", "not computing (waiting)", "CPU time"):
        table.add_column(col, justify="left" if col == "device" else "right")
    it = report.iteration_ms
    for d in report.devices:
        if d.device not in c.measured_ms_by_device:
            continue
        cpu = d.busy_ms + d.comm_ms if d.host_driven else None
        table.add_row(d.device, _pair(it, c.measured_ms_by_device.get(d.device)),
                      _pair(d.busy_ms, c.measured_compute_ms_by_device.get(d.device)),
                      _pair(it - d.busy_ms, c.measured_wait_ms_by_device.get(d.device)),
                      _pair(cpu, c.measured_cpu_ms_by_device.get(d.device)))
    return table


CATEGORIES = ("compute", "communication", "update", "idle")


def _breakdown(c) -> Table:
    """Per device, where the step goes: each category predicted beside measured (the run's
    median over its measured steps, from its timeline)."""
    table = Table(title="where the time goes per device: predicted / measured ms "
                        "(prediction error)", title_justify="left")
    table.add_column("device")
    for col in CATEGORIES:
        table.add_column(col, justify="right")
    for device, measured in sorted(c.measured_breakdown_ms_by_device.items()):
        predicted = c.predicted_breakdown_ms_by_device.get(device, {})
        table.add_row(device, *(_pair(predicted.get(k), measured.get(k)) for k in CATEGORIES))
    return table
