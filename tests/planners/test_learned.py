"""The learned planners' shared machinery: coarsening, featurisation, encoder, environment.

The toy cluster is one V100 (host ``a``) and one T4 (host ``b``), each with a 25 Gbps,
5 us NIC to one switch; the toy graph has a branch (for depth) and a colocation group.
Expected values come from those figures, not from the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from dl_nfv.artifacts import Group, OpKind, Plan, SyncMethod, fingerprint, from_document
from dl_nfv.planners.colocation import placement_violations
from dl_nfv.planners.learned.coarsen import coarsen
from dl_nfv.planners.learned.encoder import GroupEncoder
from dl_nfv.planners.learned.env import OVERFLOW_WEIGHT, GroupStrategy, StrategyEnv
from dl_nfv.planners.learned.features import (
    DEVICE_FEATURES,
    FEATURE_SCHEMA_VERSION,
    GROUP_FEATURES,
    KINDS,
    OP_FEATURES,
    group_graph,
    op_features,
)
from dl_nfv.simulator import simulate
from dl_nfv.simulator.costs import CostModel
from tests.planners.test_dp_baselines import v100_t4_topology as _topology

MIB = 2**20
GIB = 2**30
V100, T4 = "a/gpu0", "b/gpu0"


def _graph(n: int = 8, param_bytes: int = MIB, colocation=(), batch: int = 12):
    """A chain x -> l0 -> ... -> l{n-1}, plus a side op s reading l0 and feeding l{n-1}:
    depth of l_i is i + 1, of s 2. Every l_i takes 1 ms forward on the V100 (2 on the
    T4), backward twice that."""
    ops = [{"id": "x", "name": "x", "kind": "input", "output_bytes": 4096}]
    edges = [{"src": "x", "dst": "l0", "bytes": 4096}]
    for i in range(n):
        ops.append({"id": f"l{i}", "name": f"l{i}", "kind": "matmul", "param_bytes": param_bytes,
                    "output_bytes": 2 * MIB, "fwd_ms": {"V100-16GB": 1.0, "T4": 2.0},
                    "bwd_ms": {"V100-16GB": 2.0, "T4": 4.0}})
        if i:
            edges.append({"src": f"l{i - 1}", "dst": f"l{i}", "bytes": 2 * MIB})
    ops.append({"id": "s", "name": "s", "kind": "activation", "output_bytes": MIB,
                "fwd_ms": {"V100-16GB": 0.0, "T4": 0.0}, "bwd_ms": {"V100-16GB": 0.0, "T4": 0.0}})
    edges += [{"src": "l0", "dst": "s", "bytes": MIB}, {"src": "s", "dst": f"l{n - 1}", "bytes": MIB}]
    return from_document({"kind": "op-graph", "schema_version": 1,
                          "model": {"name": "toy", "batch_size": batch}, "ops": ops,
                          "edges": edges, "colocation": [list(g) for g in colocation]})


# ------------------------------------------------------------------------------ coarsening
def test_an_even_chain_coarsens_into_even_groups():
    cm = CostModel(_graph(), _topology())
    groups = coarsen(cm, target=4).groups
    # 8 ops of 3 ms (V100, fastest) and two free ops: 6 ms per group
    work = [sum(op.startswith("l") for op in g) for g in groups]
    assert work == [2, 2, 2, 2]
    assert sorted(op for g in groups for op in g) == sorted(op.id for op in cm.graph.ops)


def test_coarsening_never_splits_a_colocation_group():
    graph = _graph(colocation=[("l1", "l5")])
    cm = CostModel(graph, _topology())
    c = coarsen(cm, target=8)
    assert not placement_violations(graph, c.group_of)
    assert c.group_of["l1"] == c.group_of["l5"]
    # 24 ms of work for 8 groups: x and l0 (3 ms) close the first; no cut inside l1..l5;
    # l6 alone; s (no work) rides with l7, the last op
    assert c.groups == (("x", "l0"), ("l1", "l2", "l3", "l4", "l5"), ("l6",), ("s", "l7"))


def test_coarsened_edges_carry_the_bytes_between_groups():
    cm = CostModel(_graph(), _topology())
    c = coarsen(cm, target=4)
    # groups of two chain ops; s has no work and rides with l7: the chain crosses 3 cuts
    # with 2 MiB each, and l0 sends s 1 MiB from the first group to the last
    assert c.groups[0] == ("x", "l0", "l1") and c.group_of["s"] == c.group_of["l7"] == 3
    assert c.edges == {(0, 1): 2 * MIB, (1, 2): 2 * MIB, (2, 3): 2 * MIB, (0, 3): MIB}


# --------------------------------------------------------------------------- featurisation
def test_op_features_shapes_and_hand_values():
    cm = CostModel(_graph(), _topology())
    f = op_features(cm)
    n_ops = len(cm.op_ids)
    assert f.x.shape == (n_ops, OP_FEATURES) and f.op_ms.shape == (n_ops, 2)
    i = cm.op_index["l3"]
    assert f.x[i, 0].item() == pytest.approx(math.log1p(3.0))  # V100: 1 + 2 ms
    assert f.x[i, 1].item() == pytest.approx(math.log1p(6.0))  # T4
    assert f.x[i, 2].item() == pytest.approx(math.log1p(2.0))  # 2 MiB out
    assert f.x[i, 3].item() == pytest.approx(math.log1p(1.0))  # 1 MiB of parameters
    assert f.x[i, 4 + KINDS.index(OpKind.MATMUL)].item() == 1.0
    assert f.x[i, 4:4 + len(KINDS)].sum().item() == 1.0
    depth = {op: int(f.depth[cm.op_index[op]]) for op in ("x", "l0", "s", "l3", "l7")}
    assert depth == {"x": 0, "l0": 1, "s": 2, "l3": 4, "l7": 8}
    assert f.x[cm.op_index["l3"], -1].item() == pytest.approx(4 / 8)


def test_device_features_come_from_the_link_and_device_figures():
    cm = CostModel(_graph(), _topology())
    gg = group_graph(cm, coarsen(cm, target=4))
    assert gg.schema_version == FEATURE_SCHEMA_VERSION
    assert gg.x.shape == (4, GROUP_FEATURES) and gg.group_device_ms.shape == (4, 2)
    assert gg.device_x.shape == (2, DEVICE_FEATURES) and gg.device_pair.shape == (2, 2, 2)
    # the chain takes 24 ms on the V100 and 48 on the T4, plus the input op's launch
    # (5 us, unmeasured) on each; both have 16 GiB (log1p 16)
    assert gg.device_x[:, 0].tolist() == pytest.approx([1.0, 24.005 / 48.005])
    assert gg.device_x[:, 1].tolist() == pytest.approx([math.log1p(16)] * 2)
    # a/gpu0 -> a -> tor -> b -> b/gpu0: two host links (1 us, 126 Gbps, the default)
    # and two 5 us NIC hops; the 25 Gbps NICs bound it: 8 x 2^20 / 25e6 ms per MiB
    hop = (math.log1p(12.0), math.log1p(8 * MIB / 25e6))
    assert gg.device_pair[0, 1].tolist() == pytest.approx(hop, rel=1e-6)
    assert gg.device_pair[1, 0].tolist() == pytest.approx(hop, rel=1e-6)
    assert gg.device_pair[0, 0].tolist() == [0.0, 0.0]
    # each group holds two chain ops: 6 ms on the V100, 12 on the T4
    assert gg.group_device_ms[1].tolist() == pytest.approx([math.log1p(6), math.log1p(12)])
    # both directions of every coarsened edge
    assert gg.edge_index.shape[1] == 2 * len(coarsen(cm, target=4).edges)


def test_featurisation_is_deterministic():
    def tensors():
        cm = CostModel(_graph(colocation=[("l2", "l4")]), _topology())
        gg = group_graph(cm, coarsen(cm, target=5))
        return [gg.x, gg.edge_index, gg.edge_attr, gg.group_device_ms, gg.device_x, gg.device_pair]

    for a, b in zip(tensors(), tensors()):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_encoder_embeds_every_group_and_device_reproducibly():
    cm = CostModel(_graph(), _topology())
    gg = group_graph(cm, coarsen(cm, target=4))
    outs = []
    for _ in range(2):
        torch.manual_seed(7)
        encoder = GroupEncoder(hidden=32, layers=2, heads=4)
        with torch.no_grad():
            outs.append(encoder(gg))
    (groups, devices), (groups2, devices2) = outs
    assert groups.shape == (4, 32) and devices.shape == (2, 32)
    assert torch.equal(groups, groups2) and torch.equal(devices, devices2)
    assert torch.isfinite(groups).all()


# ---------------------------------------------------------------------------- environment
def test_reward_is_minus_the_simulated_iteration_time_of_the_hand_built_plan():
    graph, topology = _graph(), _topology()
    cm = CostModel(graph, topology)
    c = coarsen(cm, target=2)
    env = StrategyEnv(graph, topology, c, cost_model=cm)
    strategies = [GroupStrategy(devices=(V100,)),
                  GroupStrategy(devices=(V100, T4), balance="proportional")]
    outcome = env.evaluate(strategies)
    # the same plan by hand: speeds 1 : 1/2 split 12 samples 8 : 4
    hand = Plan(planner="hand", graph_sha256=fingerprint(graph), topology_sha256=fingerprint(topology),
                batch_size=12, groups=(
                    Group(id="g0", ops=c.groups[0], devices=(V100,), sync=SyncMethod.NONE),
                    Group(id="g1", ops=c.groups[1], devices=(V100, T4),
                          batch_shares=(8 / 12, 4 / 12))))
    expected = simulate(hand, graph, topology).iteration_ms
    assert outcome.feasible and outcome.shortfall_bytes == 0
    assert outcome.reward == pytest.approx(-expected, rel=1e-12)
    ps = env.evaluate([strategies[0], GroupStrategy(devices=(V100, T4), sync=SyncMethod.PS,
                                                    ps_server=T4)])
    hand_ps = Plan(planner="hand", graph_sha256=hand.graph_sha256,
                   topology_sha256=hand.topology_sha256, batch_size=12, groups=(
                       hand.groups[0],
                       Group(id="g1", ops=c.groups[1], devices=(V100, T4), sync=SyncMethod.PS,
                             ps_servers=(T4,))))
    assert ps.reward == pytest.approx(-simulate(hand_ps, graph, topology).iteration_ms, rel=1e-12)


def test_memory_overflow_is_penalised_by_its_shortfall():
    # 8 ops of 1 GiB of parameters: with gradients and momentum 24 GiB on one 16 GiB device
    graph, topology = _graph(param_bytes=GIB), _topology()
    cm = CostModel(graph, topology)
    c = coarsen(cm, target=1)
    env = StrategyEnv(graph, topology, c, cost_model=cm)
    outcome = env.evaluate([GroupStrategy(devices=(T4,))])
    result = simulate(env.plan_of([GroupStrategy(devices=(T4,))]), graph, topology)
    (device, _, short), = result.overflows
    assert device == T4 and short >= 8 * GIB  # at least 24 - 16 GiB of static memory
    assert not outcome.feasible and outcome.shortfall_bytes == short
    assert outcome.reward == pytest.approx(
        -result.iteration_ms * (1 + OVERFLOW_WEIGHT * short / (16 * GIB)))


def test_every_candidate_strategy_makes_a_plan_validate_plan_accepts():
    from dl_nfv.planners.learned.decoder import candidates
    from dl_nfv.planners.validate import validate_plan

    graph, topology = _graph(colocation=[("l2", "l4")]), _topology()
    cm = CostModel(graph, topology)
    env = StrategyEnv(graph, topology, coarsen(cm, target=4), cost_model=cm)
    options = [c.strategy for c in candidates(env.cm.cluster)]
    for k, option in enumerate(options):  # each candidate, beside a different one elsewhere
        other = options[(k + 1) % len(options)]
        strategies = [option if g % 2 == 0 else other for g in range(len(env.coarsening.groups))]
        validate_plan(env.plan_of(strategies), graph, topology, check_fingerprints=True)
