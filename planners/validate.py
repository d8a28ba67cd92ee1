"""``validate_plan``: one check of any plan from any planner, independent of who made it.

It checks, in order:

1. the plan fits its graph and topology (ops and devices exist, every op is
   placed exactly once, batch sizes agree; fingerprints when asked);
2. colocation: every colocation group of the graph sits on one device set
   and, in a pipeline, in one stage; outside a pipeline also with one set of
   batch shares (the runtime passes a value whose shape depends on the data
   only between units of the same placement); every replica's slice of a
   microbatch has the rows its batch norms need in training (``runnable``);
3. pipelines: every group is a stage, stage order respects the data edges,
   and the per-device action lists cannot deadlock (the graph of
   forward/backward dependencies plus each device's order is acyclic);
4. per-device op orders: each lists every op placed on its device, and the
   data edges plus the order edges form no cycle (no device waits on an op
   that it itself must run later);
5. memory: the shared simulator finds no device over its memory.

It raises ``InvalidArtifact`` (or ``ArtifactMismatch`` / ``InfeasiblePlan``)
naming the first violation. Complexity: O(ops + edges + actions) plus one
simulation when ``check_memory``.
"""

from __future__ import annotations

import networkx as nx

from dl_nfv.artifacts import (
    InfeasiblePlan,
    InvalidArtifact,
    OpGraph,
    Plan,
    Topology,
    validate_against,
)

from .colocation import placement_violations
from .runnable import check_batch_norm_rows


def validate_plan(plan: Plan, graph: OpGraph, topology: Topology, *, check_fingerprints: bool = False,
                  check_memory: bool = True) -> None:
    """Raise on the first way ``plan`` is not a valid, runnable plan for ``graph`` on ``topology``."""
    validate_against(plan, graph, topology, check_fingerprints=check_fingerprints)
    check_colocation(plan, graph)
    check_colocated_shares(plan, graph)
    check_batch_norm_rows(plan, graph)
    if plan.pipeline is not None:
        _check_pipeline(plan, graph)
    if plan.order:
        _check_order(plan, graph)
    if check_memory:
        from dl_nfv.simulator import simulate

        result = simulate(plan, graph, topology, check_fingerprints=False)
        if not result.feasible:
            device, time_ms, shortfall = max(result.overflows, key=lambda o: o[2])
            raise InfeasiblePlan(f"plan by {plan.planner}: device {device!r} is over its memory by "
                                 f"{shortfall / 2**30:.2f} GiB at t={time_ms:.1f} ms")


def check_colocation(plan: Plan, graph: OpGraph) -> None:
    """Raise ``InvalidArtifact`` naming the group, two of its ops and their device sets
    (or stages) when ``plan`` splits a colocation group of ``graph``."""
    if not graph.colocation:
        return
    devices = {op: frozenset(devs) for op, devs in plan.devices_of_op.items()}
    for split in placement_violations(graph, devices):
        raise InvalidArtifact(split.describe("devices"), field="groups")
    if plan.pipeline is not None:
        stage_of_group = {gid: s for s, gid in enumerate(plan.pipeline.stages)}
        stages = {op: stage_of_group[g.id] for g in plan.groups for op in g.ops
                  if g.id in stage_of_group}
        for split in placement_violations(graph, stages):
            raise InvalidArtifact(split.describe("stage"), field="pipeline.stages")


def check_colocated_shares(plan: Plan, graph: OpGraph) -> None:
    """Raise ``InvalidArtifact`` when two ops of a colocation group run with different batch
    shares outside a pipeline (where a stage runs whole on each replica).

    The runtime cuts an op-placement plan into units by placement; a value whose shape
    depends on the data (what the profiler colocates) passes only between units of the same
    devices *and* shares, each replica keeping its own rows, so a group on one device set
    with two share vectors is a plan the runtime refuses."""
    if plan.pipeline is not None or not graph.colocation:
        return
    group_of = plan.group_of_op

    def share_of(op: str) -> dict[str, float]:
        return dict(zip(group_of[op].devices, group_of[op].shares))

    for i, ops in enumerate(graph.colocation):
        first = group_of[ops[0]]
        other = next((op for op in ops[1:] if share_of(op) != share_of(ops[0])), None)
        if other is not None:
            raise InvalidArtifact(
                f"colocation[{i}]: op {ops[0]!r} runs with batch shares {list(first.shares)} "
                f"on {list(first.devices)} (group {first.id!r}), op {other!r} with "
                f"{list(group_of[other].shares)} (group {group_of[other].id!r}); colocated ops "
                f"must share devices and shares", field=f"groups.{group_of[other].id}.batch_shares")


