"""The simulator: one cost model and a discrete-event engine for every kind of plan."""

from .costs import CostModel, Flow, scale_by_batch

__all__ = ["CostModel", "Flow", "scale_by_batch"]
