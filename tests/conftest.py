"""Shared test set-up: the --runslow option, the gpu marker, paths to examples."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TOPOLOGIES = sorted((EXAMPLES / "topologies").glob("*.yaml"))


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config, items):
    has_cuda = False
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        pass
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture
def topology_path():
    return EXAMPLES / "topologies" / "heterog-testbed8.yaml"


@pytest.fixture(autouse=True)
def _fresh_pipeline_bounds():
    """Each test bounds its pipelines afresh (``pipeline_bound`` keeps the bounds of a
    process's graphs and topologies, which a test that changes the cost model would see)."""
    from dl_nfv.planners.pipeline import planner

    planner._BOUNDS.clear()
    yield


@pytest.fixture
def one_thread():
    """torch single-threaded for the test: tiny models gain nothing from threads, and on a
    busy 2-core machine OpenMP barriers between two threads can cost milliseconds per op."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
