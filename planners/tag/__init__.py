"""TAG: a GNN over the joint op-group and device graph guiding a Monte Carlo tree search.

* ``joint`` — the joint heterogeneous graph (PyTorch Geometric ``HeteroData``) and the
  network over it (``HeteroConv``; policy and value heads);
* ``mcts`` — PUCT tree search over per-group strategies, leaves simulated exactly;
* ``planner`` — ``plan``: search, refinement, the DP safety net, SFB;
* ``learn`` — AlphaZero-style training from the searches' visit counts and outcomes;
* ``topogen`` — seeded random heterogeneous topologies (``random:N`` specs).

Importing this package loads none of them (``joint`` needs PyTorch Geometric).
"""
