"""``plan exact``: the optimal contiguous split of an op graph into single-device stages.

Modules: ``blocks`` (the block DAG: colocation groups and shape queries kept together,
and its ideals), ``stages`` (the objective: each stage's compute and received transfers
from the cost model, memory, ``evaluate`` for any layout), ``dp`` (the dynamic program
over ideals and device classes) and ``planner`` (the public ``plan``).
See docs/planners/exact.md.
"""

from .planner import plan

__all__ = ["plan"]
