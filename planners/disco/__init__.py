"""DisCo: joint op fusion and gradient tensor fusion for data-parallel training.

``planner.plan`` (registered as ``disco``) searches; ``baselines`` holds the DDP, Horovod
and XLA-like strategies (registered as ``dp-no-fusion``, ``dp-horovod``, ``dp-xla-like``)
and the ideal-overlap bound; ``fusible`` the op classes and fusion validity; ``search``
the backtracking search; ``estimator`` the learned fused-kernel estimator (a GNN trained on
``dl-nfv profile fusion`` measurements). docs/planners/disco.md has the model, the method and the limits.
"""

from .planner import plan

__all__ = ["plan"]
