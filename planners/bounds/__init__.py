"""Lower bounds on the iteration time of the plans a planner can make, on the shared cost model.

Every planner reports ``bound_ms``, the largest bound it knows for the family of plans it
searches, so a user can see how far a plan may be from the best of that family. A bound is
only a bound if it is at most the simulated time of every plan of the family:
``tests/planners/test_bounds_oracle.py`` checks that by enumerating every plan of tiny
problems. Network costs come from the cost model only (``NetworkCosts``: affine transfers,
AllReduce per-byte floors with the figures a collective sees on each link).

Modules:

* ``placement``: bounds for any placement of ops on devices, replicated or not (work,
  critical path, largest indivisible op), combined by ``lower_bound``;
* ``stage_balanced``: the bound on synchronous pipelines (stages of ops on groups of
  devices, microbatches with a flush), ``stage_balanced_bound_ms``, built from
  ``ranges`` (regions of the op graph and the work of every range), ``shares`` (how a
  microbatch may be split over a stage's replicas), ``network`` (AllReduce floors,
  boundary crossings, split ties), ``dp`` (the min-max DP over partitions), ``cheap``
  (its terms with every stage on the fastest devices) and ``classes`` (devices counted
  per class).

Limits: the bounds hold for plans without operator fusion (``Fusion.op_groups``), which
saves launches and memory traffic that the bounds count.
"""

from .placement import Bound, critical_path_ms, largest_op_ms, lower_bound, work_bound_ms
from .stage_balanced import forced_cuts, stage_balanced_bound_ms

__all__ = ["Bound", "critical_path_ms", "forced_cuts", "largest_op_ms", "lower_bound",
           "stage_balanced_bound_ms", "work_bound_ms"]
