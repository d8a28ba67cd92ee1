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
