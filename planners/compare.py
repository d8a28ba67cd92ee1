"""Run several planners on one graph and cluster, and tabulate their simulated results.

An infeasible planner (out of memory, indivisible batch, ...) gets a row that
says why instead of stopping the comparison.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dl_nfv.artifacts import BadInput, OpGraph, Plan, Topology

from . import PLANNERS, get


@dataclass(slots=True)
class Row:
    planner: str
    feasible: bool
    iteration_ms: float | None = None
    bound_ms: float | None = None
    ratio_to_bound: float | None = None
    speedup_vs_dp: float | None = None
    stages: int | None = None
    microbatches: int | None = None
    devices: int | None = None
    peak_memory_bytes: int | None = None
    plan_s: float | None = None
    error: str = ""
    plan: Plan | None = field(default=None, repr=False)

    def to_data(self) -> dict[str, Any]:
        return {k: v for k, v in (
            ("planner", self.planner), ("feasible", self.feasible),
            ("iteration_ms", self.iteration_ms), ("bound_ms", self.bound_ms),
            ("ratio_to_bound", self.ratio_to_bound), ("speedup_vs_dp", self.speedup_vs_dp),
            ("stages", self.stages), ("microbatches", self.microbatches), ("devices", self.devices),
            ("peak_memory_bytes", self.peak_memory_bytes), ("plan_s", self.plan_s),
            ("error", self.error)) if v is not None and v != ""}


def accepted_options(func: Callable) -> set[str]:
    target = getattr(func, "__wrapped__", func)
    return {name for name, p in inspect.signature(target).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def compare(graph: OpGraph, topology: Topology, planners: Sequence[str], *, seed: int = 0,
            options: dict[str, Any] | None = None,
            progress: Callable[[str], None] | None = None) -> list[Row]:
    """Run each planner in ``planners`` and return one Row each, in the given order.

    ``options`` are passed to every planner that accepts them (e.g. ``time_limit``).
    Raises ``BadInput`` for an unknown planner name before running any.
    """
    for name in planners:
        if name not in PLANNERS:
            raise BadInput(f"unknown planner {name!r}; valid: {', '.join(PLANNERS)}")
    rows: list[Row] = []
    for name in planners:
        if progress:
            progress(name)
        func = get(name)
        accepted = accepted_options(func)
        kwargs = {k: v for k, v in (options or {}).items() if k in accepted}
        try:
            plan = func(graph, topology, seed=seed, **kwargs)
        except BadInput as exc:
            rows.append(Row(planner=name, feasible=False, error=str(exc)))
            continue
        pred = plan.prediction
        rows.append(Row(
            planner=name, feasible=True, iteration_ms=pred.iteration_ms if pred else None,
            bound_ms=plan.bound_ms, plan_s=plan.wall_time_s,
            ratio_to_bound=(pred.iteration_ms / plan.bound_ms if pred and plan.bound_ms else None),
            stages=len(plan.pipeline.stages) if plan.pipeline else None,
            microbatches=plan.pipeline.microbatches if plan.pipeline else None,
            devices=len(plan.devices),
            peak_memory_bytes=max(pred.peak_memory_bytes.values(), default=0) if pred else None,
            plan=plan))
    dp = next((r.iteration_ms for r in rows if r.planner == "dp" and r.feasible), None)
    for r in rows:
        if dp and r.iteration_ms:
            r.speedup_vs_dp = dp / r.iteration_ms
    return rows
