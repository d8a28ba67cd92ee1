"""Rich rendering of ``op-graph`` and ``plan`` artifacts, and a generic fallback."""

from __future__ import annotations

from rich.console import Group
from rich.pretty import Pretty
from rich.table import Table

from dl_nfv.artifacts import OpGraph, Plan
from dl_nfv.artifacts.records import to_data

TOP_OPS = 15


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def render_graph(graph: OpGraph) -> Group:
    m = graph.model
    device_types = sorted({t for op in graph.ops for t in op.fwd_ms})
    summary = Table(title=f"op graph {m.name} (batch {m.batch_size}, {m.dtype}, "
                          f"{graph.granularity.value} granularity)", title_justify="left",
                    show_header=False)
    summary.add_column()
    summary.add_column()
    summary.add_row("ops / edges", f"{len(graph.ops)} / {len(graph.edges)}")
    summary.add_row("forward GFLOPs", f"{sum(op.flops for op in graph.ops) / 1e9:.3f}")
    bwd_flops = sum(op.bwd_flops for op in graph.ops)
    if bwd_flops and all(op.bwd_input_flops is not None for op in graph.ops if op.bwd_flops):
        inputs = sum(op.bwd_input_flops or 0.0 for op in graph.ops)
        summary.add_row("backward GFLOPs", f"{bwd_flops / 1e9:.3f} ({inputs / bwd_flops:.0%} input "
                                           f"gradients, {1 - inputs / bwd_flops:.0%} weight gradients)")
    summary.add_row("parameters", _bytes(graph.total_param_bytes))
    summary.add_row("activations", _bytes(sum(op.output_bytes for op in graph.ops)))
    resident = sum(op.resident_bytes for op in graph.ops)
    if resident:
        summary.add_row("resident memory", _bytes(resident))
    if graph.colocation:
        sizes = sorted(len(g) for g in graph.colocation)
        summary.add_row("colocation groups", f"{len(sizes)} ({sum(sizes)} ops, largest {sizes[-1]})")
    for t in device_types:
        fwd = sum(op.fwd_ms.get(t, 0.0) for op in graph.ops)
        bwd = sum(op.bwd_ms.get(t, 0.0) for op in graph.ops)
        summary.add_row(f"measured on {t}", f"fwd {fwd:.2f} ms, bwd {bwd:.2f} ms")
    if graph.profile is not None:
        p = graph.profile
        heap = f", heap {p.allocator}" if p.allocator else ""
        summary.add_row("profiled", f"{p.device_type}, {p.threads} threads, {p.repeats} repeats{heap}")
        if p.step_ms and p.op_sum_ms:
            summary.add_row("op sum / step", f"{p.op_sum_ms:.1f} / {p.step_ms:.1f} ms "
                                             f"({p.op_sum_ms / p.step_ms:.2f})")
    ops = Table(title=f"top {TOP_OPS} ops by FLOPs", title_justify="left")
    for col in ("id", "name", "kind", "GFLOPs", "params", "output", *(f"fwd ms {t}" for t in device_types)):
        ops.add_column(col)
    for op in sorted(graph.ops, key=lambda o: -o.flops)[:TOP_OPS]:
        ops.add_row(op.id, op.name, op.kind.value, f"{op.flops / 1e9:.3f}", _bytes(op.param_bytes),
                    _bytes(op.output_bytes), *(f"{op.fwd_ms.get(t, 0):.3f}" for t in device_types))
    return Group(summary, ops)


def render_plan(plan: Plan) -> Group:
    head = Table(title=f"plan by {plan.planner} ({plan.status.value}, seed {plan.seed}, "
                       f"{plan.wall_time_s:.2f} s)", title_justify="left", show_header=False)
    head.add_column()
    head.add_column()
    head.add_row("batch size", str(plan.batch_size))
    head.add_row("groups", str(len(plan.groups)))
    head.add_row("devices", ", ".join(plan.devices))
    if plan.prediction is not None:
        head.add_row("predicted iteration", f"{plan.prediction.iteration_ms:.3f} ms")
    if plan.bound_ms is not None:
        head.add_row("lower bound", f"{plan.bound_ms:.3f} ms")
    if plan.pipeline is not None:
        head.add_row("pipeline", f"{len(plan.pipeline.stages)} stages, "
                                 f"{plan.pipeline.microbatches} microbatches, "
                                 f"{plan.pipeline.schedule_kind.value}")
    groups = Table(title="groups", title_justify="left")
    noted = any(g.note for g in plan.groups)
    for col in ("group", "ops", "devices", "shares", "sync", "compression", *(("note",) if noted else ())):
        groups.add_column(col)
    for g in plan.groups[:50]:
        groups.add_row(g.id, str(len(g.ops)), ", ".join(g.devices),
                       " ".join(f"{s:.2f}" for s in g.shares), g.sync.value, g.compression.value,
                       *((g.note,) if noted else ()))
    if len(plan.groups) > 50:
        groups.caption = f"first 50 of {len(plan.groups)} groups"
    parts = [head, groups]
    if plan.notes:
        notes = Table(title="planner notes", title_justify="left", show_header=False)
        notes.add_column()
        for line in plan.notes:
            notes.add_row(line)
        parts.append(notes)
    if plan.pipeline is not None and plan.pipeline.schedule:
        sched = Table(title="schedule", title_justify="left")
        sched.add_column("device")
        sched.add_column("actions")
        for device, text in plan.pipeline.schedule.items():
            sched.add_row(device, text)
        parts.append(sched)
    return Group(*parts)


def render_generic(artifact) -> Pretty:
    return Pretty(to_data(artifact))
