"""Colocation: the op-graph field, the shared helpers, validate_plan's check, every planner honouring it."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import InvalidArtifact, fingerprint, from_data, from_document, to_data
from dl_nfv.artifacts.opgraph import OpGraph
from dl_nfv.planners import PLANNERS
from dl_nfv.planners.colocation import (
    allowed_cuts,
    cut_positions,
    group_of,
    placement_violations,
    uncuttable,
    units,
)
from dl_nfv.planners.validate import validate_plan

from ..artifacts.fixtures import GRAPH, TOPOLOGY, plan_doc


def _graph(colocation) -> OpGraph:
    doc = copy.deepcopy(GRAPH)
    doc["colocation"] = colocation
    return from_document(doc)


# ------------------------------------------------------------------- the field

def test_colocation_round_trips_and_defaults_to_empty():
    graph = _graph([["x", "relu"], ["fc1", "fc2"]])
    assert graph.colocation == (("x", "relu"), ("fc1", "fc2"))
    data = to_data(graph)
    assert data["colocation"] == [["x", "relu"], ["fc1", "fc2"]]
    assert from_data(OpGraph, json.loads(json.dumps(data))) == graph
    plain = from_document(copy.deepcopy(GRAPH))
    assert plain.colocation == () and "colocation" not in to_data(plain)


@pytest.mark.parametrize("colocation, message", [
    ([["x", "fc1"], ["relu", "nope"]], "colocation[1]: unknown op 'nope'"),
    ([["x"]], "colocation[0]: a colocation group needs at least 2 ops"),
    ([["x", "x"]], "colocation[0]: op 'x' is listed twice"),
    ([["x", "fc1"], ["fc2", "relu", "fc1"]], "colocation[1]: op 'fc1' is already in colocation[0]"),
])
def test_bad_colocation_names_the_group_and_the_op(colocation, message):
    with pytest.raises(InvalidArtifact) as info:
        _graph(colocation)
    assert message in str(info.value)


# ----------------------------------------------------------------- the helpers

def test_helpers_on_a_hand_checked_graph():
    # ops in file order x fc1 relu fc2; groups {fc1, fc2} and none other
    graph = _graph([["fc2", "fc1"]])
    order = ["x", "fc1", "relu", "fc2"]
    assert group_of(graph) == {"fc2": 0, "fc1": 0}
    assert units(graph) == [("x",), ("fc1", "fc2"), ("relu",)]
    assert uncuttable(graph, order) == [(1, 3)]
    # cuts 2 and 3 put fc1 and fc2 apart
    assert allowed_cuts(graph, order) == [True, True, False, False, True]
    assert cut_positions(graph, order) == [0, 1, 4]
    # a partial order: the group has one op there, nothing can split it
    assert uncuttable(graph, ["x", "fc1"]) == []
    assert placement_violations(graph, {"x": 0, "fc1": 0, "relu": 1, "fc2": 0}) == []
    (split,) = placement_violations(graph, {"x": 0, "fc1": 1, "relu": 1, "fc2": 0})
    assert (split.group, split.op, split.place, split.other_op, split.other_place) == (0, "fc2", 0, "fc1", 1)
    assert "colocation[0] is split: op 'fc2' on stage 0, op 'fc1' on stage 1" == split.describe("stage")


def test_overlapping_spans_forbid_the_union_of_their_cuts():
    graph = _graph([["x", "relu"], ["fc1", "fc2"]])
    order = ["x", "fc1", "relu", "fc2"]
    assert uncuttable(graph, order) == [(0, 2), (1, 3)]
    assert allowed_cuts(graph, order) == [True, False, False, False, True]
    assert [len(u) for u in units(graph)] == [2, 2]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_allowed_cuts_agree_with_splitting_by_enumeration(data):
    n = data.draw(st.integers(2, 9))
    order = [f"o{i}" for i in range(n)]
    labels = data.draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n))
    groups = [tuple(o for o, g in zip(order, labels) if g == k) for k in range(3)]
    groups = [g for g in groups if len(g) >= 2]
    doc = {"kind": "op-graph", "schema_version": 1, "model": {"name": "m", "batch_size": 1},
           "ops": [{"id": o, "name": o} for o in order], "colocation": [list(g) for g in groups]}
    graph = from_document(doc)
    ok = allowed_cuts(graph, order)
    for b in range(n + 1):
        side = {o: int(i >= b) for i, o in enumerate(order)}
        assert ok[b] == (not placement_violations(graph, side))
    # the units partition the ops, and every group is one unit
    flat = [o for u in units(graph) for o in u]
    assert sorted(flat) == sorted(order)
    assert set(map(frozenset, groups)) <= set(map(frozenset, units(graph)))


# --------------------------------------------------------------- validate_plan

def _fixture_pair(colocation):
    graph = _graph(colocation)
    plan_data = plan_doc()
    plan_data["graph_sha256"] = fingerprint(graph)
    return graph, from_document(plan_data), from_document(copy.deepcopy(TOPOLOGY))


def test_validate_plan_rejects_a_plan_that_splits_a_group():
    # the fixture plan: stage 0 = {x, fc1} on a/gpu0+a/gpu1, stage 1 = {relu, fc2} on b/gpu0
    graph, plan, topology = _fixture_pair([["fc1", "relu"]])
    with pytest.raises(InvalidArtifact) as info:
        validate_plan(plan, graph, topology, check_memory=False)
    text = str(info.value)
    assert "colocation[0] is split" in text
    assert "'fc1' on devices {a/gpu0, a/gpu1}" in text and "'relu' on devices {b/gpu0}" in text


def test_validate_plan_names_the_stages_when_only_the_stage_differs():
    graph, plan, topology = _fixture_pair([["fc1", "relu"]])
    groups = tuple(dataclasses.replace(g, devices=("a/gpu0",), batch_shares=(),
                                       sync=plan.groups[1].sync) for g in plan.groups)
    schedule = {"a/gpu0": "0F0 0F1 1F0 1F1 1B0 1B1 0B0 0B1"}
    plan = dataclasses.replace(plan, groups=groups,
                               pipeline=dataclasses.replace(plan.pipeline, schedule=schedule))
    with pytest.raises(InvalidArtifact, match=r"op 'fc1' on stage 0, op 'relu' on stage 1"):
        validate_plan(plan, graph, topology, check_memory=False)


def test_validate_plan_accepts_a_plan_that_keeps_groups_whole():
    graph, plan, topology = _fixture_pair([["x", "fc1"], ["relu", "fc2"]])
    validate_plan(plan, graph, topology, check_memory=False)


def test_every_partition_of_the_fixture_is_judged_like_the_helper():
    # all 2-colourings of the four ops as device sets, against an independent test
    graph = _graph([["x", "fc2"]])
    for colours in itertools.product((0, 1), repeat=4):
        place = dict(zip(["x", "fc1", "relu", "fc2"], colours))
        assert bool(placement_violations(graph, place)) == (place["x"] != place["fc2"])


# ------------------------------------------------------------- the planners

GIB = 2**30
V100 = "V100-16GB"


def _chain(layers: int, *, param_bytes: int = GIB, batch: int = 16, colocation=()) -> OpGraph:
    """Equal layers l0 -> l1 -> ... measured on a V100 (10 ms forward, 20 ms backward)."""
    ops = [{"id": f"l{i}", "name": f"layers.{i}", "kind": "block", "flops": 1e9,
            "param_bytes": param_bytes, "output_bytes": 4 * 2**20,
            "fwd_ms": {V100: 10.0}, "bwd_ms": {V100: 20.0}} for i in range(layers)]
    edges = [{"src": f"l{i}", "dst": f"l{i + 1}", "bytes": 4 * 2**20} for i in range(layers - 1)]
    return from_document({"kind": "op-graph", "schema_version": 1,
                          "model": {"name": "chain", "source": "test", "batch_size": batch},
                          "ops": ops, "edges": edges, "colocation": [list(g) for g in colocation]})


def _merged(graph: OpGraph, first: int, last: int) -> OpGraph:
    """The chain with layers ``first..last`` replaced by one op of their summed costs."""
    ops = list(graph.ops)
    inner = ops[first:last + 1]
    one = dataclasses.replace(
        inner[-1], id=f"l{first}-{last}", name=f"l{first}-{last}",
        param_bytes=sum(o.param_bytes for o in inner), flops=sum(o.flops for o in inner),
        fwd_ms={V100: sum(o.fwd_ms[V100] for o in inner)},
        bwd_ms={V100: sum(o.bwd_ms[V100] for o in inner)})
    ops[first:last + 1] = [one]
    edges = tuple(from_data(type(graph.edges[0]), {"src": a.id, "dst": b.id, "bytes": 4 * 2**20})
                  for a, b in zip(ops, ops[1:]))
    return dataclasses.replace(graph, ops=tuple(ops), edges=edges, colocation=())


def _topology(kind: str):
    if kind == "nvlink4":
        hosts = [{"name": "h", "devices": [{"type": V100, "count": 4}],
                  "interconnect": {"kind": "nvlink", "bandwidth_gbps": 200, "latency_us": 1}}]
        return from_document({"kind": "topology", "schema_version": 1, "name": kind, "hosts": hosts})
    hosts = [{"name": f"h{i}", "devices": [{"type": V100, "count": 2}],
              "interconnect": {"kind": "nvlink", "bandwidth_gbps": 200, "latency_us": 1},
              "nics": [{"switch": "sw", "bandwidth_gbps": 10, "latency_us": 5}]} for i in range(2)]
    return from_document({"kind": "topology", "schema_version": 1, "name": kind, "hosts": hosts,
                          "switches": [{"name": "sw"}]})


def _stages(plan) -> list[tuple[str, ...]]:
    by_id = {g.id: g for g in plan.groups}
    return [by_id[gid].ops for gid in plan.pipeline.stages]


# l1-l2 straddles the cut at 2 and l5..l7 the cut at 6, where an 8-layer chain on 4 devices
# is cut without colocation
GROUPS = (("l1", "l2"), ("l5", "l7"))


@pytest.mark.parametrize("planner", ["gpipe", "1f1b"])
def test_even_split_keeps_groups_whole_and_is_the_best_split_that_does(planner):
    from dl_nfv.planners import run

    topology = _topology("nvlink4")
    free = run(planner, _chain(8), topology)
    assert [len(s) for s in _stages(free)] == [2, 2, 2, 2]  # the natural cuts split both groups
    graph = _chain(8, colocation=GROUPS)
    plan = run(planner, graph, topology)
    validate_plan(plan, graph, topology)
    stages = _stages(plan)
    assert len(stages) == 4
    for group in GROUPS:
        assert sum(set(group) <= set(s) for s in stages) == 1
    # by enumeration: every 4-stage split whose cuts keep l1,l2 and l5..l7 together; equal
    # layers, so the largest stage's layer count is what the even split minimises
    best = min(max(b - a for a, b in zip((0, *cuts), (*cuts, 8)))
               for cuts in itertools.combinations(range(1, 8), 3)
               if 2 not in cuts and 6 not in cuts and 7 not in cuts)
    assert best == 3
    assert max(len(s) for s in stages) == best


@pytest.mark.parametrize("topology_kind", ["nvlink4", "two-hosts"])
def test_pipedream_partitions_as_if_each_group_were_one_op(topology_kind):
    from dl_nfv.planners import run

    topology = _topology(topology_kind)
    graph = _chain(8, colocation=GROUPS)
    free = run("pipedream", _chain(8), topology)
    stage_of = {op: k for k, s in enumerate(_stages(free)) for op in s}
    assert placement_violations(graph, stage_of)  # unconstrained, it splits a group
    plan = run("pipedream", graph, topology)
    validate_plan(plan, graph, topology)
    # an independent reading of the constraint: merge each group's span into one op and let
    # the unconstrained DP partition that chain; both give the same stages and replication
    merged = _merged(_merged(_chain(8), 5, 7), 1, 2)
    reference = run("pipedream", merged, topology)
    expand = {"l1-2": ("l1", "l2"), "l5-7": ("l5", "l6", "l7")}
    expected = [tuple(o for op in s for o in expand.get(op, (op,))) for s in _stages(reference)]
    assert _stages(plan) == expected
    assert ([len(g.devices) for g in plan.groups] == [len(g.devices) for g in reference.groups])


@pytest.mark.parametrize("planner", ["dp", "dp-ps", "single"])
def test_whole_model_planners_keep_every_group_on_one_device_set(planner):
    from dl_nfv.planners import run

    topology = _topology("two-hosts")
    graph = _chain(6, param_bytes=64 * 2**20, colocation=(("l0", "l5"), ("l2", "l3")))
    plan = run(planner, graph, topology)
    validate_plan(plan, graph, topology)
    devices = plan.devices_of_op
    assert devices["l0"] == devices["l5"] and devices["l2"] == devices["l3"]


@settings(max_examples=8, deadline=None)
@given(st.data())
def test_baselines_keep_random_groups_whole_on_random_dags(data):
    from dl_nfv.planners import run

    n = data.draw(st.integers(3, 7), label="ops")
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = data.draw(st.lists(st.sampled_from(pairs), unique=True, max_size=2 * n), label="edges")
    labels = data.draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n), label="groups")
    groups = [[f"o{i}" for i in range(n) if labels[i] == k] for k in range(2)]
    ops = [{"id": f"o{i}", "name": f"o{i}", "param_bytes": 2**20 * (i + 1), "output_bytes": 2**16,
            "fwd_ms": {V100: 1.0 + i}, "bwd_ms": {V100: 2.0 + i}} for i in range(n)]
    graph = from_document({
        "kind": "op-graph", "schema_version": 1, "model": {"name": "dag", "batch_size": 8},
        "ops": ops, "edges": [{"src": f"o{i}", "dst": f"o{j}", "bytes": 2**16} for i, j in edges],
        "colocation": [g for g in groups if len(g) >= 2]})
    topology = _topology("nvlink4")
    for planner in ("dp", "single", "gpipe", "1f1b", "pipedream"):
        plan = run(planner, graph, topology)
        validate_plan(plan, graph, topology)


@pytest.mark.parametrize("planner", sorted(PLANNERS))
def test_every_planner_keeps_colocation_groups_whole(planner):
    """The registry's contract: whatever the planner, a group spanning the natural cut points
    of a chain ends up on one device set and in one stage, as validate_plan checks."""
    from dl_nfv.planners import run

    topology = _topology("nvlink4")
    graph = _chain(8, param_bytes=256 * 2**20, colocation=GROUPS)
    plan = run(planner, graph, topology)
    validate_plan(plan, graph, topology)
    devices = plan.devices_of_op
    assert devices["l1"] == devices["l2"] and devices["l5"] == devices["l6"] == devices["l7"]
