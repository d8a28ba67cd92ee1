"""TAG: a GNN over the joint op-group and device graph guiding a Monte Carlo tree search.

* ``joint`` — the joint heterogeneous graph (PyTorch Geometric ``HeteroData``) and the
  network over it (``HeteroConv``; policy and value heads);
* ``batching`` — micro-batched strategies: the pipeline (microbatches, GPipe or 1F1B
  schedule) a strategy per group runs as;
* ``mcts`` — PUCT tree search over the batching and per-group strategies, leaves
  simulated exactly;
* ``seeds`` — other planners' plans as TAG strategies (their own batch shares), or
  rejected with the reason;
* ``polish`` — refinement over stage cuts, single-group moves and the repaired batching;
* ``planner`` — ``plan``: seeds, search, refinement, the fallbacks, SFB;
* ``learn`` — AlphaZero-style training from the searches' visit counts and outcomes;
* ``topogen`` — seeded random heterogeneous topologies (``random:N`` specs).

Importing this package loads none of them (``joint`` needs PyTorch Geometric).
"""
