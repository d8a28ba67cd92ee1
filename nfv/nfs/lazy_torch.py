"""``torch``, imported on first use.

The CPU path (the per-flow NFs in worker processes, and the main process of the
``cpu`` engine, which only cuts batches and merges results) never runs a
tensor op, and importing torch costs about a second of a run's start. The NF
and engine modules name ``torch`` through this stand-in; the first attribute
looked up imports the real module (Python's import cache keeps it).
"""

from __future__ import annotations

import importlib


class _Torch:
    __slots__ = ()

    def __getattr__(self, name: str):
        return getattr(importlib.import_module("torch"), name)


torch = _Torch()
