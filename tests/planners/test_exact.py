"""``plan exact`` against brute force: every contiguous split x every device assignment.

Tiny DAGs (up to 6 ops, some edges skipping ahead, a tied weight, colocation groups, a
shape query whose output carries no bytes) on two or three devices of mixed types and memories
behind one interconnect. The oracle lists the ideals by testing every subset of ops
for closure, every chain of them, every injective assignment of devices to its
stages, and scores each with ``stages.evaluate`` (op by op, scalar cost-model calls);
the planner's dynamic program must find the smallest feasible bottleneck.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import (
    BadInput,
    Edge,
    InfeasiblePlan,
    ModelRef,
    Op,
    OpGraph,
    OpKind,
    Optimizer,
    PlanStatus,
    Topology,
    from_data,
    save,
)
from dl_nfv.planners import run
from dl_nfv.planners.exact.blocks import ExactLimit
from dl_nfv.planners.exact.stages import evaluate
from dl_nfv.simulator import CostModel

MIB = 2**20
GIB = 2**30
TYPES = ("V100-16GB", "T4", "P100")
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def graphs(draw) -> OpGraph:
    """A DAG of 2 to 6 ops in index order (each op fed by an earlier one, some by two),
    perhaps a tied weight (the last op using the first's), a colocation group and a shape
    query (no parameters, a 0-byte output)."""
    n = draw(st.integers(2, 6))
    ops, edges = [], []
    for i in range(n):
        fwd = draw(st.sampled_from((1.0, 3.0, 8.0, 20.0)))
        params = draw(st.sampled_from((0, 64 * MIB, 512 * MIB, 3 * GIB)))
        ops.append(Op(id=f"o{i}", name=f"o{i}", kind=OpKind.BLOCK, flops=1e9, bwd_flops=2e9,
                      param_bytes=params, output_bytes=draw(st.sampled_from((MIB, 64 * MIB))),
                      fwd_ms={t: fwd * k for t, k in zip(TYPES, (1.0, 2.0, 1.5))},
                      bwd_ms={t: 2 * fwd * k for t, k in zip(TYPES, (1.0, 2.0, 1.5))}))
        if i:
            sources = draw(st.sets(st.integers(0, i - 1), min_size=1, max_size=2))
            edges += [Edge(src=f"o{s}", dst=f"o{i}", bytes=draw(st.sampled_from((MIB, 48 * MIB))))
                      for s in sorted(sources)]
    if n >= 3 and draw(st.booleans()):  # o_k only reads the size of its producer's output
        k = draw(st.integers(1, n - 2))
        ops[k] = Op(id=f"o{k}", name="size", kind=OpKind.SHAPE, fwd_ms={t: 0.01 for t in TYPES},
                    bwd_ms={t: 0.0 for t in TYPES})
        edges = [e for e in edges if e.dst != f"o{k}" or e.src == min(
            x.src for x in edges if x.dst == f"o{k}")]
        edges = [Edge(src=e.src, dst=e.dst, bytes=0) if e.src == f"o{k}" else e for e in edges]
        if not any(e.src == f"o{k}" for e in edges):
            edges.append(Edge(src=f"o{k}", dst=f"o{n - 1}", bytes=0))
    if n >= 3 and ops[0].param_bytes and draw(st.booleans()):  # the last op reuses o0's weight
        ops[0] = dataclasses.replace(ops[0], params=("w0",),
                                     tie_sum_ms={t: 2.0 for t in ops[0].bwd_ms})
        ops[-1] = dataclasses.replace(ops[-1], shared_params={"w0": ops[0].param_bytes})
    colocation = ()
    if n >= 4 and draw(st.booleans()):
        a, b = sorted(draw(st.sets(st.integers(0, n - 1), min_size=2, max_size=2)))
        colocation = ((f"o{a}", f"o{b}"),)
    return OpGraph(model=ModelRef(name="tiny", source="test", batch_size=4), ops=tuple(ops),
                   edges=tuple(edges), colocation=colocation)


@st.composite
def topologies(draw) -> Topology:
    """Two or three devices of mixed types and memories on one host, one interconnect."""
    count = draw(st.integers(2, 3))
    devices = [{"type": draw(st.sampled_from(TYPES)),
                "memory_gib": draw(st.sampled_from((4, 16)))} for _ in range(count)]
    interconnect = {"kind": "nvlink", "bandwidth_gbps": draw(st.sampled_from((10, 200))),
                    "latency_us": 5}
    return from_data(Topology, {"kind": "topology", "schema_version": 1, "name": "tiny",
                                "hosts": [{"name": "h", "devices": devices,
                                           "interconnect": interconnect}]})


def _ideals(graph: OpGraph) -> list[frozenset[str]]:
    """Every subset of ops closed under predecessors (by testing all 2^n subsets)."""
    ids = [op.id for op in graph.ops]
    out = []
    for r in range(len(ids) + 1):
        for subset in itertools.combinations(ids, r):
            s = set(subset)
            if all(e.src in s for e in graph.edges if e.dst in s):
                out.append(frozenset(s))
    return out


def _kept_together(graph: OpGraph) -> list[tuple[str, ...]]:
    """Ops a stage may not separate: colocation groups, and each shape query (no
    parameters, nothing but 0-byte edges out, one producer) with its producer."""
    together = [tuple(g) for g in graph.colocation]
    for op in graph.ops:
        into = {e.src for e in graph.edges if e.dst == op.id}
        out = [e.bytes for e in graph.edges if e.src == op.id]
        if op.param_bytes == 0 and not any(out) and len(into) == 1:
            together.append((op.id, *into))
    return together


def brute_force(graph: OpGraph, topology: Topology, microbatches: int,
                optimizer: Optimizer = Optimizer.SGD) -> float:
    """The smallest feasible bottleneck over every chain of ideals x device assignment."""
    cm = CostModel(graph, topology)
    ideals = _ideals(graph)
    devices = list(cm.cluster.device_names)
    together = _kept_together(graph)
    full = frozenset(op.id for op in graph.ops)
    best = math.inf

    def chains(prefix: list[frozenset[str]]):
        if prefix[-1] == full:
            yield prefix
            return
        if len(prefix) > len(devices):
            return
        for nxt in ideals:
            if prefix[-1] < nxt:
                yield from chains([*prefix, nxt])

    for chain in chains([frozenset()]):
        stages = [sorted(b - a, key=lambda o: int(o[1:])) for a, b in zip(chain, chain[1:])]
        stage_of = {op: s for s, ops in enumerate(stages) for op in ops}
        if any(len({stage_of[o] for o in group}) > 1 for group in together):
            continue
        for chosen in itertools.permutations(devices, len(stages)):
            objective = evaluate(graph, topology, list(zip(stages, chosen)),
                                 microbatches=microbatches, optimizer=optimizer, cost_model=cm)
            if objective.feasible:
                best = min(best, objective.bottleneck_ms)
    return best


def _objective_of(plan, graph, topology, microbatches, optimizer=Optimizer.SGD):
    stages = [(g.ops, g.devices[0]) for g in plan.groups]
    return evaluate(graph, topology, stages, microbatches=microbatches, optimizer=optimizer)


@SETTINGS
@given(graphs(), topologies(), st.sampled_from((1, 2, 4)), st.sampled_from(tuple(Optimizer)))
def test_exact_finds_the_brute_force_optimum(graph, topology, microbatches, optimizer):
    expected = brute_force(graph, topology, microbatches, optimizer)
    try:
        plan = run("exact", graph, topology, microbatches=microbatches, optimizer=optimizer.value)
    except InfeasiblePlan as exc:
        assert expected == math.inf, f"exact found no split but one scores {expected}: {exc}"
        return
    assert plan.status is PlanStatus.OPTIMAL
    got = _objective_of(plan, graph, topology, microbatches, optimizer)
    assert got.feasible
    assert got.bottleneck_ms == pytest.approx(expected, rel=1e-9)
    noted = float(plan.notes[0].split("bottleneck ")[1].split(" ms")[0])
    assert noted == pytest.approx(expected, rel=1e-6)
    for group in graph.colocation:  # a group's ops in one stage
        assert len({g.id for g in plan.groups if set(group) & set(g.ops)}) == 1


def _chain(n: int, *, params: int, fwd: float = 5.0) -> OpGraph:
    ops = tuple(Op(id=f"o{i}", name=f"o{i}", kind=OpKind.BLOCK, param_bytes=params,
                   output_bytes=MIB, fwd_ms={"V100-16GB": fwd}, bwd_ms={"V100-16GB": 2 * fwd})
                for i in range(n))
    edges = tuple(Edge(src=f"o{i}", dst=f"o{i + 1}", bytes=MIB) for i in range(n - 1))
    return OpGraph(model=ModelRef(name="chain", source="test", batch_size=8), ops=ops, edges=edges)


def _host(count: int, memory_gib: float = 16, bandwidth_gbps: float = 200) -> Topology:
    return from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "one-host",
        "hosts": [{"name": "h", "devices": [{"type": "V100-16GB", "count": count,
                                             "memory_gib": memory_gib}],
                   "interconnect": {"kind": "nvlink", "bandwidth_gbps": bandwidth_gbps,
                                    "latency_us": 2}}]})


def test_memory_limits_force_more_stages_than_time_alone():
    """Eight 1 GiB ops (4 GiB each with gradients and momentum... x3 = 3 GiB static) on
    devices of 7 GiB: at most two ops per stage, so four stages at least, though two
    stages would balance the time as well."""
    graph = _chain(8, params=GIB)
    topology = _host(4, memory_gib=7)
    plan = run("exact", graph, topology, microbatches=2)
    assert [len(g.ops) for g in plan.groups] == [2, 2, 2, 2]
    assert _objective_of(plan, graph, topology, 2).feasible
    with pytest.raises(InfeasiblePlan, match="fits"):
        run("exact", graph, _host(3, memory_gib=7), microbatches=2)


def test_a_chain_splits_into_equal_stages():
    """Twelve equal ops on four equal devices: three per stage (closed form)."""
    graph = _chain(12, params=MIB)
    plan = run("exact", graph, _host(4), microbatches=4)
    assert [len(g.ops) for g in plan.groups] == [3, 3, 3, 3]


def _wide(chains: int, length: int) -> OpGraph:
    """``chains`` parallel chains between a source and a sink: (length + 1)^chains ideals."""
    ops = [Op(id="src", name="src", kind=OpKind.INPUT, output_bytes=MIB)]
    edges = []
    for c in range(chains):
        prev = "src"
        for i in range(length):
            op_id = f"c{c}_{i}"
            ops.append(Op(id=op_id, name=op_id, kind=OpKind.BLOCK, param_bytes=MIB,
                          output_bytes=MIB, fwd_ms={"V100-16GB": 1.0}, bwd_ms={"V100-16GB": 2.0}))
            edges.append(Edge(src=prev, dst=op_id, bytes=MIB))
            prev = op_id
        edges.append(Edge(src=prev, dst="sink", bytes=MIB))
    ops.append(Op(id="sink", name="sink", kind=OpKind.BLOCK, fwd_ms={"V100-16GB": 1.0},
                  bwd_ms={"V100-16GB": 1.0}))
    return OpGraph(model=ModelRef(name="wide", source="test", batch_size=8), ops=tuple(ops),
                   edges=tuple(edges))


def test_too_many_ideals_or_too_little_time_is_a_typed_error():
    graph = _wide(12, 3)  # 4^12 = 16.8 M ideals
    with pytest.raises(ExactLimit, match="more than 1000 ideals"):
        run("exact", graph, _host(4), max_ideals=1000)
    with pytest.raises(ExactLimit, match="time limit"):
        run("exact", graph, _host(4), time_limit=0.05, max_ideals=10**9)


def test_the_cli_exits_2_with_one_line_when_it_cannot_finish(tmp_path):
    from dl_nfv.cli.main import cli

    save(_wide(12, 3), tmp_path / "g.json")
    save(_host(4), tmp_path / "t.yaml")
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["plan", "exact", "--graph", str(tmp_path / "g.json"),
                                      "--topology", str(tmp_path / "t.yaml"),
                                      "--time-limit", "0.05", "--max-ideals", "1000000000",
                                      "-o", str(out)])
    assert result.exit_code == 2
    message = result.stderr.strip() if result.stderr_bytes is not None else result.output.strip()
    assert len(message.splitlines()) == 1 and "time limit" in message
    assert not out.exists()


def test_routes_that_differ_are_refused():
    topology = from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "two-hosts", "switches": [{"name": "sw"}],
        "hosts": [{"name": f"h{h}", "devices": [{"type": "V100-16GB", "count": 2}],
                   "interconnect": {"kind": "nvlink", "bandwidth_gbps": 200, "latency_us": 2},
                   "nics": [{"switch": "sw", "bandwidth_gbps": 25, "latency_us": 5}]}
                  for h in range(2)]})
    with pytest.raises(BadInput, match="same transfer cost"):
        run("exact", _chain(4, params=MIB), topology)
