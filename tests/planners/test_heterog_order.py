"""HeteroG's per-device execution order: a priority per op group, list-scheduled into the
plan's ``order``, which the simulator follows.

Hand case, on the V100 + T4 toy cluster: an input ``x`` feeds ``a`` and ``b``, both on the
V100 (4 ms forward each); ``a`` feeds ``c`` on the T4 (6 ms). No op has parameters, so a
step is the forward pass alone. With ``a`` first, ``c`` starts when ``a``'s output has
crossed the network: the step takes ``x + 4 + transfer + 6`` ms. With ``b`` first, ``a``
and so ``c`` start 4 ms later: ``x + 8 + transfer + 6``. The transfer is the route's
latency plus its bytes at the route's bandwidth (25 Gbps NICs through one switch).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dl_nfv.artifacts import from_document, load
from dl_nfv.planners import run
from dl_nfv.planners.learned.coarsen import Coarsening
from dl_nfv.planners.learned.env import GroupStrategy, StrategyEnv
from dl_nfv.planners.learned.order import OrderScheduler, refine_order, topological_priorities
from dl_nfv.planners.validate import validate_plan
from dl_nfv.simulator import simulate
from tests.planners.test_dp_baselines import v100_t4_topology

V100, T4 = "a/gpu0", "b/gpu0"
A_TO_C_BYTES = 1_000_000
ROOT = Path(__file__).resolve().parents[2]


def _graph():
    op = lambda i, v100, t4: {"id": i, "name": i, "kind": "matmul", "output_bytes": 4096,  # noqa: E731
                              "fwd_ms": {"V100-16GB": v100, "T4": t4},
                              "bwd_ms": {"V100-16GB": v100, "T4": t4}}
    ops = [{"id": "x", "name": "x", "kind": "input", "output_bytes": 4096},
           op("a", 4.0, 8.0), op("b", 4.0, 8.0), op("c", 3.0, 6.0)]
    edges = [{"src": "x", "dst": "a", "bytes": 4096}, {"src": "x", "dst": "b", "bytes": 4096},
             {"src": "a", "dst": "c", "bytes": A_TO_C_BYTES}]
    return from_document({"kind": "op-graph", "schema_version": 1,
                          "model": {"name": "fork", "batch_size": 4}, "ops": ops, "edges": edges})


def _env():
    graph, topology = _graph(), v100_t4_topology()
    coarsening = Coarsening(groups=(("x", "a"), ("b",), ("c",)),
                            edges={(0, 1): 4096.0, (0, 2): float(A_TO_C_BYTES)})
    env = StrategyEnv(graph, topology, coarsening)
    strategies = (GroupStrategy(devices=(V100,)), GroupStrategy(devices=(V100,)),
                  GroupStrategy(devices=(T4,)))
    return env, strategies


def _fixed_ms(env) -> float:
    """The input's own time and a's output crossing from the V100 to the T4 (the route's
    latency plus its bytes at the route's bandwidth): the same in both orders."""
    latency_ms, ms_per_byte = env.cm.transfer_affine(V100, T4)
    return env.cm.ops_ms(["x"], V100, 1.0)[0] + latency_ms + A_TO_C_BYTES * ms_per_byte


@pytest.mark.parametrize(("priorities", "first", "expected_ms"), [
    ((3.0, 2.0, 1.0), "a", 4.0 + 6.0),
    ((2.0, 3.0, 1.0), "b", 8.0 + 6.0),
])
def test_group_priorities_order_the_device_and_the_simulator_follows(priorities, first, expected_ms):
    env, strategies = _env()
    plan = env.plan_of(strategies)
    order = OrderScheduler(env, plan).order(priorities)
    second = "b" if first == "a" else "a"
    assert order == {V100: ("x", first, second), T4: ("c",)}
    ordered = replace(plan, order=order)
    validate_plan(ordered, env.graph, env.topology)
    result = simulate(ordered, env.graph, env.topology, check_fingerprints=False)
    assert result.iteration_ms == pytest.approx(expected_ms + _fixed_ms(env), abs=1e-6)


def test_the_order_search_finds_the_better_priority_from_the_worse_one():
    env, strategies = _env()
    got = refine_order(env, strategies, priorities=(2.0, 3.0, 1.0))
    assert got.order[V100] == ("x", "a", "b") and got.swaps == 1
    assert got.priorities[0] > got.priorities[1]
    assert got.outcome.iteration_ms == pytest.approx(10.0 + _fixed_ms(env), abs=1e-6)
    # without an order the simulator runs the topological order, a first: the same step
    assert got.unordered.iteration_ms == pytest.approx(got.outcome.iteration_ms, abs=1e-9)
    assert got.helps


def test_groups_compete_only_when_they_share_a_device_and_neither_depends_on_the_other():
    env, strategies = _env()
    scheduler = OrderScheduler(env, env.plan_of(strategies))
    # group 0 (x, a) and 1 (b): both on the V100, b does not depend on a; group 2 (c) is alone
    # on the T4
    assert scheduler.competing() == [(0, 1)]
    assert topological_priorities(3) == (3.0, 2.0, 1.0)


@pytest.mark.parametrize("model", ["inception-v3-b32-r3"])
def test_a_heterog_plan_carries_an_order_of_every_op_on_each_device(model):
    graph = load(ROOT / "bench" / "profiles" / f"{model}.json", expect="op-graph")
    topology = load(ROOT / "examples" / "topologies" / "mixed-a100-t4-2rack.yaml", expect="topology")
    plan = run("heterog", graph, topology, max_evaluations=60, order_evaluations=20)
    validate_plan(plan, graph, topology, check_fingerprints=True)
    # heterog's own strategy (several times faster than data parallelism here), not a baseline
    assert not any("data-parallel baseline" in n for n in plan.notes), plan.notes
    held = {d: sorted(op for g in plan.groups if d in g.devices for op in g.ops)
            for d in plan.devices}
    assert {d: sorted(ops) for d, ops in plan.order.items()} == held
    assert any("execution order" in n for n in plan.notes)
    again = simulate(plan, graph, topology)
    assert again.iteration_ms == pytest.approx(plan.prediction.iteration_ms, abs=1e-6)
