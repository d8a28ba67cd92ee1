"""dl-nfv: plan and run distributed DNN training, and run network functions fast.

The subpackages mirror the project's top-level folders: ``dl_nfv.artifacts``,
``dl_nfv.profilers``, ``dl_nfv.planners``, ``dl_nfv.simulator``,
``dl_nfv.runtime``, ``dl_nfv.nfv`` and ``dl_nfv.cli``.
"""

__version__ = "0.1.0"
