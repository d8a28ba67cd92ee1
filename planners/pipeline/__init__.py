"""The synchronous pipeline planner (``dl-nfv plan pipeline``); see ``planner`` and docs/planners/pipeline.md.

Modules: ``problem`` (the op graph as prefix-sum arrays over a topological
order), ``mapping`` (topology-aware device orderings), ``partition`` (the
partition + mapping DP), ``scheduler`` (GPipe, 1F1B and the list scheduler),
``build`` (replica shares, scheduler inputs, plan parts), ``symmetry`` (uniform clusters:
classes of device groups, canonical orderings, nested sub-clusters), ``search`` (the
search over orderings, microbatch counts and layouts) and ``planner`` (the
public ``plan``). The family's lower bound is ``planners.bounds.stage_balanced``.
"""

from .planner import plan

__all__ = ["plan"]
