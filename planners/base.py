"""What every planner shares: turning groups into a scored ``Plan``, batch shares, speeds.

``finish`` is the one way a planner produces its result: it builds the Plan,
simulates it on the shared simulator, refuses a plan that overflows a device
(``InfeasiblePlan`` naming the device and the shortfall), and records the
prediction, the lower bound and the wall time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dl_nfv.artifacts import (
    BadInput,
    Fusion,
    Group,
    InfeasiblePlan,
    OpGraph,
    Optimizer,
    Pipeline,
    Plan,
    PlanStatus,
    Prediction,
    TieSync,
    Topology,
    fingerprint,
)
from dl_nfv.simulator.costs import CostModel

from .bounds import Bound

GIB = 2**30


def started() -> float:
    """A timestamp for ``finish(started=...)``."""
    return time.perf_counter()


def optimizer_named(planner: str, name: str) -> Optimizer:
    """The optimizer a planner's ``optimizer`` option names; ``BadInput`` naming the valid
    ones. Planners charge its state in every device's memory and its step after the
    gradients (``CostModel.update_ms``), and record it in the plan, which the simulator
    and the runtime follow."""
    try:
        return Optimizer(name)
    except ValueError:
        raise BadInput(f"{planner}: optimizer must be one of "
                       f"{', '.join(o.value for o in Optimizer)}, got {name!r}") from None


def finish(*, planner: str, graph: OpGraph, topology: Topology, groups: Sequence[Group],
           seed: int, options: dict[str, Any], started_at: float, bound: Bound | None = None,
           status: PlanStatus = PlanStatus.HEURISTIC, pipeline: Pipeline | None = None,
           order: dict[str, tuple[str, ...]] | None = None, fusion: Fusion | None = None,
           optimizer: Optimizer = Optimizer.SGD, notes: Sequence[str] = (),
           cost_model: CostModel | None = None, require_fit: bool = True,
           tie_sync: TieSync = TieSync.ALLREDUCE) -> Plan:
    """Build, simulate and stamp a plan.

    Raises ``InfeasiblePlan`` when ``require_fit`` and the simulated memory of
    some device overflows, naming the device, the time and the shortfall.
    """
    from dl_nfv.simulator import simulate
    from dl_nfv.simulator.extrapolation import extrapolation_notes

    used = dict.fromkeys(d for g in groups for d in (*g.devices, *g.ps_servers))
    notes = (*notes, *extrapolation_notes(used, graph, topology))
    draft = Plan(planner=planner, options=_plain_options(options), seed=seed,
                 graph_sha256=fingerprint(graph), topology_sha256=fingerprint(topology),
                 batch_size=graph.model.batch_size, optimizer=optimizer, groups=tuple(groups),
                 pipeline=pipeline, order=dict(order or {}), fusion=fusion, status=status,
                 notes=tuple(notes), tie_sync=tie_sync)
    result = simulate(draft, graph, topology, cost_model=cost_model, check_fingerprints=False)
    if require_fit and not result.feasible:
        raise InfeasiblePlan(f"{planner}: {describe_overflow(result, cost_model or CostModel(graph, topology))}")
    return replace(draft,
                   prediction=Prediction(iteration_ms=round(result.iteration_ms, 6),
                                         peak_memory_bytes={d: int(b) for d, b in
                                                            result.peak_memory_bytes.items()}),
                   bound_ms=None if bound is None else round(bound.ms, 6),
                   wall_time_s=round(time.perf_counter() - started_at, 4))


def describe_overflow(result, cm: CostModel) -> str:
    """One sentence on the worst memory overflow of a simulation result."""
    device, time_ms, shortfall = max(result.overflows, key=lambda o: o[2])
    d = cm.cluster.device(device)
    need = d.memory_bytes + shortfall
    return (f"device {device!r} ({d.type.name}) needs {need / GIB:.2f} GiB at t={time_ms:.1f} ms "
            f"but has {d.memory_bytes / GIB:.2f} GiB (short by {shortfall / GIB:.2f} GiB)")


def _plain_options(options: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in options.items():
        if isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
        elif isinstance(value, (list, tuple)):
            out[key] = list(value)
        else:
            out[key] = str(value)
    return out


def device_speeds(cm: CostModel, devices: Sequence[str]) -> list[float]:
    """Relative speed of each device: 1 / (its forward+backward time for the whole graph)."""
    speeds = []
    for d in devices:
        j = cm.device_type_index[d]
        total = float(cm.fwd_ms_by_type[:, j].sum() + cm.bwd_ms_by_type[:, j].sum())
        speeds.append(1.0 / total if total > 0 else 1.0)
    return speeds


def integer_shares(batch_size: int, weights: Sequence[float]) -> list[int]:
    """Split ``batch_size`` samples in proportion to ``weights`` (largest remainder).

    Every sample goes somewhere; a device may get 0 samples when the batch is
    smaller than the device count or its weight is tiny.
    """
    total = sum(weights)
    exact = [batch_size * w / total for w in weights]
    counts = [math.floor(x) for x in exact]
    rest = batch_size - sum(counts)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:rest]:
        counts[i] += 1
    return counts


def replicas(devices: Sequence[str], counts: Sequence[int]) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """Devices with a non-zero sample count and their batch shares (exact fractions of the batch)."""
    total = sum(counts)
    kept = [(d, c) for d, c in zip(devices, counts) if c > 0]
    shares = tuple(c / total for _, c in kept)
    # shares are exact sample fractions; renormalise the float sum to exactly 1
    if kept:
        shares = (*shares[:-1], 1.0 - sum(shares[:-1]))
    return tuple(d for d, _ in kept), shares


def gradient_buckets(graph: OpGraph, op_ids: Sequence[str], bucket_bytes: float) -> tuple[tuple[str, ...], ...]:
    """DDP-style buckets: ops with parameters in reverse topological order, ~``bucket_bytes`` each."""
    wanted = set(op_ids)
    index = graph.index
    buckets: list[list[str]] = []
    size = 0.0
    for op_id in reversed(graph.topological_ids()):
        if op_id not in wanted or index[op_id].param_bytes == 0:
            continue
        if not buckets or size >= bucket_bytes:
            buckets.append([])
            size = 0.0
        buckets[-1].append(op_id)
        size += index[op_id].param_bytes
    return tuple(tuple(b) for b in buckets)
