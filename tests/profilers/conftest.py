"""Profiler tests run torch single-threaded (the shared ``one_thread`` fixture)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield
