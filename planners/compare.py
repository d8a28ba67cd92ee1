"""Run several planners on one graph and cluster, and tabulate their simulated results.

An infeasible planner (out of memory, indivisible batch, ...) gets a row that
says why instead of stopping the comparison.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from dl_nfv.artifacts import BadInput, OpGraph, Plan, Topology
from dl_nfv.artifacts.records import to_data
from dl_nfv.artifacts.results import ComparisonRow

from . import PLANNERS, get


@dataclass(frozen=True, kw_only=True, slots=True)
class Row(ComparisonRow):
    """A planner's ``ComparisonRow`` (what a ``plan-comparison`` keeps of it) and its plan."""

    plan: Plan | None = field(default=None, repr=False, compare=False)

    def to_data(self) -> dict[str, Any]:
        """The row as the artifact keeps it: the plan left out, fields at their default too."""
        return to_data(ComparisonRow(**{f.name: getattr(self, f.name)
                                        for f in fields(ComparisonRow)}))


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
    return [replace(r, speedup_vs_dp=dp / r.iteration_ms) if dp and r.iteration_ms else r
            for r in rows]
