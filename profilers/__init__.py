"""Profilers: the model zoo, graph capture, op cost measurement, importers, network probe.

* ``zoo``: the built-in models, ``model_ref`` and ``instantiate`` (zoo names and
  ``module:callable`` / ``file.py:callable`` user models) -> ``Workload``.
* ``capture``: torch.fx tracing at op or layer granularity, op id -> fx nodes.
* ``profile_model``: a ``ModelRef`` into a measured ``OpGraph`` (``model.py``).
* ``network``: ``probe_network`` -> a measured ``Topology``.
* ``importers``: PipeDream ``graph.txt`` and NeurIPS'20 placement JSON.
* ``devices``: the device catalog (from ``dl_nfv.artifacts.devices``).
"""

from .model import profile_model

__all__ = ["profile_model"]
