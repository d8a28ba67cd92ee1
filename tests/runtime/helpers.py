"""Hand-built op graphs and plans for runtime tests (no planner, no profiler timings).

The op graph of a tiny zoo model is made from the same fx capture the runtime
uses (so op ids match); plans are written as records, exactly as a planner
would, for the ``local-cpu`` topology or a hand-written one with more devices.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dl_nfv.artifacts import (
    Edge,
    Fusion,
    Group,
    ModelRef,
    Op,
    OpGraph,
    OpKind,
    Pipeline,
    Plan,
    ScheduleKind,
    SyncMethod,
    fingerprint,
    from_data,
    save,
)
from dl_nfv.artifacts.topology import Topology

ROOT = Path(__file__).resolve().parents[2]


def topology(n_devices: int = 2) -> Topology:
    return from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": f"test-cpu{n_devices}",
        "hosts": [{"name": "local",
                   "devices": [{"type": "cpu", "count": n_devices, "memory_gib": 4}],
                   "interconnect": {"kind": "loopback", "bandwidth_gbps": 8, "latency_us": 40}}]})


def devices(n: int) -> tuple[str, ...]:
    return tuple(f"local/cpu{i}" for i in range(n))


MODELS = Path(__file__).resolve().parent / "models.py"


def graph_of(name: str, batch_size: int | None = None, **ref_options) -> OpGraph:
    """The op graph of zoo model (or user callable) ``name`` from its fx capture (ops and
    edges, no timings)."""
    from dl_nfv.profilers.capture import capture
    from dl_nfv.profilers.zoo import instantiate, model_ref

    ref: ModelRef = model_ref(name, batch_size=batch_size, **ref_options)
    workload = instantiate(ref, seed=0)
    cap = capture(workload.module, workload.make_batch(ref.batch_size, 0)[0])
    ops = tuple(Op(id=o, name=o, kind=OpKind.INPUT if o in cap.input_ops else OpKind.OTHER)
                for o in cap.op_ids)
    edges = {}
    for node in cap.graph_module.graph.nodes:
        dst = cap.op_of.get(node.name)
        for arg in node.all_input_nodes:
            src = cap.op_of.get(arg.name)
            if src and dst and src != dst:
                edges[(src, dst)] = Edge(src=src, dst=dst)
    return OpGraph(model=ref, ops=ops, edges=tuple(edges.values()))


def with_parameters(graph: OpGraph) -> OpGraph:
    """``graph`` with every op's owned and shared (tied) parameters, as the profiler
    records them, so that ties are visible in the graph."""
    import dataclasses

    from dl_nfv.profilers.capture import capture
    from dl_nfv.profilers.graph import _owned_params
    from dl_nfv.profilers.zoo import instantiate

    workload = instantiate(graph.model, seed=0)
    owned, shared = _owned_params(capture(workload.module,
                                          workload.make_batch(graph.model.batch_size, 0)[0]))
    ops = tuple(dataclasses.replace(
        op, params=tuple(n for n, _ in owned.get(op.id, ())),
        param_bytes=sum(p.numel() * p.element_size() for _, p in owned.get(op.id, ())),
        shared_params=dict(shared.get(op.id, {}))) for op in graph.ops)
    return dataclasses.replace(graph, ops=ops)


def compute_ops(graph: OpGraph) -> list[str]:
    return [op.id for op in graph.ops if op.kind is not OpKind.INPUT]


def input_ops(graph: OpGraph) -> list[str]:
    return [op.id for op in graph.ops if op.kind is OpKind.INPUT]


def _plan(graph: OpGraph, topo: Topology, groups, **extra) -> Plan:
    return Plan(planner=extra.pop("planner", "hand"), graph_sha256=fingerprint(graph),
                topology_sha256=fingerprint(topo), batch_size=graph.model.batch_size,
                groups=tuple(groups), graph_path="graph.json", topology_path="topology.json",
                **extra)


def dp_plan(graph: OpGraph, topo: Topology, devs, *, shares=(), sync=SyncMethod.ALLREDUCE,
            servers=(), buckets: int = 0, optimizer="sgd") -> Plan:
    """All ops replicated on ``devs``; ``buckets`` > 0 splits the ops with parameters into
    that many gradient buckets (reverse op order, as DDP)."""
    ops = tuple(op.id for op in graph.ops)
    fusion = None
    if buckets:
        order = list(reversed(compute_ops(graph)))
        size = -(-len(order) // buckets)
        fusion = Fusion(gradient_buckets=tuple(tuple(order[i:i + size])
                                               for i in range(0, len(order), size)))
    group = Group(id="all", ops=ops, devices=tuple(devs), batch_shares=tuple(shares),
                  sync=sync if len(devs) > 1 else SyncMethod.NONE, ps_servers=tuple(servers))
    return _plan(graph, topo, [group], fusion=fusion, optimizer=optimizer)


def schedule_1f1b(stage: int, stages: int, microbatches: int) -> str:
    warm = min(stages - stage - 1, microbatches)
    acts = [f"{stage}F{m}" for m in range(warm)]
    f, b = warm, 0
    while b < microbatches:
        if f < microbatches:
            acts.append(f"{stage}F{f}")
            f += 1
        acts.append(f"{stage}B{b}")
        b += 1
    return " ".join(acts)


def schedule_gpipe(stage: int, microbatches: int) -> str:
    return " ".join([f"{stage}F{m}" for m in range(microbatches)] +
                    [f"{stage}B{m}" for m in range(microbatches)])


def pipeline_plan(graph: OpGraph, topo: Topology, stage_devices, *, cut: float = 0.5,
                  cuts=None, microbatches: int = 2, kind: str = "gpipe", shares=None,
                  schedule=None) -> Plan:
    """Stages cut at fractions of the compute ops; ``stage_devices[s]`` are stage s's replicas."""
    ops = compute_ops(graph)
    n = len(stage_devices)
    cuts = list(cuts) if cuts is not None else [cut] if n == 2 else [i / n for i in range(1, n)]
    bounds = [0, *[int(round(c * len(ops))) for c in cuts], len(ops)]
    groups = []
    for s, devs in enumerate(stage_devices):
        members = ops[bounds[s]:bounds[s + 1]]
        if s == 0:
            members = input_ops(graph) + members
        devs = tuple(devs)
        groups.append(Group(id=f"stage{s}", ops=tuple(members), devices=devs,
                            batch_shares=tuple(shares[s]) if shares and len(devs) > 1 else (),
                            sync=SyncMethod.ALLREDUCE if len(devs) > 1 else SyncMethod.NONE))
    if schedule is None:
        schedule = {}
        for s, devs in enumerate(stage_devices):
            text = (schedule_gpipe(s, microbatches) if kind == "gpipe"
                    else schedule_1f1b(s, n, microbatches))
            for d in devs:
                schedule[d] = (schedule[d] + " " + text) if d in schedule else text
    pipe = Pipeline(microbatches=microbatches, stages=tuple(g.id for g in groups),
                    schedule_kind=ScheduleKind(kind), schedule=schedule)
    return _plan(graph, topo, groups, pipeline=pipe)


def placement_plan(graph: OpGraph, topo: Topology, device_of: dict[str, str],
                   order: dict[str, tuple[str, ...]] | None = None) -> Plan:
    """One group per op on the device ``device_of`` gives (inputs with the first op)."""
    ops = compute_ops(graph)
    first = device_of[ops[0]]
    groups = [Group(id=f"g_{op}", ops=(op,), devices=(device_of.get(op, first),),
                    sync=SyncMethod.NONE) for op in input_ops(graph)]
    groups += [Group(id=f"g_{op}", ops=(op,), devices=(device_of[op],), sync=SyncMethod.NONE)
               for op in ops]
    if order is None:
        topo_order = graph.topological_ids()
        order = {}
        for op in topo_order:
            d = device_of.get(op, first)
            order.setdefault(d, ())
            order[d] += (op,)
    return _plan(graph, topo, groups, order=order)


def write(tmp: Path, graph: OpGraph, topo: Topology, plan: Plan) -> Path:
    save(graph, tmp / "graph.json")
    save(topo, tmp / "topology.json")
    return save(plan, tmp / "plan.json")


def dl_nfv(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real ``dl-nfv`` command line in a subprocess."""
    return subprocess.run([sys.executable, "-m", "dl_nfv", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
