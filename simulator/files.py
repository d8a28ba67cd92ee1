"""Simulating plans named by file: find the graph and topology a plan was made for, compare runs.

``simulate_files`` is what ``dl-nfv simulate`` calls: it loads the plan, finds
its graph and topology (the ``--graph``/``--topology`` paths, else the paths the
plan recorded, relative to the plan file's folder when relative), checks the
fingerprints, simulates, and optionally sets a measured ``run-report`` beside
the prediction.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from dl_nfv.artifacts import ArtifactMismatch, BadInput, OpGraph, Plan, Topology, fingerprint, load
from dl_nfv.artifacts.simreport import Comparison, SimReport

from . import SimResult, simulate
from .extrapolation import extrapolation_notes


def artifact_path(plan: Plan, plan_path: str | Path, what: str, given: str | Path | None) -> Path:
    """Where to read the plan's ``what`` ("graph" or "topology") from.

    ``given`` wins; otherwise the path the plan recorded, taken relative to the
    plan file's folder when relative (and relative to the working folder when
    that file does not exist there). Raises ``BadInput`` when neither exists.
    """
    if given is not None:
        return Path(given)
    recorded = plan.graph_path if what == "graph" else plan.topology_path
    if not recorded:
        raise BadInput(f"{plan_path}: the plan records no {what} path; pass --{what} FILE")
    path = Path(recorded)
    if path.is_absolute():
        candidates = [path]
    else:
        candidates = [Path(plan_path).parent / path, path]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise BadInput(f"{plan_path}: {what}_path {recorded!r} does not exist (looked in "
                   f"{', '.join(str(c) for c in candidates)}); pass --{what} FILE")


def plan_artifacts(plan_path: str | Path, graph: str | Path | None = None,
                   topology: str | Path | None = None) -> tuple[Plan, OpGraph, Topology, Path, Path]:
    """The plan at ``plan_path``, the graph and topology it was made for (``graph`` and
    ``topology`` if given, else found by ``artifact_path``) and their paths.

    Raises ``ArtifactMismatch`` (exit 2) naming the file whose sha256 differs from the one
    the plan records.
    """
    plan = load(plan_path, expect="plan")
    graph_path = artifact_path(plan, plan_path, "graph", graph)
    topology_path = artifact_path(plan, plan_path, "topology", topology)
    graph_doc = load(graph_path, expect="op-graph")
    topology_doc = load(topology_path, expect="topology")
    for what, path, doc, recorded in (("graph", graph_path, graph_doc, plan.graph_sha256),
                                      ("topology", topology_path, topology_doc,
                                       plan.topology_sha256)):
        actual = fingerprint(doc)
        if actual != recorded:
            raise ArtifactMismatch(
                f"{path}: this {what} has sha256 {actual[:12]}..., but plan {plan_path} was made "
                f"for sha256 {recorded[:12]}...; re-plan, or pass the {what} it was made for")
    return plan, graph_doc, topology_doc, graph_path, topology_path


def simulate_files(plan_path: str | Path, *, graph: str | Path | None = None,
                   topology: str | Path | None = None,
                   compare: str | Path | None = None) -> tuple[SimResult, SimReport]:
    """Load the plan at ``plan_path`` and its artifacts, simulate, and report.

    Returns the result (for the trace) and its report, with a ``comparison``
    when ``compare`` names a ``run-report``. Raises ``ArtifactMismatch`` (exit 2)
    naming the file whose fingerprint differs from the plan's, or a run report
    of another plan.
    """
    plan, graph_doc, topology_doc, _, _ = plan_artifacts(plan_path, graph, topology)
    result = simulate(plan, graph_doc, topology_doc, check_fingerprints=False)
    report = result.to_report()
    notes = extrapolation_notes(plan.devices, graph_doc, topology_doc)
    if notes:
        report = replace(report, notes=(*report.notes, *notes))
    if compare is not None:
        report = compare_with_run(report, result, compare)
    return result, report


def compare_with_run(report: SimReport, result: SimResult, run_path: str | Path) -> SimReport:
    """``report`` with the measured run at ``run_path`` (a ``run-report``) beside it.

    The measured figure is the run's ``iteration_ms`` (median over measured
    steps of the slowest rank); per device, the median of that rank's measured
    steps, and its compute, wait and CPU time as the run recorded them. Raises
    ``ArtifactMismatch`` when the run executed another plan (``check_same_plan``).
    """
    run = load(run_path, expect="run-report")
    check_same_plan(run, report, run_path)
    measured = {}
    for rank in run.per_rank:
        steps = rank.iteration_ms[run.warmup:] or rank.iteration_ms
        measured[rank.device] = round(statistics.median(steps), 6)
    predicted = report.iteration_ms
    error = predicted / run.iteration_ms - 1.0 if run.iteration_ms > 0 else 0.0
    comparison = Comparison(
        run_report=str(run_path), measured_iteration_ms=run.iteration_ms,
        predicted_iteration_ms=predicted, error_fraction=round(error, 6),
        steps=run.steps - run.warmup, measured_ms_by_device=measured,
        predicted_busy_ms_by_device={d: round(b, 6) for d, b in result.busy_ms.items()},
        measured_compute_ms_by_device={r.device: r.compute_ms for r in run.per_rank},
        measured_wait_ms_by_device={r.device: r.wait_ms for r in run.per_rank},
        measured_cpu_ms_by_device={r.device: r.cpu_ms for r in run.per_rank
                                   if r.cpu_ms is not None},
        predicted_breakdown_ms_by_device={
            d: {c: round(ms, 6) for c, ms in parts.items()}
            for d, parts in result.breakdown_ms().items() if d in measured},
        measured_breakdown_ms_by_device={
            r.device: {c: round(statistics.median(times[run.warmup:] or times), 6)
                       for c, times in r.breakdown_ms.items()}
            for r in run.per_rank if r.breakdown_ms})
    return replace(report, comparison=comparison)


def check_same_plan(run, report: SimReport, run_path: str | Path) -> None:
    """Refuse a run of another plan, naming what differs: the graph the run's plan was made
    for (its model too where the names differ), else its topology, else the plan itself.

    Raises ``ArtifactMismatch`` (exit 2) with one line.
    """
    def short(sha: str) -> str:
        return f"sha256 {sha[:12]}..."

    if run.graph_sha256 and run.graph_sha256 != report.graph_sha256:
        model = (f" ({run.model!r}, this plan's {report.model!r})"
                 if run.model and report.model and run.model != report.model else "")
        raise ArtifactMismatch(
            f"{run_path}: the run is of another graph{model}: its plan was made for graph "
            f"{short(run.graph_sha256)}, this plan for {short(report.graph_sha256)}")
    if run.topology_sha256 and run.topology_sha256 != report.topology_sha256:
        raise ArtifactMismatch(
            f"{run_path}: the run is on another topology: its plan was made for topology "
            f"{short(run.topology_sha256)}, this plan for {short(report.topology_sha256)}")
    if run.plan_sha256 != report.plan_sha256:
        same = " (same graph and topology)" if run.graph_sha256 and run.topology_sha256 else ""
        raise ArtifactMismatch(
            f"{run_path}: the run is of another plan: it executed a {run.planner} plan "
            f"{short(run.plan_sha256)}{same}, this is a {report.planner} plan "
            f"{short(report.plan_sha256)}")
