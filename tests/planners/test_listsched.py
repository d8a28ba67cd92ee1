"""List scheduling against hand-computed schedules, and invariants on random DAGs."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import from_document
from dl_nfv.artifacts.devices import CATALOG
from dl_nfv.planners.listsched import (
    MemoryShortfall,
    Split,
    StepGraph,
    cpop_pins,
    downward_ranks,
    etf_schedule,
    list_schedule,
    plan_groups,
    upward_ranks,
)
from dl_nfv.simulator.costs import CostModel

# One host: a V100 and a T4 joined by an 80 Gbps link with no latency, so a transfer of
# 1e6 bytes takes exactly 0.1 ms.
PAIR = {
    "kind": "topology", "schema_version": 1, "name": "v100-t4",
    "hosts": [{"name": "h", "devices": [{"type": "V100-16GB"}, {"type": "T4"}],
               "interconnect": {"kind": "nvlink", "bandwidth_gbps": 80, "latency_us": 0}}],
}
V100, T4 = "h/gpu0", "h/gpu1"


def op(op_id, v100_ms, t4_ms, *, params=0, out=1000, bwd=None, split=False):
    doc = {"id": op_id, "name": op_id, "kind": "conv", "param_bytes": params, "output_bytes": out,
           "fwd_ms": {"V100-16GB": v100_ms, "T4": t4_ms}}
    if bwd:
        doc["bwd_ms"] = {"V100-16GB": bwd[0], "T4": bwd[1]}
    if split:
        doc["splittable_dims"] = [0]
    return doc


def graph_of(ops, edges, batch=8, name="hand"):
    return from_document({"kind": "op-graph", "schema_version": 1,
                          "model": {"name": name, "batch_size": batch}, "ops": ops,
                          "edges": [{"src": a, "dst": b, "bytes": n} for a, b, n in edges]})


def diamond():
    """A -> B, A -> C, B -> D, C -> D; no parameters, so the step is forward only."""
    ops = [op("A", 2, 4), op("B", 3, 5), op("C", 4, 6), op("D", 2, 3)]
    edges = [("A", "B", 10**6), ("A", "C", 2 * 10**7), ("B", "D", 10**6), ("C", "D", 10**7)]
    return graph_of(ops, edges)


def _step(graph, topology_doc=PAIR, splits=None):
    cm = CostModel(graph, from_document(topology_doc))
    return cm, StepGraph(cm, cm.cluster.device_names, splits=splits)


def test_transfer_model_is_read_exactly_from_the_cost_model():
    cm, sg = _step(diamond())
    assert sg.comm_ms(0, 1, 10**6) == pytest.approx(0.1)
    assert sg.comm_ms(0, 1, 10**6) == pytest.approx(cm.transfer_ms(V100, T4, 10**6))
    assert sg.comm_ms(0, 0, 10**9) == 0.0


def test_heft_matches_the_hand_computed_schedule():
    # Mean costs: w(A..D) = 3, 4, 5, 2.5 ms; mean transfer of the edges 0.1, 2, 0.1, 1 ms.
    # rank_u: D = 2.5; B = 4 + 0.1 + 2.5 = 6.6; C = 5 + 1 + 2.5 = 8.5; A = 3 + 2 + 8.5 = 13.5.
    # Visit A, C, B, D, each to the device of earliest finish:
    #   A: V100 0-2 (T4 would end at 4)
    #   C: V100 2-6 (T4: input arrives at 4, ends at 10)
    #   B: T4 2.1-7.1 (V100 is busy until 6, would end at 9)
    #   D: V100 7.2-9.2 (B's output arrives at 7.2; on T4 C's arrives at 7 and it would end 10.1)
    _, sg = _step(diamond())
    up = upward_ranks(sg, [0, 1])
    assert up[:4] == pytest.approx([13.5, 6.6, 8.5, 2.5])
    sched = list_schedule(sg, up, allowed=[0, 1], capacity_bytes=[2**34, 2**34])
    ids = sg.op_ids
    placed = {ids[sg.unit_op[u]]: (sg.devices[sched.device[u]], sched.start[u], sched.finish[u])
              for u in range(sg.U)}
    assert placed["A"] == (V100, pytest.approx(0.0), pytest.approx(2.0))
    assert placed["C"] == (V100, pytest.approx(2.0), pytest.approx(6.0))
    assert placed["B"] == (T4, pytest.approx(2.1), pytest.approx(7.1))
    assert placed["D"] == (V100, pytest.approx(7.2), pytest.approx(9.2))
    assert sched.makespan_ms == pytest.approx(9.2)
    assert sched.order() == {V100: ("A", "C", "D"), T4: ("B",)}


def test_cpop_pins_the_critical_path_to_the_device_with_least_total_cost():
    # rank_d: A = 0, B = 3.1, C = 5, D = 11; rank_u + rank_d = 13.5, 9.7, 13.5, 13.5.
    # The critical path A, C, D costs 8 ms on the V100 and 13 ms on the T4.
    _, sg = _step(diamond())
    up, down = upward_ranks(sg, [0, 1]), downward_ranks(sg, [0, 1])
    assert down[:4] == pytest.approx([0.0, 3.1, 5.0, 11.0])
    pins, _ = cpop_pins(sg, [0, 1], up, down)
    by_op = {sg.op_ids[sg.unit_op[u]]: d for u, d in pins.items()}
    assert by_op == {"A": 0, "C": 0, "D": 0}
    sched = list_schedule(sg, [a + b for a, b in zip(up, down)], allowed=[0, 1],
                          capacity_bytes=[2**34, 2**34], pins=pins, algorithm="cpop")
    assert sched.makespan_ms == pytest.approx(9.2)


def test_backward_runs_in_reverse_forward_order_then_the_update():
    # x -> y -> z on one device, y and z have parameters; the step is
    # forwards x, y, z (1 + 2 + 3 ms), backwards z, y (6 + 4 ms, each adding its 4000 bytes of
    # gradient into a bucket); x has none (no parameters at or above it); then one optimizer
    # update of y and z's parameters, which also zeroes their buckets.
    ops = [op("x", 1, 2), op("y", 2, 4, params=4000, bwd=(4, 8)), op("z", 3, 6, params=4000, bwd=(6, 12))]
    graph = graph_of(ops, [("x", "y", 1000), ("y", "z", 1000)])
    cm, sg = _step(graph)
    sched = list_schedule(sg, upward_ranks(sg, [0]), allowed=[0], capacity_bytes=[2**34, 2**34])
    U = sg.U
    add = 4000 * cm.accumulate_ms_per_byte(V100)
    assert [sched.start[U + u] for u in range(U)][1:] == pytest.approx([12.0 + add, 6.0])
    update = cm.update_ms(8000, V100) + cm.upkeep_ms(8000, V100, 0)
    assert sched.makespan_ms == pytest.approx(16.0 + 2 * add + update)


def test_memory_moves_ops_and_names_the_op_that_fits_nowhere():
    ops = [op("a", 1, 1, params=2**30), op("b", 1, 1, params=2**30)]
    graph = graph_of(ops, [("a", "b", 1000)])
    _, sg = _step(graph)
    each = 3 * 2**30 + 1000  # parameters, gradients and momentum, plus the activation
    sched = list_schedule(sg, upward_ranks(sg, [0, 1]), allowed=[0, 1],
                          capacity_bytes=[each + 2000, each + 2000])
    assert sched.device[0] != sched.device[1]
    with pytest.raises(MemoryShortfall) as info:
        list_schedule(sg, upward_ranks(sg, [0, 1]), allowed=[0, 1],
                      capacity_bytes=[each + 2000, 2**30])
    # the T4 is the closest miss: b needs its state, activation and a's output (1000 B) there
    assert info.value.op_id == "b" and info.value.device == T4
    assert info.value.shortfall_bytes == pytest.approx(each + 1000 - 2**30, rel=1e-9)
    assert "op 'b'" in str(info.value) and "short by" in str(info.value)


def test_split_replicas_exchange_the_overlap_of_their_batch_intervals():
    ops = [op("a", 1, 1, out=8000), op("b", 4, 4, split=True, out=8000), op("c", 1, 1)]
    graph = graph_of(ops, [("a", "b", 8000), ("b", "c", 8000)])
    split = Split((V100, T4), (0.75, 0.25))
    _, sg = _step(graph, splits={"b": split})
    assert sg.U == 4
    b0, b1 = sg.units_of_op[1]
    assert (sg.lo[b0], sg.hi[b0], sg.lo[b1], sg.hi[b1]) == (0.0, 0.75, 0.75, 1.0)
    assert dict(sg.pred[b0]) == {0: 6000.0} and dict(sg.pred[b1]) == {0: 2000.0}
    groups, order, notes = plan_groups(list_schedule(
        sg, upward_ranks(sg, [0, 1]), allowed=[0, 1], capacity_bytes=[2**34, 2**34]))
    split_group = next(g for g in groups if g.id == "split:b")
    assert split_group.devices == (V100, T4) and split_group.batch_shares == (0.75, 0.25)
    assert "split 2-way" in split_group.note
    assert all("b" in order[d] for d in (V100, T4))


def _random_graph(seed: int, n: int):
    rng = random.Random(seed)
    ops, edges = [], []
    for i in range(n):
        t = rng.uniform(0.1, 5)
        ops.append(op(f"o{i}", t, t * rng.uniform(1, 3), params=rng.choice([0, 0, 4096]),
                      out=rng.randint(1000, 10**6), bwd=(2 * t, 4 * t), split=rng.random() < 0.5))
        for j in rng.sample(range(i), min(i, rng.randint(0, 2))):
            edges.append((f"o{j}", f"o{i}", rng.randint(0, 10**6)))
    return graph_of(ops, edges, batch=rng.choice([1, 4, 8]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(1, 25), kind=st.sampled_from(["heft", "etf"]))
def test_schedules_respect_dependencies_and_devices(seed, n, kind):
    graph = _random_graph(seed, n)
    _, sg = _step(graph)
    allowed = [0, 1]
    cap = [2**40, 2**40]
    sched = (list_schedule(sg, upward_ranks(sg, allowed), allowed=allowed, capacity_bytes=cap)
             if kind == "heft" else etf_schedule(sg, allowed=allowed, capacity_bytes=cap))
    U = sg.U
    for u in range(U):
        assert sched.finish[u] >= sched.start[u] - 1e-9
        for a, nbytes in sg.pred[u]:  # forward data dependencies, with transfer time
            arrive = sched.finish[a] + sg.comm_ms(sched.device[a], sched.device[u], nbytes)
            assert sched.start[u] >= arrive - 1e-9
        if sg.rg[u]:
            assert sched.start[U + u] >= sched.finish[u] - 1e-9
            for s, nbytes in sg.succ[u]:
                arrive = sched.finish[U + s] + sg.comm_ms(sched.device[s], sched.device[u], nbytes)
                assert sched.start[U + u] >= arrive - 1e-9
    for j in range(sg.D):  # a device runs one task at a time
        spans = sorted((sched.start[t], sched.finish[t]) for t in range(2 * U)
                       if sched.device[t % U] == j and (t < U or sg.rg[t - U]))
        for (_, end), (begin, _) in zip(spans, spans[1:]):
            assert begin >= end - 1e-9
    # the recorded order lists every op of a device once, inputs before consumers
    order = sched.order()
    assert sorted(o for ops in order.values() for o in ops) == sorted(sg.op_ids)
    for ops in order.values():
        position = {o: k for k, o in enumerate(ops)}
        for e in graph.edges:
            if e.src in position and e.dst in position:
                assert position[e.src] < position[e.dst]


@pytest.mark.parametrize("tie_sum_ms", [None, 1.5])
def test_a_tied_weight_split_across_devices_costs_its_allreduce_and_a_copy(tie_sum_ms):
    # emb owns 8 MB that head shares; pinned apart, the step ends with their AllReduce and
    # an update of the copy on head's device; pinned together, neither
    emb = {**op("emb", 1, 2, params=8 * 2**20, bwd=(2, 4)), "params": ["w"]}
    if tie_sum_ms:
        emb["tie_sum_ms"] = {"V100-16GB": tie_sum_ms}
    head = {**op("head", 1, 2, bwd=(2, 4)), "shared_params": {"w": 8 * 2**20}}
    graph = graph_of([emb, head], [("emb", "head", 1000)])
    cm, sg = _step(graph)
    assert sg.ties == [(cm.op_index["emb"], cm.op_index["head"], 8 * 2**20)]
    prio = upward_ranks(sg, [0, 1])
    caps = [2**34, 2**34]
    apart = list_schedule(sg, prio, allowed=[0, 1], capacity_bytes=caps, pins={0: 0, 1: 1})
    together = list_schedule(sg, prio, allowed=[0, 1], capacity_bytes=caps, pins={0: 0, 1: 0})
    nbytes = 8 * 2**20
    last_backward = max(apart.finish)
    def update(d):  # (adding into the buckets is part of each backward: in the finish times)
        return cm.update_ms(nbytes, d) + cm.upkeep_ms(nbytes, d, 0)

    # both devices hold the weight; the T4 (less memory bandwidth) updates its copy last
    expected = last_backward + cm.allreduce_ms([V100, T4], nbytes) + max(update(V100), update(T4))
    assert apart.makespan_ms == pytest.approx(expected)
    assert together.makespan_ms == pytest.approx(max(together.finish) + update(V100))
    # apart, emb's backward no longer sums head's gradient into its own (measured, or three
    # passes over the weight)
    t = sg.U + 0

    def emb_backward(s):
        return s.finish[t] - s.start[t]
    untie = tie_sum_ms or nbytes * 3 / (CATALOG["V100-16GB"].memory_bandwidth_gb_per_s * 1e6)
    assert cm.tie_sum_ms("emb", V100) == pytest.approx(untie)
    assert emb_backward(together) - emb_backward(apart) == pytest.approx(untie)


# ------------------------------------------------------------------ colocation
def _placed(sg, sched):
    return {sg.op_ids[sg.unit_op[u]]: (sg.devices[sched.device[u]], sched.start[u], sched.finish[u])
            for u in range(sg.U)}


def test_heft_keeps_a_colocation_group_on_its_first_op_s_device():
    # The diamond with B and C colocated. HEFT alone puts C on the V100 and B on the T4
    # (above); colocated, C goes first (rank 8.5) to the V100 (2-6; on the T4 it would end at
    # 10), so B must follow it there: after C, 6-9 (no gap before). D: on the V100 both
    # inputs are local, 9-11; on the T4 B's output would arrive at 9.1, ending at 12.1.
    import dataclasses

    _, sg = _step(dataclasses.replace(diamond(), colocation=(("B", "C"),)))
    sched = list_schedule(sg, upward_ranks(sg, [0, 1]), allowed=[0, 1],
                          capacity_bytes=[2**34, 2**34])
    placed = _placed(sg, sched)
    assert placed["C"] == (V100, pytest.approx(2.0), pytest.approx(6.0))
    assert placed["B"] == (V100, pytest.approx(6.0), pytest.approx(9.0))
    assert placed["D"] == (V100, pytest.approx(9.0), pytest.approx(11.0))
    assert sched.makespan_ms == pytest.approx(11.0)


def test_etf_keeps_a_colocation_group_on_its_first_op_s_device():
    # ETF alone: C wins the V100 at 2 (higher rank), B starts on the T4 at 2.1. Colocated,
    # B may only follow C to the V100 (6-9), and D starts there at 9 (T4: 9.1).
    import dataclasses

    _, sg = _step(dataclasses.replace(diamond(), colocation=(("B", "C"),)))
    sched = etf_schedule(sg, allowed=[0, 1], capacity_bytes=[2**34, 2**34])
    placed = _placed(sg, sched)
    assert placed["B"] == (V100, pytest.approx(6.0), pytest.approx(9.0))
    assert placed["D"] == (V100, pytest.approx(9.0), pytest.approx(11.0))


def test_a_colocation_group_goes_where_the_whole_group_fits():
    # a -> b, a -> c; b and c colocated, 6 GiB of parameters each (18 GiB with gradients and
    # momentum for both). Only a device of more than 18 GiB can hold the group: on two
    # 16 GiB devices it fits nowhere, and the shortfall names the group's first op.
    import dataclasses

    gib = 2**30
    ops = [op("a", 1, 1), op("b", 1, 1, params=3 * gib, out=1, bwd=(1, 1)),
           op("c", 1, 1, params=3 * gib, out=1, bwd=(1, 1))]
    graph = graph_of(ops, [("a", "b", 1), ("a", "c", 1)])
    caps = [16 * gib, 16 * gib]
    blind = etf_schedule(_step(graph)[1], allowed=[0, 1], capacity_bytes=caps)
    assert len({blind.device[1], blind.device[2]}) == 2  # 9 GiB each: one per device
    _, sg = _step(dataclasses.replace(graph, colocation=(("b", "c"),)))
    with pytest.raises(MemoryShortfall) as err:
        list_schedule(sg, upward_ranks(sg, [0, 1]), allowed=[0, 1], capacity_bytes=caps)
    assert err.value.op_id in ("b", "c")
    together = etf_schedule(sg, allowed=[0, 1], capacity_bytes=[16 * gib, 20 * gib])
    assert sg.devices[together.device[1]] == sg.devices[together.device[2]] == T4


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(2, 20), kind=st.sampled_from(["heft", "etf"]))
def test_schedules_keep_every_colocation_group_on_one_device(seed, n, kind):
    import dataclasses

    graph = _random_graph(seed, n)
    rng = random.Random(seed)
    ids = [o.id for o in graph.ops]
    rng.shuffle(ids)
    cuts = sorted(rng.sample(range(1, n), min(n - 1, rng.randint(1, 3))))
    groups = [tuple(ids[a:b]) for a, b in zip([0, *cuts], [*cuts, n]) if b - a >= 2]
    _, sg = _step(dataclasses.replace(graph, colocation=tuple(groups)))
    allowed, cap = [0, 1], [2**40, 2**40]
    sched = (list_schedule(sg, upward_ranks(sg, allowed), allowed=allowed, capacity_bytes=cap)
             if kind == "heft" else etf_schedule(sg, allowed=allowed, capacity_bytes=cap))
    device = {sg.op_ids[sg.unit_op[u]]: sched.device[u] for u in range(sg.U)}
    for group in groups:
        assert len({device[o] for o in group}) == 1, group


def test_etf_reports_a_colocated_favourite_child_that_cannot_follow_its_group():
    # a -> b (nothing to send), a -> c (9 GiB); b and c colocated, 6 GiB of state each; c is
    # a's favourite child. a goes to the V100 (capped at 10 GiB), where the group's 12 GiB do
    # not fit, so c is not held there; b (higher rank) takes the group to the T4 (20 GiB).
    # c must follow, but 12 GiB + 9 GiB received do not fit: ETF reports the shortfall.
    import dataclasses

    gib = 2**30
    ops = [op("a", 1, 1), op("b", 5, 5, params=2 * gib, out=1, bwd=(1, 1)),
           op("c", 1, 1, params=2 * gib, out=1, bwd=(1, 1))]
    graph = graph_of(ops, [("a", "b", 0), ("a", "c", 9 * gib)])
    _, sg = _step(dataclasses.replace(graph, colocation=(("b", "c"),)))
    unit = {sg.op_ids[sg.unit_op[u]]: u for u in range(sg.U)}
    with pytest.raises(MemoryShortfall) as err:
        etf_schedule(sg, allowed=[0, 1], capacity_bytes=[10 * gib, 20 * gib],
                     favourite={unit["c"]: unit["a"]})
    assert err.value.op_id == "c"
