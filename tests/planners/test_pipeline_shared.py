"""Work the pipeline planner shares or shortens at cluster scale gives the results of the
computation it replaces: PipeDream's vectorised DP against its loop, the AllReduce
coefficients shared along a uniform cluster's chain of nested sub-clusters."""

from __future__ import annotations

import math
import random

import pytest

from dl_nfv.planners.pipedream import _Level

INF = float("inf")


def _loop_level(compute, params, stash, machines, bandwidth, within, total_machines, memory,
                final, ratio, out_act, wide, most):
    """PipeDream's level DP as a plain loop over ``k`` then ``mp`` (the reference)."""
    n = len(compute) - 1
    A = [[[(INF, None, None)] * machines for _ in range(n + 1)] for _ in range(n + 1)]
    for i in range(n):
        for j in range(i + 1, n + 1):
            if compute[i][j] == INF:
                continue
            for m in range(min(machines, most // wide[i][j])):
                in_flight = math.ceil((total_machines - (m + 1)) / (m + 1))
                if params[i][j] + stash[i][j] * max(in_flight, 1) > memory:
                    continue
                comm = 4 * m * params[i][j] / (bandwidth * (m + 1)) / within
                A[i][j][m] = ((compute[i][j] + comm) / (m + 1), None, m + 1)
    for i in [0] if final else range(n):
        for m in range(1, machines):
            for j in range(i + 1, n + 1):
                best = A[i][j][m]
                if A[i][j][m - 1][0] < best[0]:
                    best = A[i][j][m - 1]
                for k in range(i + 1, j):
                    for mp in range(1, min(m, most // wide[k][j]) + 1):
                        prev = A[i][k][m - mp][0]
                        if prev == INF or compute[k][j] == INF:
                            continue
                        in_flight = math.ceil((total_machines - (m + 1)) / mp)
                        if params[k][j] + stash[k][j] * max(in_flight, 1) > memory:
                            continue
                        last = (compute[k][j] + 4 * (mp - 1) * params[k][j] /
                                (bandwidth * mp)) / mp
                        t = max(prev, last)
                        if ratio:
                            t = max(t, 2.0 * out_act[k] / (bandwidth * mp) / ratio)
                            if j < n:
                                t = max(t, 2.0 * out_act[j] / (bandwidth * mp) / ratio)
                        if t < best[0]:
                            best = (t, (k, m - mp), mp)
                A[i][j][m] = best
    return A


def _random_level(rng: random.Random, n: int):
    """Prefix-sum ranges of ``n`` random ops (some equal, so that ties occur)."""
    work = [rng.choice([1.0, 2.0, 3.0, rng.uniform(0.5, 4.0)]) for _ in range(n)]
    size = [rng.choice([0.0, 1e6, 4e6, rng.uniform(1e5, 1e7)]) for _ in range(n)]
    act = [rng.choice([1e5, 2e5, rng.uniform(1e4, 1e6)]) for _ in range(n + 1)]

    def ranges(values, scale=1.0):
        return [[sum(values[i:j]) * scale if j > i else INF for j in range(n + 1)]
                for i in range(n + 1)]

    wide = [[rng.choice([1, 1, 2]) for _ in range(n + 1)] for _ in range(n + 1)]
    return ranges(work), ranges(size, 3.0), ranges(act[:n], 0.5), act, wide


@pytest.mark.parametrize("seed", range(40))
def test_pipedream_vectorised_level_is_the_loop(seed):
    """Random levels (ties, memory that binds, ratios, replication limits, final or not):
    every entry of the table, times, splits and replicas, is the loop's, bit for bit."""
    rng = random.Random(seed)
    n = rng.randint(2, 9)
    compute, params, stash, out_act, wide = _random_level(rng, n)
    args = dict(machines=rng.randint(1, 6), bandwidth=rng.choice([1e4, 3e5]),
                within=rng.choice([1, 4]), total_machines=rng.randint(6, 40),
                memory=rng.choice([INF, 4e7, 1.2e8]), final=rng.random() < 0.4,
                ratio=rng.choice([0.0, 0.0, 2.0]), out_act=out_act, wide=wide,
                most=rng.choice([64, 3, 2]))
    ours = _Level(compute, params, stash, **args).A
    assert ours == _loop_level(compute, params, stash, **args)


def test_pipedream_layouts_on_a_profile_are_the_loops(monkeypatch):
    """GPT-2 XL's profile on two 8-GPU hosts, at every microbatch count: the layout of the
    vectorised DP is the loop's."""
    from dl_nfv.artifacts import TieSync, load
    from dl_nfv.planners import pipedream
    from dl_nfv.planners.base import optimizer_named
    from dl_nfv.planners.pipeline.problem import Problem
    from tests.planners.test_pipeline_scale import leaf_spine

    from .test_pipeline_bench_cases import PROFILES

    graph = load(PROFILES / "gpt2-xl-b16-s16-r3.json", expect="op-graph")
    problem = Problem(graph, leaf_spine(2, 8, 2), tie_sync=TieSync.EXCHANGE,
                      optimizer=optimizer_named("pipedream", "sgd"))
    ours = [pipedream.pipedream_layout(problem, m) for m in (1, 2, 4, 16)]

    class Loop:
        def __init__(self, *args):
            self.n, self.machines = len(args[0]) - 1, args[3]
            self.A = _loop_level(*args)

        splits = _Level.splits

    monkeypatch.setattr(pipedream, "_Level", Loop)
    assert ours == [pipedream.pipedream_layout(problem, m) for m in (1, 2, 4, 16)]


def test_bound_on_a_uniform_cluster_takes_routes_from_one_device(monkeypatch):
    """The floors' least route over the pairs from one device of a uniform cluster (its
    symmetry) is the least over every pair: the bound is the same to the bit."""
    from dl_nfv.planners.bounds import network
    from dl_nfv.planners.pipeline.planner import _pipeline_bound
    from dl_nfv.planners.pipeline.problem import Problem

    from .test_pipeline import GIB, chain
    from .test_pipeline_scale import leaf_spine

    graph = chain(6, param_bytes=GIB // 4, batch=8)
    topo = leaf_spine(4, 2, 2, names=["a", "c", "b", "d"])
    problem = Problem(graph, topo)
    assert problem.labels is not None
    assert len(network.pairs(problem, list(problem.devices))) == 7
    ours = _pipeline_bound(problem)
    monkeypatch.setattr(network, "pairs", lambda p, devices: [
        (a, b) for a in devices for b in devices if a != b])
    assert _pipeline_bound(Problem(graph, topo)) == ours


def test_nested_chain_shares_collective_coefficients_exactly():
    """A uniform cluster planned with its chain of nested sub-clusters sharing the AllReduce
    coefficients per class, against every ordering's table built with a cache of its own:
    the same plan, to the byte."""
    from dataclasses import replace

    from dl_nfv.planners import run
    from dl_nfv.planners.pipeline import search as search_module

    from .test_pipeline import GIB, chain
    from .test_pipeline_scale import leaf_spine

    graph = chain(6, param_bytes=GIB // 4, batch=8)
    topo = leaf_spine(4, 2, 2)
    shared = run("pipeline", graph, topo, time_limit=600.0)
    real = search_module.search

    def own_cache(*args, **kwargs):
        kwargs["collectives"] = None
        return real(*args, **kwargs)

    import dl_nfv.planners.pipeline.planner as planner_module
    try:
        planner_module.search = own_cache
        alone = run("pipeline", graph, topo, time_limit=600.0)
    finally:
        planner_module.search = real
    assert replace(shared, wall_time_s=0.0) == replace(alone, wall_time_s=0.0)


def test_memoised_stage_terms_and_channels_are_the_computed_ones():
    """GPT-2 XL (a tied embedding) on two 8-GPU hosts, random layouts that share stages:
    the scheduler inputs built with the stage memo filled by the others, and their
    schedules on channels built once, equal those built from nothing."""
    from dataclasses import replace

    from dl_nfv.artifacts import TieSync, load
    from dl_nfv.planners.base import optimizer_named
    from dl_nfv.planners.pipeline.build import all_replicas, stage_costs
    from dl_nfv.planners.pipeline.partition import Layout, StageSpec
    from dl_nfv.planners.pipeline.problem import Problem
    from dl_nfv.planners.pipeline.scheduler import Policy, run
    from dl_nfv.planners.pipeline.search import boundary_moves

    from .test_pipeline_bench_cases import PROFILES
    from .test_pipeline_scale import leaf_spine

    graph = load(PROFILES / "gpt2-xl-b16-s16-r3.json", expect="op-graph")
    problem = Problem(graph, leaf_spine(2, 8, 2), tie_sync=TieSync.EXCHANGE,
                      optimizer=optimizer_named("pipeline", "sgd"))
    devices = list(problem.devices)
    rng = random.Random(3)
    layouts = []
    for _ in range(24):
        stages = rng.randint(2, 5)
        cuts = sorted(rng.sample(range(1, problem.n), stages - 1))
        ends = sorted(rng.sample(range(1, len(devices)), stages - 1))
        bounds, runs = [0, *cuts, problem.n], [0, *ends, len(devices)]
        layouts.append(Layout(tuple(StageSpec(bounds[k], bounds[k + 1],
                                              tuple(devices[runs[k]:runs[k + 1]]))
                                    for k in range(stages)), rng.choice([1, 2, 4])))
        layouts.extend(boundary_moves(layouts[-1])[:2])  # neighbours: most stages shared
    warm = [stage_costs(problem, lay, all_replicas(problem, lay)) for lay in layouts]
    assert len(problem.cache["stage_terms"]) < sum(len(lay.stages) for lay in layouts)
    for lay, costs in zip(layouts, warm):
        problem.cache.clear()
        cold = stage_costs(problem, lay, all_replicas(problem, lay))
        assert costs == cold
        for policy, split in ((Policy.LIST, True), (Policy.LIST, False), (Policy.GPIPE, False)):
            first = run(costs, policy, backward_first=True, split=split)
            assert "channels" in costs.plumbing
            again = run(costs, policy, backward_first=True, split=split)
            fresh = run(replace(cold), policy, backward_first=True, split=split)
            assert first == again == fresh
