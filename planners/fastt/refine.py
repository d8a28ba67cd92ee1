"""FastT's profile-measure-replan loop, offline: op costs refined by a ``run-report``.

What a run report can refine, and how (everything else keeps its profiled cost):

* **Per-op times** (``op_fwd_ms`` / ``op_bwd_ms``, by device type): they
  replace the graph's times for that device type. A time measured on a replica
  that held a share ``f`` of the batch is brought back to the full batch with
  the cost model's own scaling (the op's fixed part, the rest linear in
  ``f``) when the report's plan can be read; otherwise it is taken as a
  full-batch time.
* **Per-rank compute time** (``compute_ms``, always present): for each device
  type of the run, the ratio of measured compute time to the compute time the
  simulator predicts for that rank under the report's plan (median over the
  ranks of the type) scales every op's forward and backward time on that type
  that has no per-op measurement. This needs the report's plan
  (``plan_path``) and the graph and topology it names.
* **Transfers are not refined**: a run report holds each rank's total wait
  time, which mixes transfers with waiting for peers, and no per-pair
  transfer measurements, so there is nothing to fit a per-pair model to.

The result is a copy of the op graph whose measured times are the refined
ones; a ``CostModel`` built on it takes them with precedence, as it does any
measurement. Plans keep the fingerprint of the original graph.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from dl_nfv.artifacts import ArtifactMismatch, BadInput, OpGraph, Plan, Topology, fingerprint, load
from dl_nfv.simulator.costs import CostModel


@dataclass(frozen=True, kw_only=True, slots=True)
class OpTimes:
    """Every op's times being refined, by op id then device type: forward and backward ms,
    and their measured batch-independent parts (scaled with their op, never above its time)."""

    fwd: dict[str, dict[str, float]]
    bwd: dict[str, dict[str, float]]
    fwd_fixed: dict[str, dict[str, float]]
    bwd_fixed: dict[str, dict[str, float]]

    @classmethod
    def of(cls, graph: OpGraph) -> OpTimes:
        return cls(fwd={op.id: dict(op.fwd_ms) for op in graph.ops},
                   bwd={op.id: dict(op.bwd_ms) for op in graph.ops},
                   fwd_fixed={op.id: dict(op.fwd_fixed_ms) for op in graph.ops},
                   bwd_fixed={op.id: dict(op.bwd_fixed_ms) for op in graph.ops})


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportRun:
    """The plan a run report ran, the graph and topology it names, and their cost model."""

    plan: Plan
    graph: OpGraph
    topology: Topology
    cost_model: CostModel


def refined_graph(graph: OpGraph, topology: Topology, report_path: str) -> tuple[OpGraph, list[str]]:
    """The op graph with the costs measured in the run report at ``report_path``.

    Returns the refined graph and notes saying exactly what was refined.

    Raises
    ------
    BadInput
        The report cannot be read, was made for another graph, or holds
        nothing usable (no per-op times and no readable plan).

    Complexity: O(ops x device types) plus one simulation of the report's plan.
    """
    report = load(report_path, expect="run-report")
    if report.graph_sha256 and report.graph_sha256 != fingerprint(graph):
        raise ArtifactMismatch(
            f"{report_path}: the run report measured a plan for a graph with sha256 "
            f"{report.graph_sha256[:12]}..., but this graph has sha256 {fingerprint(graph)[:12]}...")
    run = _report_plan(report, Path(report_path))
    times = OpTimes.of(graph)
    measured, notes = _measured_times(report, times, run)
    if run is not None:
        notes += _scale_by_compute(report, graph, times, measured, run)
    elif not measured:
        raise BadInput(f"{report_path}: the run report holds no per-op times and its plan "
                       f"{report.plan_path or '(no plan_path)'!r} cannot be read, so there is "
                       f"nothing to refine the costs with")
    notes.append("transfer costs not refined (the run report holds no per-pair transfer times)")
    ops = tuple(replace(op, fwd_ms=times.fwd[op.id], bwd_ms=times.bwd[op.id],
                        fwd_fixed_ms=_capped(times.fwd_fixed[op.id], times.fwd[op.id]),
                        bwd_fixed_ms=_capped(times.bwd_fixed[op.id], times.bwd[op.id]),
                        tie_sum_ms=_capped(dict(op.tie_sum_ms), times.bwd[op.id]))
                for op in graph.ops)
    return replace(graph, ops=ops), notes


def _measured_times(report, times: OpTimes, run: ReportRun | None
                    ) -> tuple[set[tuple[str, str]], list[str]]:
    """Replace ``times`` by the report's per-op measurements, brought back to the full batch
    from the run's batch shares when its plan is readable; returns the (device type, op)
    pairs measured and a note per phase and device type."""
    shares = _shares_by_type(run.plan, run.topology) if run is not None else {}
    run_cm = run.cost_model if run is not None else None
    measured: set[tuple[str, str]] = set()
    notes: list[str] = []
    for table, target, phase in ((report.op_fwd_ms, times.fwd, "forward"),
                                 (report.op_bwd_ms, times.bwd, "backward")):
        for dtype, by_op in table.items():
            count = 0
            for op_id, ms in by_op.items():
                if op_id not in target:
                    continue
                share = shares.get((dtype, op_id), 1.0)
                target[op_id][dtype] = _full_batch(ms, share, _fixed_ms(run_cm, dtype, op_id, phase))
                measured.add((dtype, op_id))
                count += 1
            if count:
                basis = "rescaled from the run's batch shares" if shares else "taken as full-batch"
                notes.append(f"{phase} times of {count} ops on {dtype} replaced by the run's "
                             f"measurements ({basis})")
    return measured, notes


def _scale_by_compute(report, graph: OpGraph, times: OpTimes, measured: set[tuple[str, str]],
                      run: ReportRun) -> list[str]:
    """Scale the times of every op not measured on a device type by that type's measured
    over simulated compute time (median over its ranks); returns a note per type."""
    from dl_nfv.simulator import simulate

    run_cm = run.cost_model
    sim = simulate(run.plan, run.graph, run.topology, cost_model=run_cm, check_fingerprints=False)
    ratios: dict[str, list[float]] = {}
    for r in report.per_rank:
        predicted = sim.busy_ms.get(r.device, 0.0)
        if predicted > 0 and r.compute_ms > 0:
            dtype = run_cm.cluster.device(r.device).type.name
            ratios.setdefault(dtype, []).append(r.compute_ms / predicted)
    notes = []
    for dtype, values in sorted(ratios.items()):
        factor = statistics.median(values)
        j = run_cm.type_index[dtype]
        scaled = 0
        for i, op in enumerate(graph.ops):
            if (dtype, op.id) in measured:
                continue
            times.fwd[op.id][dtype] = float(run_cm.fwd_ms_by_type[i, j]) * factor
            if dtype in times.fwd_fixed[op.id]:
                times.fwd_fixed[op.id][dtype] *= factor
            if run_cm.bwd_ms_by_type[i, j] > 0:
                times.bwd[op.id][dtype] = float(run_cm.bwd_ms_by_type[i, j]) * factor
                if dtype in times.bwd_fixed[op.id]:
                    times.bwd_fixed[op.id][dtype] *= factor
            scaled += 1
        notes.append(f"compute on {dtype} scaled by {factor:.3f} (measured / simulated compute "
                     f"time, median of {len(values)} ranks) for {scaled} ops")
    return notes


def _report_plan(report, report_path: Path) -> ReportRun | None:
    """The plan the report ran, with its graph and topology; None if unreadable."""
    if not report.plan_path:
        return None
    for base in (report_path.parent, Path.cwd()):
        path = base / report.plan_path
        if not path.is_file():
            continue
        plan = load(path, expect="plan")
        if fingerprint(plan) != report.plan_sha256:
            raise ArtifactMismatch(f"{report_path}: plan {str(path)!r} has sha256 "
                                   f"{fingerprint(plan)[:12]}..., but the report ran "
                                   f"{report.plan_sha256[:12]}...")
        try:
            graph = load(path.parent / plan.graph_path, expect="op-graph")
            topology = load(path.parent / plan.topology_path, expect="topology")
        except (BadInput, OSError, TypeError):
            return None
        return ReportRun(plan=plan, graph=graph, topology=topology,
                         cost_model=CostModel(graph, topology))
    return None


def _shares_by_type(plan, topology) -> dict[tuple[str, str], float]:
    from dl_nfv.artifacts import cluster_of

    cluster = cluster_of(topology)
    out: dict[tuple[str, str], float] = {}
    for g in plan.groups:
        for device, share in zip(g.devices, g.shares):
            dtype = cluster.device(device).type.name
            for op in g.ops:
                out.setdefault((dtype, op), share)
    return out


def _fixed_ms(cm: CostModel | None, dtype: str, op_id: str, phase: str) -> float:
    """The batch-independent part of an op's time in the cost model (0 when unknown)."""
    if cm is None or dtype not in cm.type_index or op_id not in cm.op_index:
        return 0.0
    table = cm.fwd_fixed_by_type if phase == "forward" else cm.bwd_fixed_by_type
    return float(table[cm.op_index[op_id], cm.type_index[dtype]])


def _capped(fixed: dict[str, float], full: dict[str, float]) -> dict[str, float]:
    return {k: min(v, full[k]) for k, v in fixed.items() if k in full}


def _full_batch(ms: float, share: float, fixed_ms: float) -> float:
    """Invert the cost model's batch scaling: a time at ``share`` of the batch -> full batch."""
    if share >= 1.0 or ms <= fixed_ms:
        return ms
    return fixed_ms + (ms - fixed_ms) / share
