"""Profiler tests run torch single-threaded: tiny models gain nothing from threads, and on a
busy 2-core machine OpenMP barriers between two threads can cost milliseconds per op."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
