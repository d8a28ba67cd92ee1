"""``pipeline`` with one device per stage against ``exact``'s optimum on the same objective.

Exact's bottleneck is the least any contiguous single-device split reaches, so the
pipeline planner's plan (restricted by ``max_replicas=1``) can only match or exceed it:
``ratio >= 1`` is a theorem, and ``ratio <= 1.05`` is the quality asked of the pipeline
planner's coarsening, here on graphs small enough to plan in seconds but past the
coarsening threshold, with colocation groups that no stage may split.
"""

from __future__ import annotations

import numpy as np
import pytest

from dl_nfv.artifacts import Edge, ModelRef, Op, OpGraph, OpKind, Topology, from_data
from dl_nfv.planners import run
from dl_nfv.planners.exact.stages import evaluate
from dl_nfv.planners.pipeline.problem import MAX_UNITS, Problem

MIB = 2**20
V100 = "V100-16GB"


def residual_net(blocks: int, *, batch: int = 32, groups: bool = False) -> OpGraph:
    """``blocks`` residual blocks of four ops (a -> b -> c, a -> add, c -> add) with uneven
    times (a deterministic pattern), a layer norm's statistics on a side branch of ``b``;
    with ``groups``, each block's ``a`` and ``c`` colocated."""
    ops, edges, colocation = [Op(id="x", name="x", kind=OpKind.INPUT, output_bytes=4 * MIB)], [], []
    prev = "x"
    for k in range(blocks):
        ms = 1.0 + (k * 7 % 5) * 0.6
        names = [f"a{k}", f"b{k}", f"s{k}", f"c{k}", f"add{k}"]
        times = [ms, 2 * ms, 0.1, ms * 1.5, 0.2]
        for name, t in zip(names, times):
            ops.append(Op(id=name, name=name, kind=OpKind.BLOCK, flops=1e9,
                          param_bytes=8 * MIB if name[0] in "abc" else 0, output_bytes=4 * MIB,
                          fwd_ms={V100: t}, bwd_ms={V100: 2 * t}))
        edges += [Edge(src=prev, dst=f"a{k}", bytes=4 * MIB),
                  Edge(src=f"a{k}", dst=f"b{k}", bytes=4 * MIB),
                  Edge(src=f"b{k}", dst=f"s{k}", bytes=4 * MIB),
                  Edge(src=f"s{k}", dst=f"c{k}", bytes=MIB // 64),
                  Edge(src=f"b{k}", dst=f"c{k}", bytes=4 * MIB),
                  Edge(src=f"a{k}", dst=f"add{k}", bytes=4 * MIB),
                  Edge(src=f"c{k}", dst=f"add{k}", bytes=4 * MIB)]
        if groups:
            colocation.append((f"a{k}", f"c{k}"))
        prev = f"add{k}"
    return OpGraph(model=ModelRef(name=f"residual{blocks}", source="test", batch_size=batch),
                   ops=tuple(ops), edges=tuple(edges), colocation=tuple(colocation))


def mesh(count: int) -> Topology:
    return from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": f"mesh{count}",
        "hosts": [{"name": "h", "devices": [{"type": V100, "count": count}],
                   "interconnect": {"kind": "nvlink", "bandwidth_gbps": 200, "latency_us": 2}}]})


def ratio_to_exact(graph: OpGraph, topology: Topology, microbatches: int) -> float:
    """The pipeline plan's bottleneck over exact's, both by ``stages.evaluate``."""
    def bottleneck(plan) -> float:
        stages = [(g.ops, g.devices[0]) for g in plan.groups]
        objective = evaluate(graph, topology, stages, microbatches=microbatches)
        assert objective.feasible
        return objective.bottleneck_ms

    exact = run("exact", graph, topology, microbatches=microbatches)
    pipe = run("pipeline", graph, topology, microbatches=microbatches, max_replicas=1,
               schedule="1f1b")
    assert all(len(g.devices) == 1 for g in pipe.groups)
    return bottleneck(pipe) / bottleneck(exact)


@pytest.mark.parametrize("blocks, devices, groups", [(6, 4, False), (30, 4, True), (30, 8, False)])
def test_pipeline_comes_within_5_percent_of_exact(blocks, devices, groups):
    graph = residual_net(blocks, groups=groups)
    ratio = ratio_to_exact(graph, mesh(devices), microbatches=32)
    assert 1.0 - 1e-9 <= ratio <= 1.05, f"pipeline / exact = {ratio:.4f}"


def test_coarsening_keeps_colocation_groups_whole():
    graph = residual_net(60, groups=True)  # 301 ops, 121 cuts that keep the groups: coarsened
    problem = Problem(graph, mesh(4))
    assert problem.coarsened and problem.n <= MAX_UNITS
    unit = np.searchsorted(problem.bounds, np.arange(len(problem.order)), side="right") - 1
    for a, c in graph.colocation:
        assert unit[problem.pos[a]] == unit[problem.pos[c]]


def test_finer_units_split_the_units_around_a_layouts_cuts_and_keep_its_stages():
    from dl_nfv.planners.pipeline.partition import Layout, StageSpec
    from dl_nfv.planners.pipeline.search import finer_units, on_units

    graph = residual_net(60, groups=True)
    coarse = Problem(graph, mesh(4))
    cuts = (0, 30, 61, coarse.n)
    layout = Layout(tuple(StageSpec(a, b, (d,)) for a, b, d in zip(cuts, cuts[1:], coarse.devices)),
                    4)
    fine = finer_units(coarse, [layout])
    assert set(coarse.bounds) <= set(fine.bounds) <= set(coarse.allowed)
    for u in cuts[1:-1]:  # every allowed cut from the unit before the cut to the unit after
        lo, hi = coarse.bounds[u - 1], coarse.bounds[u + 1]
        assert {int(c) for c in coarse.allowed if lo <= c <= hi} <= set(fine.bounds.tolist())
    moved = on_units(layout, coarse, fine)
    assert [fine.stage_ops(s.start, s.stop) for s in moved.stages] == \
        [coarse.stage_ops(s.start, s.stop) for s in layout.stages]
