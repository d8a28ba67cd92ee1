"""The stage-balanced bound taken step by step equals the bound of each count's level whole.

``stage_balanced._best_first`` refines the cheap level one ``cheap_steps`` step at a time,
the count least so far first; the reference below takes each count's cheap level whole
(``cheap_bound`` with every step) as the bound did before: the two must agree exactly.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from pathlib import Path

import numpy as np
import pytest

from dl_nfv.artifacts import TieSync, from_data
from dl_nfv.artifacts.topology import Topology
from dl_nfv.planners.bounds import dp, stage_balanced
from dl_nfv.planners.bounds.cheap import cheap_bound, cheap_steps, cheap_terms
from dl_nfv.planners.bounds.classes import class_bound, uncapped_table
from dl_nfv.planners.bounds.dp import DeviceGrid, Shape, continuation
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

    from dl_nfv.artifacts import load

    root = Path(__file__).resolve().parents[2]
    graph = load(root / "bench" / "profiles" / "gpt2-xl-b16-s16-r3.json", expect="op-graph")
    topo = load(root / "examples" / "topologies" / "a100-2x4-25g.yaml", expect="topology")
    problem = Problem(graph, topo, tie_sync=TieSync.EXCHANGE)
    x = stage_balanced.inputs(problem, list(problem.devices), TieSync.EXCHANGE)
    assert stage_balanced._best_first(x) == _whole_levels(x)


@pytest.mark.parametrize("topology", ["a100-4x8-leafspine", "ring8-mixed", "tag-hetero16"])
def test_cut_limits_are_the_same_whatever_flow_algorithm_builds_the_tree(monkeypatch, topology):

    import networkx as nx

    from dl_nfv.artifacts import load
    from dl_nfv.planners.bounds import network

    root = Path(__file__).resolve().parents[2]
    topo = load(root / "examples" / "topologies" / f"{topology}.yaml", expect="topology")
    problem = Problem(chain(2), topo)
    graph, devices = problem.cm.capacity_graph(collective=True), list(problem.devices)
    fast = network._cut_limits(graph, devices)
    real = nx.gomory_hu_tree
    monkeypatch.setattr(network.nx, "gomory_hu_tree",
                        lambda g, capacity, flow_func=None: real(g, capacity=capacity))
    assert np.array_equal(fast, network._cut_limits(graph, devices))  # Edmonds-Karp's
    assert fast[2] > 0


def _table_on_grid_by_loop(busy, chain, shape, around=None, after=None):
    """The grid DP one (region, grid value left) at a time (its first form)."""
    c, regions = shape.grid, shape.regions
    G, R = len(busy), len(c.lo)
    g = np.full((G, regions + 2, R), np.inf)
    g[:, regions:, :] = 0.0
    for i in range(regions - 1, -1, -1):
        cont = continuation(g, shape.split)
        for q in range(1, R):
            ks, at = c.ks[q], c.at[q][c.ks[q]]
            val = np.maximum(busy[:, i][:, i + 1:][:, :, ks],
                             chain[i][i + 1:][:, ks][None] + cont[:, i + 1:, at][..., None])
            if around is not None:
                val = np.maximum(val, (around[i][i + 1:][:, ks] + after[i + 1:, at][..., None])[None])
            g[:, i, q] = np.minimum(g[:, i, q - 1], val.reshape(G, -1).min(axis=1))
        if shape.split[i]:
            g[:, i] = np.minimum(g[:, i], g[:, i + 1])
    return g


@pytest.mark.parametrize("seed, regions, devices, with_around", [
    (0, 6, 40, False), (1, 9, 100, True), (2, 4, 20, True), (3, 12, 64, False)])
def test_grid_dp_in_one_pass_per_region_equals_the_loop(seed, regions, devices, with_around):

    rng = np.random.default_rng(seed)
    grid = DeviceGrid(devices, dense=4, steps=6)
    shape = Shape(split=rng.random(regions) < 0.3, devices=devices, grid=grid)
    R, options = len(grid.lo), 3

    def terms(*lead):
        x = rng.random((*lead, regions + 1, regions + 1, R, options)) * 10
        x[..., rng.random(x.shape[-4:]) < 0.2] = np.inf
        return x

    busy, chain = terms(2), terms()
    around = terms() if with_around else None
    after = rng.random((regions + 1, R)) * 5 if with_around else None
    got = dp._table_on_grid(busy, chain, shape, around, after)
    assert np.array_equal(got, _table_on_grid_by_loop(busy, chain, shape, around, after))


def _solve_state_by_state(solver, cap: float = np.inf) -> np.ndarray:
    """The class DP's table taken state by state (the reference of ``_Solver.solve``'s
    vectorised pass over every (state, sub-vector) pair): ``A(cap)`` without the round trip."""
    t, v = solver.t, solver.v
    b = t.busy if cap == np.inf else np.where(solver.sync <= cap, t.busy, np.inf)
    regions = len(solver.split)
    g = np.full((regions + 2, len(v.vectors)), np.inf)
    g[regions] = g[regions + 1] = 0.0
    for i in range(regions - 1, -1, -1):
        cont = continuation(g, solver.split)
        for n, (ks, rests) in enumerate(zip(v.subs, v.rests)):
            if ks.size:
                g[i, n] = np.maximum(b[i, i + 1:][:, ks].transpose(1, 0, 2),
                                     t.chain[i, i + 1:][:, ks].transpose(1, 0, 2)
                                     + cont[i + 1:][:, rests].T[..., None]).min()
        if solver.split[i]:
            g[i] = np.minimum(g[i], g[i + 1])
    return g


@pytest.mark.parametrize("devices, layers, batch", [(6, 5, 16), (8, 8, 32), (10, 6, 16)])
def test_the_class_dp_s_pass_over_every_state_at_once_equals_state_by_state(devices, layers,
                                                                            batch):
    from dl_nfv.planners.bounds.classes import _Solver, _vectors, class_terms

    graph = chain(layers, param_bytes=GIB // 4, batch=batch, slower={"P100": 1.7})
    problem = Problem(graph, _two_types(devices))
    x = stage_balanced.inputs(problem, list(problem.devices), TieSync.EXCHANGE)
    v = _vectors(x)
    for m in (1, 2, batch):
        solver = _Solver(x, v, class_terms(x, v, m))
        ours = solver.solve(np.inf, full=True, beside=False)
        assert np.array_equal(ours, _solve_state_by_state(solver))
        cap = float(np.median(solver.sync[np.isfinite(solver.sync) & (solver.sync > 0)]))
        assert np.array_equal(solver.solve(cap, full=True, beside=False),
                              _solve_state_by_state(solver, cap))
