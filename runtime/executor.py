"""Turn a plan into this rank's units, action list, gradient syncs and optimizer.

The mode follows the plan:

* **pipeline** (``plan.pipeline``): one unit per stage group; this device's
  actions are its schedule (``Pipeline.actions``), executed in that order;
* **data parallel / parameter server** (one group): one unit, the whole model,
  replicated over the group's devices with its batch shares; gradients are
  bucketed and all-reduced (overlapping the backward pass), or pushed to and
  pulled from the group's ``ps_servers``;
* **op placement** (several groups, no pipeline): one unit per run of ops that
  follow each other in the order of every device they run on, with the same
  devices and shares, and that receive from other devices only at the run's first
  op and send to them only from its last (``simulator.units.placement_units``; a
  single op where neighbours differ), so no device waits for work a send did not
  need; this device runs the forward of its units in ``plan.order``
  (topological order when the plan gives none), then their backward in the
  reverse order. Running a run of ops as one fx submodule saves the per-unit
  overhead (a separate autograd pass and boundary tensors per op), which the
  simulator charges per unit action (``CostModel.op_action_ms``).

Gradient synchronisation is derived from who holds each parameter: a
parameter held by several devices (replicas of a group, or units on different
devices sharing a tied weight) is summed over them, by AllReduce, or through
the group's parameter servers when the group says ``ps``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dl_nfv.artifacts import BadInput, OpGraph, Optimizer, Plan, SyncMethod, TieSync
from dl_nfv.artifacts.runreport import ExecutionMode
from dl_nfv.simulator.costs import exchangeable, lookup_rows, tied_weights
from dl_nfv.simulator.units import placement_units

from .comm import Comm
from .fusion import fuse_partition
from .model import Workload, to_device
from .partition import probe, split
from .sfb import sfb_syncs
from .sync import GradientSync, TieExchange
from .units import Placement, UnitRunner, accumulations, span

DEFAULT_LR = {Optimizer.SGD: 0.01, Optimizer.ADAM: 1e-3}
SGD_MOMENTUM = 0.9
FUSED_DEVICES = ("cpu", "cuda")  # where torch.optim's SGD and Adam have fused steps


def execution_mode(plan: Plan) -> ExecutionMode:
    """The mode a plan runs in (see the module docstring)."""
    if plan.pipeline is not None:
        return ExecutionMode.PIPELINE
    if len(plan.groups) == 1:
        group = plan.groups[0]
        if len(plan.devices) == 1:
            return ExecutionMode.SINGLE
        return (ExecutionMode.PARAMETER_SERVER if group.sync is SyncMethod.PS
                else ExecutionMode.DATA_PARALLEL)
    return ExecutionMode.PLACEMENT


@dataclass
class RankContext:
    """Who this process is in the run."""

    rank: int
    world_size: int
    device_name: str  # the plan's device this rank executes
    torch_device: torch.device
    rank_of: dict[str, int]
    comm: Comm


def make_optimizer(params: list[torch.nn.Parameter], kind: Optimizer,
                   lr: float | None = None) -> torch.optim.Optimizer | None:
    """The plan's optimizer over ``params`` (None when there are none).

    The fused implementation (one kernel per step reading parameters, gradients and state
    and writing parameters and state) where torch has one for the parameters' device and
    dtype (float parameters on a CPU or a CUDA device); the cost model charges that step
    (``UPDATE_PASSES``). On this machine's CPU the fused step took 5.8 and 7.5 passes' time
    for SGD with momentum and Adam against 8.9 and 25.5 for the default ones, with freed
    memory kept as the workers keep it (``bench/optimizer_bench.py``).
    """
    if not params:
        return None
    lr = DEFAULT_LR[kind] if lr is None else lr
    fused = all(p.dtype.is_floating_point and p.device.type in FUSED_DEVICES for p in params)
    if kind is Optimizer.ADAM:
        return torch.optim.Adam(params, lr=lr, fused=fused or None)
    return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM, fused=fused or None)


class PlanExecutor:
    """Executes ``plan`` on this rank, one step at a time."""

    def __init__(self, plan: Plan, graph: OpGraph, workload: Workload, ctx: RankContext, *,
                 seed: int = 0, lr: float | None = None, fusion_backend: str | None = "inductor"):
        from dl_nfv.profilers.capture import capture

        self.plan = plan
        self.ctx = ctx
        self.mode = execution_mode(plan)
        self.workload = workload
        module = workload.module.to(ctx.torch_device)
        example, _ = workload.make_batch(plan.batch_size, seed)
        leaves = tuple(graph.model.options.get("leaf_modules", ()))
        cap = capture(module, example, granularity=graph.granularity, leaf_modules=leaves)
        self.capture = cap
        self._graph = graph
        inputs = set(cap.input_ops)
        unit_of_op, placements, group_of_unit = self._units(plan, inputs)
        known = set(cap.op_ids)
        missing = sorted(set(unit_of_op) - known)
        if missing:
            raise BadInput(f"the plan names op {missing[0]!r}, which the traced model "
                           f"{graph.model.name!r} does not have (was the graph profiled at "
                           f"another granularity?)")

        def make_inputs(rows: int):
            return to_device(workload.make_batch(rows, seed)[0], ctx.torch_device)

        info = probe(cap.graph_module, make_inputs)
        self.partition = split(cap.graph_module, cap.op_of, unit_of_op, info,
                               {u: (pl.devices, pl.shares) for u, pl in placements.items()})
        placements = {u: placements[u] for u in self.partition.units}
        self.fused = fuse_partition(self.partition, cap, plan.fusion.op_groups if plan.fusion
                                    else (), backend=fusion_backend)
        microbatches = plan.pipeline.microbatches if plan.pipeline is not None else 1
        self.runner = UnitRunner(self.partition, placements, device=ctx.device_name,
                                 rank_of=ctx.rank_of, microbatches=microbatches,
                                 batch_size=plan.batch_size, comm=ctx.comm, loss_fn=workload.loss)
        self.actions = self._actions(plan, graph)
        self.syncs = self._syncs(plan, module, placements, group_of_unit)
        owned = [p for s in self.syncs for p in s.owned_params()]
        self.optimizer = make_optimizer(owned, plan.optimizer, lr)

    # ------------------------------------------------------------------ units
    def _units(self, plan: Plan, inputs: set[str]):
        unit_of_op: dict[str, str] = {}
        placements: dict[str, Placement] = {}
        group_of_unit: dict[str, Any] = {}
        if self.mode is ExecutionMode.PLACEMENT:
            group_of_op = {op: g for g in plan.groups for op in g.ops if op not in inputs}
            unit_of_op = placement_units(plan, self._graph, group_of_op)
            for op, uid in unit_of_op.items():
                g = group_of_op[op]
                placements[uid] = Placement(g.devices, g.shares)
                group_of_unit[uid] = g
            return unit_of_op, placements, group_of_unit
        stages = plan.pipeline.stages if plan.pipeline is not None else (plan.groups[0].id,)
        for g in plan.groups:
            if g.id not in stages:
                stray = [op for op in g.ops if op not in inputs]
                if stray:
                    raise BadInput(f"group {g.id!r} holds op {stray[0]!r} but is not a pipeline "
                                   f"stage; the runtime runs pipelines whose stages hold every op")
                continue
            for op in g.ops:
                if op not in inputs:
                    unit_of_op[op] = g.id
            placements[g.id] = Placement(g.devices, g.shares)
            group_of_unit[g.id] = g
        return unit_of_op, placements, group_of_unit

    def _actions(self, plan: Plan, graph: OpGraph) -> list[tuple[str, str, int]]:
        me = self.ctx.device_name
        units = self.partition.units
        if self.mode is ExecutionMode.PIPELINE:
            stages = plan.pipeline.stages
            return [(a.op, stages[a.stage], a.microbatch) for a in plan.pipeline.actions(me)
                    if stages[a.stage] in units]
        if self.mode is not ExecutionMode.PLACEMENT:
            uid = plan.groups[0].id
            return [("F", uid, 0), ("B", uid, 0)] if me in plan.groups[0].devices else []
        mine = {u for u in units if me in self.runner.placements[u].devices}
        order = plan.order.get(me) or tuple(graph.topological_ids())
        unit_of = {op: uid for uid in mine for op in units[uid].ops}
        listed = [unit_of[op] for op in order if op in unit_of]
        ordered = set(order)
        absent = sorted(op for uid in mine for op in units[uid].ops if op not in ordered)
        if absent:
            raise BadInput(f"plan.order of {me!r} lacks op {absent[0]!r}, which runs there")
        seq = list(dict.fromkeys(listed))
        return [("F", uid, 0) for uid in seq] + [("B", uid, 0) for uid in reversed(seq)]

    # ------------------------------------------------------------------ syncs
    def _syncs(self, plan: Plan, module: torch.nn.Module, placements: dict[str, Placement],
               group_of_unit: dict[str, Any]) -> list[GradientSync | TieExchange]:
        holders: dict[int, set[str]] = defaultdict(set)
        groups_of: dict[int, list] = defaultdict(list)
        for uid, unit in self.partition.units.items():
            for p in unit.parameters():
                holders[id(p)].update(placements[uid].devices)
                groups_of[id(p)].append(group_of_unit[uid])
        bucket_of = self._bucket_of(plan)
        rank_of = self.ctx.rank_of
        exchanged = self._exchanged(plan, holders, groups_of)
        sfb_ids, sfb, self.sfb_groups = sfb_syncs(
            plan, self.capture, module, holders, rank=self.ctx.rank, rank_of=rank_of,
            world_size=self.ctx.world_size, comm=self.ctx.comm)
        keyed: dict[tuple, list[torch.nn.Parameter]] = {}
        syncs: list = list(sfb)
        tied: dict[str, torch.nn.Parameter] = {}
        for name, p in module.named_parameters():
            if id(p) not in holders or not p.requires_grad or id(p) in sfb_ids:
                continue
            if name in exchanged:
                tied[name] = p
                continue
            groups = groups_of[id(p)]
            ps = all(g.sync is SyncMethod.PS for g in groups) and len(
                {g.ps_servers for g in groups}) == 1
            servers = tuple(sorted(rank_of[d] for d in groups[0].ps_servers)) if ps else ()
            ranks = tuple(sorted({rank_of[d] for d in holders[id(p)]} | set(servers)))
            method = SyncMethod.PS if ps else SyncMethod.ALLREDUCE
            keyed.setdefault((ranks, method, servers), []).append(p)
        # each exchange gets a communicator of its own, so that its receive, posted when a
        # step begins, cannot be matched with the pipeline's transfers (NCCL matches
        # point-to-point calls between two ranks in the order they are issued)
        for index, name in enumerate(sorted(tied)):
            owner, sharer = exchanged[name]
            group = dist.new_group(sorted((owner, sharer)))  # every rank, in the same order
            if self.ctx.rank in (owner, sharer):
                syncs.append(TieExchange(tied[name], owner=owner, sharer=sharer,
                                         rank=self.ctx.rank, comm=self.ctx.comm, group=group,
                                         index=index))
        everyone = tuple(range(self.ctx.world_size))
        for key in sorted(keyed, key=lambda k: (k[0], k[1].value, k[2])):
            ranks, method, servers = key
            # every rank creates every subgroup, in the same order (torch.distributed's rule)
            group = None
            if len(ranks) > 1 and ranks != everyone:
                group = dist.new_group(list(ranks))
            if self.ctx.rank not in ranks:
                continue
            params = keyed[key]
            buckets: dict[int, list] = defaultdict(list)
            for p in params:
                buckets[bucket_of.get(id(p), len(bucket_of) + 1)].append(p)
            ordered = [buckets[b] for b in sorted(buckets)]
            syncs.append(GradientSync(ordered, ranks=ranks, rank=self.ctx.rank, comm=self.ctx.comm,
                                      method=method, servers=servers, group=group,
                                      accumulations=accumulations(self.runner, self.actions)))
        return syncs

    def _exchanged(self, plan: Plan, holders: dict[int, set[str]], groups_of: dict[int, list]
                   ) -> dict[str, tuple[int, int]]:
        """Tied weights summed by exchange (``TieSync.EXCHANGE``): parameter name ->
        (owner rank, sharer rank), for the ties the cost model lets exchange (its owner
        a lookup, two single-device groups holding it); every other tie is AllReduced."""
        if plan.tie_sync is not TieSync.EXCHANGE:
            return {}
        graph = self._graph
        lookups = lookup_rows(graph)
        group_of_op = {op: g for g in plan.groups for op in g.ops}
        params = dict(self.workload.module.named_parameters())
        out = {}
        for name, owner, _, _ in tied_weights(graph):
            p = params.get(name)
            if owner not in lookups or p is None or id(p) not in holders:
                continue
            owner_devices = group_of_op[owner].devices
            if exchangeable(lookups, owner, owner_devices, [g.devices for g in groups_of[id(p)]]):
                (sharer,) = holders[id(p)] - set(owner_devices)
                out[name] = (self.ctx.rank_of[owner_devices[0]], self.ctx.rank_of[sharer])
        return out

    def _bucket_of(self, plan: Plan) -> dict[int, int]:
        """Parameter id -> index of the plan's gradient bucket that holds its op."""
        if plan.fusion is None:
            return {}
        gm = self.capture.graph_module
        out: dict[int, int] = {}
        for index, bucket in enumerate(plan.fusion.gradient_buckets):
            for op in bucket:
                for node in self.capture.nodes(op) if op in self.capture.nodes_of else ():
                    for p in _node_params(gm, node):
                        out.setdefault(id(p), index)
        return out

    # ------------------------------------------------------------------- step
    def step(self, inputs: tuple, target: Any) -> float:
        """Run one training step; returns this rank's share-weighted loss."""
        timeline = self.ctx.comm.timeline
        # zeroing the gradients is optimizer upkeep: the simulator's update task holds it too
        with span("zero gradients"), timeline.span("update", "zero gradients"):
            for s in self.syncs:
                s.zero_grad()
        self.runner.begin_step(inputs, target, self.actions)
        for phase, uid, mb in self.actions:
            if phase == "F":
                self.runner.forward(uid, mb)
            elif phase == "W":
                self.runner.weights(uid, mb)
            else:
                self.runner.backward(uid, mb, split=phase == "I")
        loss = self.runner.end_step()
        exchanging = [s for s in self.syncs
                      if not isinstance(s, GradientSync) or s.method is not SyncMethod.NONE]
        if exchanging:  # (a parameter held by this device alone has nothing to exchange)
            with span("reduce gradients"), timeline.span("communication", "reduce gradients"):
                for s in exchanging:
                    s.reduce()
        with span("update"), timeline.span("update", "update"):
            if self.optimizer is not None:
                self.optimizer.step()
        pulling = [s for s in exchanging if isinstance(s, GradientSync) and s.method is SyncMethod.PS]
        if pulling:  # a server sends its shard's values (gloo: in the caller's thread)
            with span("ps-pull"), timeline.span("communication", "pull parameters"):
                for s in pulling:
                    s.pull()
        return loss

    def held_parameters(self) -> dict[str, torch.Tensor]:
        """Name -> value of every parameter this rank holds (for numerics checks)."""
        held = {id(p) for s in self.syncs for p in s.params}
        return {name: p.detach().cpu().clone()
                for name, p in self.workload.module.named_parameters() if id(p) in held}

    def op_times_ms(self) -> dict[str, dict[str, list[float]]]:
        """Placement mode: {"F"|"B": {op: [ms per step]}} measured on this rank.

        Only ops that ran the whole batch on one device are reported, so every
        figure is comparable with the op graph's (full-batch) times.
        """
        if self.mode is not ExecutionMode.PLACEMENT:
            return {}
        out: dict[str, dict[str, list[float]]] = {"F": {}, "B": {}}
        units = self.partition.units
        for (uid, phase), times in self.runner.unit_time_ms.items():
            if len(self.runner.placements[uid].devices) == 1 and len(units[uid].ops) == 1:
                out[phase][units[uid].ops[0]] = list(times)
        return out


def _node_params(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[torch.nn.Parameter]:
    if node.op == "call_module":
        return list(gm.get_submodule(str(node.target)).parameters())
    if node.op == "get_attr":
        value = gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        return [value] if isinstance(value, torch.nn.Parameter) else []
    return []