def _check_pipeline(plan: Plan, graph: OpGraph) -> None:
    pipe = plan.pipeline
    stage_of_group = {gid: s for s, gid in enumerate(pipe.stages)}
    for g in plan.groups:
        if g.id not in stage_of_group:
            raise InvalidArtifact(f"group {g.id!r} is not a pipeline stage", field="pipeline.stages")
    stage_of_op = {op: stage_of_group[g.id] for g in plan.groups for op in g.ops}
    for e in graph.edges:
        if stage_of_op[e.src] > stage_of_op[e.dst]:
            raise InvalidArtifact(
                f"edge {e.src}->{e.dst} runs backwards, from stage {stage_of_op[e.src]} to stage "
                f"{stage_of_op[e.dst]}", field="pipeline.stages")
    devices_of_stage = {s: plan.groups[[g.id for g in plan.groups].index(gid)].devices
                        for gid, s in stage_of_group.items()}
    deps = nx.DiGraph()
    last = len(pipe.stages) - 1
    # the action that sends each (device, stage, microbatch)'s gradients back: B, or I
    # where the device splits the backward (its W then follows the I)
    sender = {(d, a.stage, a.microbatch): a.op for d in pipe.schedule
              for a in pipe.actions(d) if a.sends_gradients}
    for s, devices in devices_of_stage.items():
        for d in devices:
            for m in range(pipe.microbatches):
                back = sender.get((d, s, m), "B")
                deps.add_edge((d, s, "F", m), (d, s, back, m))
                if back == "I":
                    deps.add_edge((d, s, "I", m), (d, s, "W", m))
                for nxt in devices_of_stage.get(s + 1, ()) if s < last else ():
                    deps.add_edge((d, s, "F", m), (nxt, s + 1, "F", m))
                    deps.add_edge((nxt, s + 1, sender.get((nxt, s + 1, m), "B"), m), (d, s, back, m))
    for device in pipe.schedule:
        actions = pipe.actions(device)
        for a, b in zip(actions, actions[1:]):
            deps.add_edge((device, a.stage, a.op, a.microbatch), (device, b.stage, b.op, b.microbatch))
    if not nx.is_directed_acyclic_graph(deps):
        cycle = nx.find_cycle(deps)
        where = ", ".join(f"{d}:{s}{k}{m}" for (d, s, k, m), _ in cycle[:4])
        raise InvalidArtifact(f"the pipeline schedule deadlocks (cycle through {where} ...)",
                              field="pipeline.schedule")


def _check_order(plan: Plan, graph: OpGraph) -> None:
    placed = plan.devices_of_op
    for device, ops in plan.order.items():
        on_device = {op for op, devs in placed.items() if device in devs}
        missing = sorted(on_device - set(ops))
        if missing:
            raise InvalidArtifact(f"order of {device!r} lacks op {missing[0]!r}, which runs there",
                                  field=f"order.{device}")
    deps = nx.DiGraph()
    deps.add_nodes_from(op.id for op in graph.ops)
    deps.add_edges_from((e.src, e.dst) for e in graph.edges)
    for ops in plan.order.values():
        deps.add_edges_from(zip(ops, ops[1:]))
    if not nx.is_directed_acyclic_graph(deps):
        cycle = nx.find_cycle(deps)
        path = " -> ".join([cycle[0][0], *(v for _, v in cycle)])
        raise InvalidArtifact(f"the per-device order contradicts the data edges: {path}",
                              field="order")
