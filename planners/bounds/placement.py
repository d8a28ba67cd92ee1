"""Bounds on any placement of ops on devices: work, critical path, largest op.

Model: a plan places every op on one device or replicates it over several, each replica
holding a whole number of the batch's samples; the simulator runs one compute task at a
time per device, a replica of an op takes ``fixed + (t - fixed) x share`` (the cost model's
``scale_by_batch``), and an op's backward runs only where it or an ancestor has parameters
(``CostModel.needs_grad``: nothing upstream wants the others' input gradients).

Bounds (each holds for every plan on the given devices; ``lower_bound`` takes the largest):

* **work**: all forward and backward work is done somewhere. With ``t(op, d)`` the op's
  full-batch time on device ``d``, ``t_min(op)`` the fastest, and
  ``rho_d = min_op t(op, d) / t_min(op)`` the device's best relative speed,
  ``T >= sum_op t_min(op) / sum_d (1 / rho_d)``. Replicating an op never lowers its total
  time: the fixed part is paid by every replica.
* **critical path**: forward then backward along the longest path of the op graph, every
  op at its fastest time for the smallest batch fraction a replica holding the path's
  samples may have (``min_batch_fraction``; a replica holds at least one sample).
* **largest op**: for plans that never replicate an op, the op with the largest fastest
  full-batch time runs whole on one device.

Limits: no communication, memory or optimizer step is counted; plans that fuse ops
(``Fusion.op_groups``) save launches and memory traffic these bounds count.

Complexity: O(ops x device types + edges).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from dl_nfv.simulator.costs import CostModel


@dataclass(frozen=True, slots=True)
class Bound:
    """A lower bound and the parts it is the maximum of (all in ms)."""

    ms: float
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def binding(self) -> str:
        return max(self.parts, key=self.parts.__getitem__) if self.parts else ""


def _type_columns(cm: CostModel, devices: Sequence[str]) -> list[int]:
    return [cm.device_type_index[d] for d in devices]


def op_work_ms(cm: CostModel, devices: Sequence[str],
               batch_fraction: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``(forward, backward)`` ``[ops, len(devices)]``: each op's time on each device at
    ``batch_fraction``, the backward 0 where the simulator runs none (``needs_grad``)."""
    fwd, bwd = cm.scaled_tables(_type_columns(cm, devices), batch_fraction)
    return fwd, bwd * cm.bwd_runs[:, None]


def work_bound_ms(cm: CostModel, devices: Sequence[str]) -> float:
    """Total work over total (relative) capacity of ``devices``."""
    fwd, bwd = op_work_ms(cm, devices)
    work = fwd + bwd  # [ops, devices]
    t_min = work.min(axis=1)
    total = float(t_min.sum())
    if total <= 0:
        return 0.0
    mask = t_min > 0
    rho = (work[mask] / t_min[mask, None]).min(axis=0)
    return total / float((1.0 / rho).sum())


def critical_path_ms(cm: CostModel, devices: Sequence[str], min_batch_fraction: float = 1.0,
                     *, split_backwards: bool = False) -> float:
    """Longest forward+backward chain, each op at its fastest time and smallest batch fraction.

    With ``split_backwards`` (plans that may run an op's weight gradients after its input
    gradients, ``CostModel.bwd_input_share``), the chain's backwards count their input
    gradients alone, and an op's weight gradients only after its own input gradients,
    which wait for the forwards of its ancestors and the chain through its descendants:
    the largest of the chain of forwards and input gradients, and of the forwards into
    an op, its forward and whole backward, and the chain of its descendants.
    """
    fwd, bwd = (x.min(axis=1) for x in op_work_ms(cm, devices, min_batch_fraction))
    b_in = bwd * cm.bwd_input_share if split_backwards else bwd  # (whole: the plain chain)
    graph = cm.graph.to_networkx()
    order = list(nx.topological_sort(graph))
    index = cm.op_index
    # the longest chains before an op (of forwards; of forwards and I's, which the gradient
    # passes back through after the op's I) and after it (forwards and I's)
    into: dict[str, float] = {}
    into_both: dict[str, float] = {}
    for op_id in order:
        preds = list(graph.predecessors(op_id))
        into[op_id] = max((into[p] + float(fwd[index[p]]) for p in preds), default=0.0)
        into_both[op_id] = max((into_both[p] + float(fwd[index[p]] + b_in[index[p]])
                                for p in preds), default=0.0)
    after: dict[str, float] = {}
    for op_id in reversed(order):
        after[op_id] = max((after[s] + float(fwd[index[s]] + b_in[index[s]])
                            for s in graph.successors(op_id)), default=0.0)
    return max((max(into[o] + float(fwd[index[o]] + bwd[index[o]]),
                    into_both[o] + float(fwd[index[o]] + b_in[index[o]])) + after[o]
                for o in order), default=0.0)


def largest_op_ms(cm: CostModel, devices: Sequence[str]) -> float:
    """Fastest full-batch forward+backward time of the largest op: a bound for plans that
    run every op whole on one device (no replicas)."""
    fwd, bwd = op_work_ms(cm, devices)
    return float((fwd + bwd).min(axis=1).max(initial=0.0))


def lower_bound(cm: CostModel, devices: Sequence[str] | None = None, *,
                min_batch_fraction: float | None = None, ops_splittable: bool = True,
                extra: dict[str, float] | None = None) -> Bound:
    """The best of the bounds above (plus any ``extra`` ones a planner proves).

    ``ops_splittable``: the plans may replicate an op over devices with shares of the batch
    (then the largest op bounds nothing the critical path does not). ``min_batch_fraction``
    is the least share a replica on the critical path may hold: by default one sample of
    the batch where ops may be replicated, else the whole batch.
    """
    devices = list(devices or cm.cluster.device_names)
    if min_batch_fraction is None:
        min_batch_fraction = 1.0 / cm.graph.model.batch_size if ops_splittable else 1.0
    parts = {
        "work": work_bound_ms(cm, devices),
        "critical_path": critical_path_ms(cm, devices, min_batch_fraction),
    }
    if not ops_splittable:
        parts["largest_op"] = largest_op_ms(cm, devices)
    parts.update(extra or {})
    return Bound(max(parts.values()), parts)
