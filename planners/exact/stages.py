"""The exact planner's objective: the bottleneck load of a pipeline of single-device stages.

A layout is a sequence of stages, each a set of ops on one device of its own, such that
data only flows from a stage to a later one. At ``M`` microbatches per iteration, every
figure below comes from the one cost model (``simulator/costs.py``):

* **compute** of a stage on device ``d``: ``M`` times each op's forward and backward time
  at ``1/M`` of the batch (``CostModel.op_ms``; an op with no parameters at or above it
  has no backward, ``CostModel.needs_grad``), plus the optimizer step over the stage's
  parameters (``update_ms``) and the upkeep of its gradient buckets, zeroed once and
  added into by ``M`` backward passes (``upkeep_ms``);
* **communication** into a stage: everything it receives per microbatch (one tensor per
  producing op, its largest edge into the stage, as the simulator sends it), charged as
  one transfer on a route between two of its devices, ``M`` times per iteration
  (``M x transfer_ms(src, dst, bytes / M)``). Gradients go back over the reverse
  direction of the same links, which carries the same bytes, so the term stands for both;
* **memory** of a stage: its parameters, gradients and optimizer state and its ops'
  resident footprints (``Op.resident_bytes``), plus one microbatch of its stashed activations (its ops' outputs and what it receives), within
  the device's memory, as the pipeline planner's partition charges it (its scheduler then
  caps the microbatches in flight by the memory left).

The objective is the largest compute or communication term over the stages: the time
per iteration the busiest device or link needs in steady state (divided by the batch, the
per-sample bottleneck). It is defined where every pair of distinct devices sees the same
transfer cost (one switch, or a full mesh of equal links: ``uniform_route`` checks it),
so that a transfer's cost does not depend on where its two stages are placed; devices may
differ in type and memory (``device_classes``). A tied weight whose uses are split between
stages is held by each stage using it (a copy: memory, optimizer step, upkeep) and its
owner no longer sums its uses' gradients in its backward (``CostModel.tie_sum_ms``), as the
simulator lowers it; the exchange that sums them is not charged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from dl_nfv.artifacts import BadInput, OpGraph, Optimizer, Topology
from dl_nfv.simulator.costs import CostModel


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """Interchangeable devices: the same type and the same memory."""

    devices: tuple[str, ...]
    type_name: str
    memory_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class StageLoad:
    """What the objective charges one stage on its device (ms per iteration, bytes)."""

    device: str
    compute_ms: float
    comm_ms: float
    received_bytes: float
    memory_bytes: float
    fits: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Objective:
    """The bottleneck load of a layout and what each stage contributes to it."""

    bottleneck_ms: float
    stages: tuple[StageLoad, ...]
    microbatches: int

    @property
    def feasible(self) -> bool:
        return all(s.fits for s in self.stages)


def device_classes(cm: CostModel) -> list[DeviceClass]:
    """The cluster's devices grouped by (type, memory), in the topology's order."""
    groups: dict[tuple[str, int], list[str]] = defaultdict(list)
    for d in cm.cluster.devices:
        groups[(d.type.name, cm.memory_bytes(d.name))].append(d.name)
    return [DeviceClass(tuple(devs), name, mem) for (name, mem), devs in groups.items()]


def uniform_route(cm: CostModel, planner: str = "exact") -> tuple[str, str] | None:
    """A pair of distinct devices whose route stands for every pair's (None: one device).

    Raises ``BadInput`` naming two pairs whose transfers cost differently."""
    devices = cm.cluster.device_names
    if len(devices) < 2:
        return None
    first = (devices[0], devices[1])
    reference = cm.transfer_affine(*first)
    for a in devices:
        for b in devices:
            if a == b:
                continue
            figures = cm.transfer_affine(a, b)
            if any(abs(x - y) > 1e-9 * max(abs(x), abs(y), 1e-12)
                   for x, y in zip(figures, reference)):
                raise BadInput(
                    f"{planner}: the routes {first[0]} -> {first[1]} and {a} -> {b} differ "
                    f"({reference[0]:.4g} ms + {reference[1] * 2**20:.4g} ms/MiB against "
                    f"{figures[0]:.4g} ms + {figures[1] * 2**20:.4g} ms/MiB); the exact planner "
                    f"needs every pair of devices to see the same transfer cost")
    return first


def received_bytes(graph: OpGraph, ops: set[str], before: set[str]) -> float:
    """Bytes a stage of ``ops`` receives per full batch from the ops ``before`` it: one
    tensor per producing op, its largest edge into the stage."""
    largest: dict[str, float] = {}
    for e in graph.edges:
        if e.dst in ops and e.src in before:
            largest[e.src] = max(largest.get(e.src, 0.0), float(e.bytes))
    return sum(largest.values())


def split_ties(cm: CostModel, ops: set[str]) -> tuple[set[str], float]:
    """What a stage of ``ops`` does with tied weights split from it: the owners in it that no
    longer sum their uses' gradients (a sharer is elsewhere: the exchange sums them), and
    the bytes of the copies it holds of weights whose owner is elsewhere (one per sharing
    op), as the simulator lowers them."""
    unsummed, copies = set(), 0.0
    for _, owner, sharer, nbytes in cm.ties:
        if (owner in ops) != (sharer in ops):
            if owner in ops:
                unsummed.add(owner)
            else:
                copies += nbytes
    return unsummed, copies


def stage_params(cm: CostModel, ops: Sequence[str]) -> float:
    """Parameter bytes a stage holds: its ops' own and its copies of tied weights."""
    return float(sum(cm.param_bytes[cm.op_index[o]] for o in ops)) + split_ties(cm, set(ops))[1]


