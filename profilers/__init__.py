"""Profilers: the model zoo, graph capture, op cost measurement, importers, network probe."""

from .model import profile_model

__all__ = ["profile_model"]
