"""Lower bounds against hand computations, and the shared planner helpers."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dl_nfv.artifacts import from_document
from dl_nfv.planners.base import gradient_buckets, integer_shares, replicas
from dl_nfv.planners.bounds import critical_path_ms, largest_op_ms, lower_bound, work_bound_ms
from dl_nfv.simulator.costs import CostModel
from tests.artifacts.fixtures import TOPOLOGY


def _chain_graph(times_ms, params=(40, 0, 0, 0)):
    ops, edges = [], []
    for i, (t, p) in enumerate(zip(times_ms, params)):
        ops.append({"id": f"l{i}", "name": f"l{i}", "kind": "matmul", "param_bytes": p,
                    "output_bytes": 1000, "fwd_ms": {"V100-16GB": t, "T4": 2 * t},
                    "bwd_ms": {"V100-16GB": 2 * t, "T4": 4 * t}, "splittable_dims": [0]})
        if i:
            edges.append({"src": f"l{i - 1}", "dst": f"l{i}", "bytes": 1000})
    return from_document({"kind": "op-graph", "schema_version": 1,
                          "model": {"name": "chain", "batch_size": 8}, "ops": ops, "edges": edges})


def test_work_bound_is_total_work_over_relative_capacity():
    graph = _chain_graph([1.0, 2.0, 3.0, 4.0])
    cm = CostModel(graph, from_document(copy.deepcopy(TOPOLOGY)))
    # two V100 (speed 1) and one T4 (half speed): capacity 2.5; work on V100 = 3 * 10 ms
    assert work_bound_ms(cm, ["a/gpu0", "a/gpu1", "b/gpu0"]) == pytest.approx(30.0 / 2.5)
    assert work_bound_ms(cm, ["b/gpu0"]) == pytest.approx(60.0)


def test_critical_path_and_largest_op():
    graph = _chain_graph([1.0, 2.0, 3.0, 4.0])
    cm = CostModel(graph, from_document(copy.deepcopy(TOPOLOGY)))
    devices = ["a/gpu0", "a/gpu1"]
    assert critical_path_ms(cm, devices, 1.0) == pytest.approx(30.0)
    launch = 0.005  # V100 launch overhead (5 us) does not shrink with the batch
    expected = sum(launch + (3 * t - 2 * launch) * 0.5 + launch for t in (1, 2, 3, 4))
    assert critical_path_ms(cm, devices, 0.5) == pytest.approx(expected)
    assert largest_op_ms(cm, devices) == pytest.approx(12.0)
    # plans that may replicate ops: the critical path at one sample of the batch of 8
    one = sum(launch + (3 * t - 2 * launch) / 8 + launch for t in (1, 2, 3, 4))
    bound = lower_bound(cm, devices)
    assert bound.parts == pytest.approx({"work": 15.0, "critical_path": one})
    assert lower_bound(cm, devices, min_batch_fraction=0.5).ms == pytest.approx(expected)
    # plans that run every op whole on one device: the whole chain, and the largest op
    whole = lower_bound(cm, devices, ops_splittable=False)
    assert whole.parts == pytest.approx({"work": 15.0, "critical_path": 30.0, "largest_op": 12.0})
    assert whole.binding == "critical_path"


def test_no_backward_is_counted_above_the_first_op_with_parameters():
    """The simulator runs the backward of an op only when it or an ancestor has parameters:
    in a chain of 1, 2, 3, 4 ms whose third op is the first with parameters, the backwards
    of the first two never run (6 ms of the 30 ms of work)."""
    graph = _chain_graph([1.0, 2.0, 3.0, 4.0], params=(0, 0, 40, 0))
    cm = CostModel(graph, from_document(copy.deepcopy(TOPOLOGY)))
    assert [cm.needs_grad[f"l{i}"] for i in range(4)] == [False, False, True, True]
    devices = ["a/gpu0"]
    assert work_bound_ms(cm, devices) == pytest.approx(1 + 2 + 3 * 3 + 3 * 4)
    assert critical_path_ms(cm, devices) == pytest.approx(24.0)
    assert largest_op_ms(cm, devices) == pytest.approx(12.0)


@given(st.integers(1, 512), st.lists(st.floats(0.01, 100), min_size=1, max_size=16))
def test_integer_shares_sum_and_proportion(batch, weights):
    counts = integer_shares(batch, weights)
    assert sum(counts) == batch and all(c >= 0 for c in counts)
    total = sum(weights)
    for c, w in zip(counts, weights):
        assert abs(c - batch * w / total) < 1.0 + 1e-9
    devices, shares = replicas([f"d{i}" for i in range(len(weights))], counts)
    assert len(devices) == sum(1 for c in counts if c) and abs(sum(shares) - 1.0) < 1e-9


def test_gradient_buckets_reverse_order_and_size():
    graph = _chain_graph([1, 1, 1, 1], params=(40, 0, 30, 30))
    buckets = gradient_buckets(graph, [op.id for op in graph.ops], bucket_bytes=50)
    assert buckets == (("l3", "l2"), ("l0",))


def test_critical_path_of_plans_that_split_their_backwards():
    # a chain of 1, 2, 3, 4 ms forwards, backwards twice that, half of each backward's FLOPs
    # input gradients: the forwards (10 ms) and the I's back (10 ms), then the first op's W
    # (1 ms); or F0 F1 F2 F3 I3 I2 I1, then W1 (1 + 2 + 3 + 4 + 4 + 3 + 2 + 2 = 21 ms too)
    graph = _chain_graph([1.0, 2.0, 3.0, 4.0])
    split = dataclasses.replace(graph, ops=tuple(
        dataclasses.replace(op, bwd_flops=2.0, bwd_input_flops=1.0) for op in graph.ops))
    devices = ["a/gpu0", "a/gpu1"]
    topo = from_document(copy.deepcopy(TOPOLOGY))
    cm = CostModel(split, topo)
    assert critical_path_ms(cm, devices, 1.0) == pytest.approx(30.0)
    assert critical_path_ms(cm, devices, 1.0, split_backwards=True) == pytest.approx(21.0)
    # without the split profiled, nothing may wait: the whole chain
    assert critical_path_ms(CostModel(graph, topo), devices, 1.0,
                            split_backwards=True) == pytest.approx(30.0)
