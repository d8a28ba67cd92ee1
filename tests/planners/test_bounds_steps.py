"""The stage-balanced bound taken step by step equals the bound of each count's level whole.

``stage_balanced._best_first`` refines the cheap level one ``cheap_steps`` step at a time,
the count least so far first; the reference below takes each count's cheap level whole
(``cheap_bound`` with every step) as the bound did before: the two must agree exactly.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

import numpy as np
import pytest

from dl_nfv.artifacts import TieSync, from_data
from dl_nfv.artifacts.topology import Topology
from dl_nfv.planners.bounds import stage_balanced
from dl_nfv.planners.bounds.cheap import cheap_bound, cheap_steps, cheap_terms
from dl_nfv.planners.bounds.classes import class_bound, uncapped_table
from dl_nfv.planners.bounds.dp import Shape
from dl_nfv.planners.pipeline.problem import Problem
from tests.planners.test_pipeline import GIB, V100, chain, nvlink


def _whole_levels(x) -> float:
    """Best first over counts, each count's cheap level taken whole."""
    last = 1 if len(x.classes) == 1 else 3
    shape = Shape(split=x.ranges.split, devices=x.devices, grid=x.grid)
    heap = [(cheap_bound(x, m, enough=0.0), 0, m)
            for m in range(1, x.batch + 1) if x.batch % m == 0]
    heapify(heap)
    best, uncapped = np.inf, {}
    while heap and heap[0][0] < best:
        value, level, m = heappop(heap)
        if level == 0:
            value = max(value, cheap_bound(x, m, enough=best, t=cheap_terms(x, m, shape)))
        elif level == 1:
            uncapped[m] = uncapped_table(x, m)
            value = max(value, float(uncapped[m][0, -1]))
        else:
            value = max(value, class_bound(x, m, enough=best, uncapped=uncapped[m], known=value))
        if level + 1 == last:
            best = min(best, value)
        else:
            heappush(heap, (value, level + 1, m))
    return best


def _two_types(devices: int) -> Topology:
    return from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "two-types",
        "hosts": [{"name": "h", "devices": [{"type": V100, "count": devices // 2},
                                            {"type": "P100", "count": devices - devices // 2}],
                   "interconnect": {"kind": "pcie", "bandwidth_gbps": 100, "latency_us": 2}}]})


@pytest.mark.parametrize("devices, layers, batch, mixed, exact_up_to", [
    (8, 6, 16, False, 32), (12, 10, 32, False, 32), (6, 5, 16, True, 32),
    (8, 8, 32, True, 32), (20, 8, 16, False, 8), (10, 6, 16, True, 4)])
def test_steps_give_the_bound_of_whole_levels(monkeypatch, devices, layers, batch, mixed,
                                              exact_up_to):

    monkeypatch.setattr(stage_balanced, "EXACT_COUNTS_UP_TO", exact_up_to)  # grids too
    graph = chain(layers, param_bytes=GIB // 4, batch=batch,
                  slower={"P100": 1.7} if mixed else None)
    topo = _two_types(devices) if mixed else nvlink(devices)
    problem = Problem(graph, topo)
    x = stage_balanced.inputs(problem, list(problem.devices), TieSync.EXCHANGE)
    assert stage_balanced._best_first(x) == _whole_levels(x)


def test_cheap_bound_is_the_largest_of_its_steps():

    graph = chain(8, param_bytes=GIB // 4, batch=16)
    problem = Problem(graph, nvlink(8))
    x = stage_balanced.inputs(problem, list(problem.devices), TieSync.EXCHANGE)
    shape = Shape(split=x.ranges.split, devices=x.devices, grid=x.grid)
    for m in (1, 2, 4, 16):
        t = cheap_terms(x, m, shape)
        steps = [step(np.inf) for step in cheap_steps(x, m, t)]
        assert len(steps) >= 2
        assert cheap_bound(x, m, enough=np.inf, t=t) == max(steps)


def test_steps_give_the_bound_of_whole_levels_on_gpt2_xl():

    from pathlib import Path

    from dl_nfv.artifacts import load

    root = Path(__file__).resolve().parents[2]
    graph = load(root / "bench" / "profiles" / "gpt2-xl-b16-s16-r3.json", expect="op-graph")
    topo = load(root / "examples" / "topologies" / "a100-2x4-25g.yaml", expect="topology")
    problem = Problem(graph, topo, tie_sync=TieSync.EXCHANGE)
    x = stage_balanced.inputs(problem, list(problem.devices), TieSync.EXCHANGE)
    assert stage_balanced._best_first(x) == _whole_levels(x)
