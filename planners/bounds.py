"""Lower bounds on the iteration time of any plan, on the shared cost model.

Every planner reports ``bound_ms`` (the largest bound it knows) so a user can
see how far a plan may be from optimal. Bounds here hold for any plan that
uses the given devices:

* **work bound**: all forward+backward work must be done somewhere. With
  ``t(op, d)`` the op's full-batch time on device ``d``, ``t_min(op)`` the
  fastest, and ``rho_d = min_op t(op, d) / t_min(op)`` the device's best
  relative speed, ``T >= sum_op t_min(op) / sum_d (1 / rho_d)``. (Splitting an
  op over replicas never reduces its total time, since launch overhead does not
  scale with the batch.)
* **critical path**: forward then backward along the longest path, every op
  at its fastest time for the smallest batch fraction a plan may give it.
* **largest indivisible op**: an op that cannot be split (no splittable dims,
  or when the planner never splits) takes its fastest full-batch time.

Complexity: O(ops x device types + edges).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import networkx as nx

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


def work_bound_ms(cm: CostModel, devices: Sequence[str]) -> float:
    """Total work over total (relative) capacity of ``devices``."""
    cols = _type_columns(cm, devices)
    work = cm.fwd_ms_by_type[:, cols] + cm.bwd_ms_by_type[:, cols]  # [ops, devices]
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
    cols = _type_columns(cm, devices)
    fwd, bwd = (scaled.min(axis=1) for scaled in cm.scaled_tables(cols, min_batch_fraction))
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


def largest_op_ms(cm: CostModel, devices: Sequence[str], *, splittable: bool = True) -> float:
    """Fastest full-batch time of the largest op that cannot be split.

    With ``splittable=False`` every op counts as indivisible (planners that
    never split ops, such as pipeline partitioners).
    """
    cols = _type_columns(cm, devices)
    work = (cm.fwd_ms_by_type[:, cols] + cm.bwd_ms_by_type[:, cols]).min(axis=1)
    candidates = [float(work[i]) for i, op in enumerate(cm.graph.ops)
                  if not (splittable and op.splittable_dims)]
    return max(candidates, default=0.0)


def lower_bound(cm: CostModel, devices: Sequence[str] | None = None, *,
                min_batch_fraction: float | None = None, ops_splittable: bool = True,
                extra: dict[str, float] | None = None) -> Bound:
    """The best of the bounds above (plus any ``extra`` ones a planner proves).

    ``min_batch_fraction`` defaults to ``1 / len(devices)`` (the finest data
    parallel split).
    """
    devices = list(devices or cm.cluster.device_names)
    fraction = min_batch_fraction if min_batch_fraction is not None else 1.0 / len(devices)
    parts = {
        "work": work_bound_ms(cm, devices),
        "critical_path": critical_path_ms(cm, devices, fraction),
        "largest_op": largest_op_ms(cm, devices, splittable=ops_splittable),
    }
    parts.update(extra or {})
    return Bound(max(parts.values()), parts)