def stage_compute_ms(cm: CostModel, ops: Sequence[str], device: str, microbatches: int,
                     optimizer: Optimizer) -> float:
    """Compute of a stage per iteration (see the module docstring)."""
    m = microbatches
    unsummed, _ = split_ties(cm, set(ops))
    total = 0.0
    for op in ops:
        total += m * cm.op_ms(op, device, "fwd", 1.0 / m)
        if cm.needs_grad[op]:
            total += m * (cm.op_ms(op, device, "bwd", 1.0 / m)
                          - (cm.tie_sum_ms(op, device) if op in unsummed else 0.0))
    params = stage_params(cm, ops)
    return total + cm.update_ms(params, device, optimizer) + cm.upkeep_ms(params, device, m)


def evaluate(graph: OpGraph, topology: Topology, stages: Sequence[tuple[Sequence[str], str]], *,
             microbatches: int, optimizer: Optimizer = Optimizer.SGD,
             cost_model: CostModel | None = None) -> Objective:
    """The objective of a layout: ``stages`` as (op ids, device), in pipeline order.

    Op by op, independently of the planner's tables (tests compare the two). Raises
    ``BadInput`` when routes are not uniform, a device holds two stages, or data flows
    from a stage to an earlier one.
    """
    cm = cost_model or CostModel(graph, topology)
    pair = uniform_route(cm)
    devices = [d for _, d in stages]
    if len(set(devices)) != len(devices):
        raise BadInput(f"exact: a device holds two stages: {devices}")
    stage_of = {op: s for s, (ops, _) in enumerate(stages) for op in ops}
    for e in graph.edges:
        if stage_of[e.src] > stage_of[e.dst]:
            raise BadInput(f"exact: edge {e.src!r} -> {e.dst!r} flows from stage "
                           f"{stage_of[e.src]} back to stage {stage_of[e.dst]}")
    m, state = microbatches, optimizer.state_factor
    loads, before = [], set()
    for ops, device in stages:
        members = set(ops)
        received = received_bytes(graph, members, before)
        comm = m * cm.transfer_ms(*pair, received / m) if pair else 0.0
        params = stage_params(cm, ops)
        outputs = float(sum(cm.output_bytes[cm.op_index[o]] for o in ops))
        resident = float(sum(cm.resident_bytes[cm.op_index[o]] for o in ops))
        need = params * (2.0 + state) + resident + (outputs + received) / m
        loads.append(StageLoad(device=device, compute_ms=stage_compute_ms(cm, ops, device, m,
                                                                          optimizer),
                               comm_ms=comm, received_bytes=received, memory_bytes=need,
                               fits=need <= cm.memory_bytes(device)))
        before |= members
    worst = max((max(s.compute_ms, s.comm_ms) for s in loads), default=0.0)
    return Objective(bottleneck_ms=worst, stages=tuple(loads), microbatches=m)
