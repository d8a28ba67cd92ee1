"""Learned planning: what HeteroG, TAG and DisCo share.

* ``coarsen`` — the op graph cut into op groups (the units a policy decides for),
  never splitting a colocation group;
* ``features`` — an op graph, its groups and a cluster as tensors, with a feature
  schema version (``FEATURE_SCHEMA_VERSION``) that a trained policy records;
* ``encoder`` — a graph-attention encoder (PyTorch Geometric) over the op-group graph,
  conditioned on the devices;
* ``env`` — the simulator as an environment: a strategy per group -> a ``Plan`` ->
  simulated -> reward (minus the iteration time, memory overflow penalised);
* ``decoder`` — scores each group's candidate strategies from the embeddings;
* ``reinforce`` — trains encoder and decoder by REINFORCE with a baseline over one or
  more (graph, cluster) problems on the environment;
* ``refine`` — local search over single-group moves with the simulator, bounded;
* ``order`` — each device's execution order from a priority per group, by list
  scheduling, with a bounded search over the priorities;
* ``policy`` — trained weights in and out of the ``policy`` artifact, refusing a
  policy of another feature schema.

Import the modules themselves (``features`` needs torch, ``encoder`` PyTorch
Geometric); importing this package loads neither.
"""
