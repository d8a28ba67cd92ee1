"""The lower bounds against every plan of tiny problems, each simulated by the one simulator.

A bound is a bound only if no plan of its family beats it. For problems small enough to
enumerate (up to four ops, up to three devices of mixed types, links with and without
collective figures of their own), every plan of the family is built with the planners' own
construction helpers, simulated, and the bound checked against the best:

* pipeline family (``pipeline_bound``, which every pipeline planner reports): every
  partition of the topological order into stages, every assignment of disjoint device sets
  to the stages, every microbatch count, every whole-sample split of a microbatch over a
  stage's replicas, the GPipe, 1F1B and list-scheduled orders, and a replicated first
  stage's gradient buckets at each cap the planner drafts (one stage and one microbatch is
  data parallelism);
* placement family (``lower_bound`` as fastt, dp, single and Baechi call it): every map
  of ops to devices (and on a device with independent ops, every order of them), and for
  up to three ops every replication of each op over a device set with every whole-sample
  split of the batch.

Problems come from hypothesis (derandomised, a bounded number of examples).
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import (
    Edge,
    Fusion,
    Group,
    ModelRef,
    Op,
    OpGraph,
    OpKind,
    Plan,
    SyncMethod,
    TieSync,
    Topology,
    fingerprint,
    from_data,
)
from dl_nfv.planners.bounds import lower_bound, ranges, stage_balanced_bound_ms
from dl_nfv.planners.pipeline.build import (
    BUCKET_CAPS,
    Replicas,
    groups_and_pipeline,
    stage_buckets,
    stage_costs,
)
from dl_nfv.planners.pipeline.partition import Layout, StageSpec
from dl_nfv.planners.pipeline.planner import pipeline_bound
from dl_nfv.planners.pipeline.problem import Problem
from dl_nfv.planners.pipeline.scheduler import Policy, schedule_options
from dl_nfv.planners.schedules import gpipe, one_f_one_b
from dl_nfv.simulator import CostModel, simulate

MIB = 2**20
TYPES = ("V100-16GB", "T4", "P100")
TOLERANCE = 1e-6  # relative: the bound and the simulator add the same times in other orders
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------------- problems
@st.composite
def graphs(draw, most_ops: int = 4) -> OpGraph:
    """A chain or a diamond of up to ``most_ops`` ops, measured on every type, some without
    parameters (whose backward runs only below an op with parameters)."""
    n = draw(st.integers(1, most_ops))
    diamond = n == 4 and draw(st.booleans())
    batch = draw(st.sampled_from((2, 4)))
    slow = {t: draw(st.sampled_from((1.0, 1.5, 2.5))) for t in TYPES[1:]}
    ops = []
    for i in range(n):
        fwd = draw(st.sampled_from((1.0, 4.0, 10.0, 30.0)))
        bwd = fwd * draw(st.sampled_from((1.0, 2.0)))
        params = draw(st.sampled_from((0, 0, 16 * MIB, 256 * MIB)))
        split = draw(st.booleans()) and params > 0
        factors = {TYPES[0]: 1.0, **slow}
        ops.append(Op(id=f"o{i}", name=f"o{i}", kind=OpKind.BLOCK, flops=1e9,
                      param_bytes=params, output_bytes=draw(st.sampled_from((MIB, 32 * MIB))),
                      fwd_ms={t: fwd * k for t, k in factors.items()},
                      bwd_ms={t: bwd * k for t, k in factors.items()},
                      bwd_flops=2e9, bwd_input_flops=1e9 if split else None))
    pairs = ([(0, 1), (0, 2), (1, 3), (2, 3)] if diamond
             else [(i, i + 1) for i in range(n - 1)])
    edges = tuple(Edge(src=f"o{a}", dst=f"o{b}", bytes=ops[a].output_bytes) for a, b in pairs)
    return OpGraph(model=ModelRef(name="tiny", source="test", batch_size=batch),
                   ops=tuple(ops), edges=edges)


@st.composite
def topologies(draw) -> Topology:
    """Two or three devices of mixed types on one host or two, NVLink, PCIe or loopback (both
    directions of a link share it) inside a host, perhaps with collective figures above or
    below the links' own, NICs to a switch."""
    types = draw(st.lists(st.sampled_from(TYPES), min_size=2, max_size=3))
    two_hosts = draw(st.booleans())
    split = draw(st.integers(1, len(types) - 1)) if two_hosts else len(types)
    hosts = []
    for h, members in enumerate((types[:split], types[split:])):
        if not members:
            continue
        interconnect = {"kind": draw(st.sampled_from(("nvlink", "pcie", "loopback"))),
                        "bandwidth_gbps": draw(st.sampled_from((10, 100))), "latency_us": 2}
        collective = draw(st.sampled_from((None, 5, 400)))
        if collective:
            interconnect["collective_bandwidth_gbps"] = collective
            interconnect["collective_latency_us"] = draw(st.sampled_from((1, 20)))
        host = {"name": f"h{h}", "devices": [{"type": t} for t in members],
                "interconnect": interconnect}
        if two_hosts:
            host["nics"] = [{"switch": "sw", "bandwidth_gbps": draw(st.sampled_from((10, 50))),
                             "latency_us": 5}]
        hosts.append(host)
    doc = {"kind": "topology", "schema_version": 1, "name": "tiny", "hosts": hosts}
    if two_hosts:
        doc["switches"] = [{"name": "sw"}]
    return from_data(Topology, doc)


