"""Assemble the ``run-report`` from what every rank measured."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from dl_nfv.artifacts import OpGraph, Plan, fingerprint
from dl_nfv.artifacts.runreport import (
    ExecutionMode,
    RankRun,
    RunReport,
    TimelineSpan,
    median_iteration_ms,
)


def build_report(*, plan: Plan, plan_path: str, graph: OpGraph, mode: ExecutionMode,
                 results: Sequence[dict[str, Any]], losses: Sequence[float], backend: str,
                 steps: int, warmup: int, trace: str = "",
                 notes: Sequence[str] = ()) -> RunReport:
    """The run report of ``plan`` from the per-rank ``results`` (gathered on rank 0).

    Each result holds ``rank``, ``device``, ``host``, ``iteration_ms`` (every
    step), ``compute_ms``/``wait_ms`` (medians over measured steps),
    ``peak_memory_bytes``, ``device_type``, ``threads`` and ``cpus`` (what the worker
    ran with), ``breakdown_ms`` (category -> every step's time), ``spans`` (measured step ->
    its start in ms on the host's monotonic clock and its spans) and ``op_ms`` (``{"F"|"B": {op:
    ms}}``, placement mode only). Per-op times are merged by device type (the
    median over the devices of a type that ran the op).
    """
    per_rank = tuple(sorted((RankRun(rank=r["rank"], device=r["device"], host=r.get("host", ""),
                                     iteration_ms=tuple(round(t, 4) for t in r["iteration_ms"]),
                                     compute_ms=round(max(r["compute_ms"], 0.0), 4),
                                     wait_ms=round(max(r["wait_ms"], 0.0), 4),
                                     peak_memory_bytes=int(r["peak_memory_bytes"]),
                                     cpu_ms=round(r["cpu_ms"], 4) if "cpu_ms" in r else None,
                                     threads=r.get("threads"), cpus=tuple(r.get("cpus", ())),
                                     breakdown_ms={c: tuple(v) for c, v in
                                                   r.get("breakdown_ms", {}).items()},
                                     sent_bytes=dict(r.get("sent_bytes", {})))
                             for r in results), key=lambda r: r.rank))
    op_fwd: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    op_bwd: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        for phase, table in (r.get("op_ms") or {}).items():
            target = op_fwd if phase == "F" else op_bwd
            for op, ms in table.items():
                target[r["device_type"]][op].append(ms)
    return RunReport(
        plan_sha256=fingerprint(plan), planner=plan.planner, plan_path=str(plan_path),
        graph_sha256=plan.graph_sha256, topology_sha256=plan.topology_sha256,
        model=graph.model.name, mode=mode, batch_size=plan.batch_size, world_size=len(per_rank),
        ranks={r.device: r.rank for r in per_rank}, backend=backend,
        threads=max((r.threads or 1) for r in per_rank),
        steps=steps, warmup=warmup, iteration_ms=round(median_iteration_ms(per_rank, warmup), 4),
        losses=tuple(float(x) for x in losses), per_rank=per_rank,
        predicted_iteration_ms=plan.prediction.iteration_ms if plan.prediction else None,
        op_fwd_ms=_medians(op_fwd), op_bwd_ms=_medians(op_bwd), trace_path=trace,
        notes=tuple(notes), **_timeline(results, per_rank, warmup))


def _timeline(results, per_rank, warmup: int) -> dict[str, Any]:
    """The spans of every rank in the measured step whose slowest rank took the median time
    (the lower median), shifted to start at the earliest rank's start of that step."""
    if not all(r.get("spans") for r in results):
        return {}
    slowest = {i: max(r.iteration_ms[i] for r in per_rank)
               for i in range(warmup, len(per_rank[0].iteration_ms))}
    ranked = sorted(slowest, key=lambda i: (slowest[i], i))
    step = ranked[(len(ranked) - 1) // 2]
    origin = min(r["spans"][step][0] for r in results)
    spans = []
    for r in results:
        start, items = r["spans"][step]
        shift = start - origin
        spans += [TimelineSpan(rank=r["rank"], category=category, name=name,
                               start_ms=round(a + shift, 4), end_ms=round(b + shift, 4))
                  for category, name, a, b in items]
    spans.sort(key=lambda s: (s.rank, s.start_ms, -s.end_ms))
    return {"timeline_step": step, "timeline": tuple(spans)}


def _medians(table) -> dict[str, dict[str, float]]:
    return {t: {op: round(statistics.median(v), 5) for op, v in ops.items()}
            for t, ops in table.items()}