def _simulated_ms(plan: Plan, graph: OpGraph, topology: Topology, cm: CostModel) -> float:
    result = simulate(plan, graph, topology, cost_model=cm, check_fingerprints=False)
    return result.iteration_ms if result.feasible else math.inf


def _plan(graph: OpGraph, topology: Topology, groups, **parts) -> Plan:
    return Plan(planner="oracle", graph_sha256=fingerprint(graph),
                topology_sha256=fingerprint(topology), batch_size=graph.model.batch_size,
                groups=tuple(groups), **parts)


def _compositions(total: int, parts: int):
    """Every split of ``total`` into ``parts`` positive integers."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        yield tuple(b - a for a, b in zip((0, *cuts), (*cuts, total)))


def _device_sets(devices, stages: int):
    """Every sequence of ``stages`` disjoint non-empty device sets."""
    for labels in itertools.product(range(stages + 1), repeat=len(devices)):
        sets = [tuple(d for d, x in zip(devices, labels) if x == s + 1) for s in range(stages)]
        if all(sets):
            yield sets


# ------------------------------------------------------------------------- pipeline family
def pipeline_plans(problem: Problem):
    """Every plan of the pipeline family on ``problem`` (see the module docstring)."""
    n, B = problem.n, problem.batch_size
    for stages in range(1, min(n, len(problem.devices)) + 1):
        for cuts in itertools.combinations(range(1, n), stages - 1):
            edges = (0, *cuts, n)
            for device_sets in _device_sets(problem.devices, stages):
                for m in (m for m in range(1, B + 1) if B % m == 0):
                    samples = B // m
                    splits = [list(_compositions(samples, len(s))) for s in device_sets]
                    for counts in itertools.product(*splits):
                        layout = Layout(tuple(StageSpec(a, b, devs) for a, b, devs in
                                              zip(edges, edges[1:], device_sets)), m)
                        reps = [Replicas(d, c) for d, c in zip(device_sets, counts)]
                        yield from _scheduled(problem, layout, reps)


def _scheduled(problem: Problem, layout: Layout, reps):
    """``layout`` under every schedule and first-stage bucketing the planner drafts."""
    S, m = len(layout.stages), layout.microbatches
    schedules = {gpipe(S, m), one_f_one_b(S, m)}
    try:
        costs = stage_costs(problem, layout, reps)
        schedules |= {t.schedule for t in schedule_options(costs, (Policy.LIST,), wide=True)}
    except ValueError:  # no list schedule fits the memory caps
        pass
    fusions = {None, *(stage_buckets(problem, layout, reps, cap) for cap in BUCKET_CAPS)}
    for schedule in sorted(schedules, key=lambda s: s.texts()):
        groups, pipeline = groups_and_pipeline(problem, layout, reps, schedule)
        for fusion in fusions:
            yield _plan(problem.graph, problem.topology, groups, pipeline=pipeline,
                        fusion=fusion, tie_sync=problem.tie_sync)


@SETTINGS
@given(graphs(), topologies())
def test_the_pipeline_bound_is_below_every_pipeline_plan(graph, topology):
    problem = Problem(graph, topology, tie_sync=TieSync.EXCHANGE)
    best = min(_simulated_ms(plan, graph, topology, problem.cm)
               for plan in pipeline_plans(problem))
    bound = pipeline_bound(problem)
    assert bound.ms <= best * (1 + TOLERANCE), (bound.parts, best)


@settings(SETTINGS, max_examples=40)
@given(graphs(), topologies(), st.sampled_from((1, 2, 3)))
def test_the_bound_over_merged_regions_is_below_every_pipeline_plan(graph, topology, most):
    """The stage-balanced bound with runs of light regions merged into blocks (the path of
    graphs of more than ``ranges.EXACT_REGIONS_UP_TO`` regions), here past ``most``."""
    problem = Problem(graph, topology, tie_sync=TieSync.EXCHANGE)
    best = min(_simulated_ms(plan, graph, topology, problem.cm)
               for plan in pipeline_plans(problem))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ranges, "EXACT_REGIONS_UP_TO", most)
        bound = stage_balanced_bound_ms(problem)
    assert bound <= best * (1 + TOLERANCE), (bound, best)


def test_a_collective_faster_than_its_links_bounds_below_data_parallelism():
    """Two V100s whose NVLink carries 10 Gbps point to point and 100 Gbps to an AllReduce;
    one layer of 100 + 200 ms and 256 MiB of parameters, batch 8: data parallelism is the
    best plan, its AllReduce at the collective figure. The bound takes that figure too."""
    graph = OpGraph(model=ModelRef(name="one", source="test", batch_size=8), ops=(
        Op(id="l0", name="l0", kind=OpKind.BLOCK, flops=1e9, param_bytes=256 * MIB,
           output_bytes=4 * MIB, fwd_ms={TYPES[0]: 100.0}, bwd_ms={TYPES[0]: 200.0}),))
    topology = from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "nvlink2",
        "hosts": [{"name": "h", "devices": [{"type": TYPES[0], "count": 2}],
                   "interconnect": {"kind": "nvlink", "bandwidth_gbps": 10,
                                    "collective_bandwidth_gbps": 100}}]})
    problem = Problem(graph, topology, tie_sync=TieSync.EXCHANGE)
    plans = list(pipeline_plans(problem))
    best = min(_simulated_ms(plan, graph, topology, problem.cm) for plan in plans)
    assert len(plans) > 1 and best < 200.0  # replicated: below one device's 300 ms
    assert pipeline_bound(problem).ms <= best
    cm = problem.cm
    assert lower_bound(cm, list(cm.cluster.device_names)).ms <= best


# ------------------------------------------------------------------------ placement family
def _orders(graph: OpGraph, placed: dict[str, str]):
    """Every per-device order of the ops ``placed`` on each device that follows the graph."""
    order = graph.topological_ids()
    preds = {o: set() for o in order}
    for e in graph.edges:
        preds[e.dst].add(e.src)
    ancestors: dict[str, set[str]] = {}
    for o in order:
        ancestors[o] = set(preds[o]).union(*(ancestors[p] for p in preds[o]))
    per_device = {}
    for device in sorted(set(placed.values())):
        ops = [o for o in order if placed[o] == device]
        per_device[device] = [p for p in itertools.permutations(ops)
                              if all(a not in ancestors[b] for i, b in enumerate(p)
                                     for a in p[i + 1:])]
    for choice in itertools.product(*per_device.values()):
        yield dict(zip(per_device, choice))


def placement_plans(graph: OpGraph, topology: Topology, devices):
    """Every plan of the placement family (see the module docstring), each with whether it
    runs every op whole on one device."""
    ids = [op.id for op in graph.ops]
    B = graph.model.batch_size
    for where in itertools.product(devices, repeat=len(ids)):
        placed = dict(zip(ids, where))
        groups = [Group(id=o, ops=(o,), devices=(d,)) for o, d in placed.items()]
        for order in _orders(graph, placed):
            yield _plan(graph, topology, groups, order=order), True
    if len(ids) > 3:
        return
    subsets = [s for k in range(2, len(devices) + 1) for s in itertools.combinations(devices, k)]
    options = [((d,), ()) for d in devices] + [
        (s, tuple(c / B for c in counts)) for s in subsets for counts in _compositions(B, len(s))]
    for choice in itertools.product(options, repeat=len(ids)):
        if all(len(devs) == 1 for devs, _ in choice):
            continue  # above, with their orders
        groups = [Group(id=o, ops=(o,), devices=devs, batch_shares=shares,
                        sync=SyncMethod.ALLREDUCE if shares else SyncMethod.NONE)
                  for o, (devs, shares) in zip(ids, choice)]
        yield _plan(graph, topology, groups), False
        if all(devs == choice[0][0] and shares == choice[0][1] for devs, shares in choice):
            whole = Group(id="all", ops=tuple(ids), devices=choice[0][0],
                          batch_shares=choice[0][1], sync=SyncMethod.ALLREDUCE)
            yield _plan(graph, topology, [whole]), False
            yield _plan(graph, topology, [whole], fusion=Fusion(gradient_buckets=tuple(
                (o,) for o in reversed(ids) if graph.index[o].param_bytes))), False


@SETTINGS
@given(graphs(), topologies())
def test_the_placement_bound_is_below_every_placement(graph, topology):
    cm = CostModel(graph, topology)
    devices = list(cm.cluster.device_names)
    simulated, by_group = [], {}
    for plan, whole in placement_plans(graph, topology, devices):
        ms = _simulated_ms(plan, graph, topology, cm)
        simulated.append((ms, whole))
        if len(plan.groups) == 1:  # data parallelism over the group's devices
            group = plan.groups[0].devices
            by_group[group] = min(by_group.get(group, math.inf), ms)
    best = min(ms for ms, _ in simulated)
    # as fastt reports it: the critical path at one device's share of the batch (at least
    # the default, one sample)
    k = min(len(devices), graph.model.batch_size)
    bound = lower_bound(cm, devices, min_batch_fraction=1.0 / k)
    assert lower_bound(cm, devices).ms <= bound.ms <= best * (1 + TOLERANCE), (bound.parts, best)
    # plans that run every op whole on one device: the largest op bounds them too
    unreplicated = min(ms for ms, whole in simulated if whole)
    strict = lower_bound(cm, devices, ops_splittable=False)
    assert strict.ms <= unreplicated * (1 + TOLERANCE), (strict.parts, unreplicated)
    # as dp reports it: one group, whose largest share is at least 1 / its devices
    for group, ms in by_group.items():
        dp = lower_bound(cm, group, min_batch_fraction=1.0 / len(group))
        assert dp.ms <= ms * (1 + TOLERANCE), (group, dp.parts, ms)
