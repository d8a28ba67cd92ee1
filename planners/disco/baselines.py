"""DisCo's baselines and its ideal-overlap bound, all data parallel on the shared cost model.

Every plan here is ``dp``'s: one group of every op over every device of the topology,
batch shares by device speed, gradients AllReduced. They differ only in ``fusion``:

* ``dp-no-fusion`` (PyTorch DDP): no op fusion; gradient buckets in reverse parameter
  order (the reverse topological order of the ops that own parameters), the first
  closed once it holds ``first_bucket_mb`` (1 MiB), each later one once it holds
  ``bucket_mb`` (25 MiB), as DDP's ``_compute_bucket_assignment_by_size`` with
  ``[1 MiB, bucket_cap_mb]``; an op's parameters stay in one bucket.
* ``dp-horovod`` (Horovod tensor fusion): no op fusion; every ``cycle_ms`` (5 ms) the
  background loop fuses the gradients that became ready during the cycle, in the
  order they became ready, into buffers of at most ``threshold_mb`` (64 MiB; a larger
  gradient goes alone). Ready times come from the cost model: the forward of every op,
  then the backwards in reverse topological order, on the replica with the largest
  batch share.
* ``dp-xla-like``: greedy maximal fusion of fusible chains (``fusible.maximal_groups``)
  with DDP's default buckets.

``ideal_overlap_bound``: the iteration time if computation and communication overlapped
as far as they can — the largest of the busiest device's compute under maximal fusion
(with every AllReduce hidden), one AllReduce of all the gradients over every device (with
all computation hidden), and the slowest device's forward pass under maximal fusion
followed by that AllReduce: no gradient exists before the forward pass ends, so the
forward cannot hide any of the step's communication (the paper's ideal-overlap figure,
the larger of the first two, is ``parts["ideal overlap"]``), and the ready-time bound
(``last_gradient_ms``: the gradients that cannot be ready before a time are AllReduced
after it; the first layer's comes last in the backward, and its AllReduce hides behind
nothing). Under ``CostModel.fused_ms``
a group's fused time is at most the sum of its parts' fused times, so no fusion the
search builds computes (or runs its forward) faster than the maximal one; one AllReduce
of everything pays the per-collective latency once. With a learned fused-kernel
estimator in the cost model this does not hold by construction: then the bound is the
ideal-overlap figure of the paper, not a proof.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from dl_nfv.artifacts import Fusion, Group, OpGraph, Plan, Topology
from dl_nfv.simulator import simulate
from dl_nfv.simulator.costs import CostModel

from ..base import finish, started
from ..bounds import Bound
from .fusible import maximal_groups

MB = 2**20
DDP_FIRST_BUCKET_MB = 1.0
DDP_BUCKET_MB = 25.0
HOROVOD_THRESHOLD_MB = 64.0
HOROVOD_CYCLE_MS = 5.0


def ddp_buckets(graph: OpGraph, ops: Sequence[str], *, first_bytes: float = DDP_FIRST_BUCKET_MB * MB,
                bucket_bytes: float = DDP_BUCKET_MB * MB) -> tuple[tuple[str, ...], ...]:
    """DDP's buckets of the ops in ``ops`` that own parameters, in reverse topological order:
    an op joins the open bucket, which closes once it holds ``first_bytes`` (the first) or
    ``bucket_bytes`` (the rest). O(ops)."""
    wanted, index = set(ops), graph.index
    buckets: list[list[str]] = [[]]
    size, cap = 0.0, first_bytes
    for op in reversed(graph.topological_ids()):
        if op not in wanted or index[op].param_bytes == 0:
            continue
        buckets[-1].append(op)
        size += index[op].param_bytes
        if size >= cap:
            buckets.append([])
            size, cap = 0.0, bucket_bytes
    return tuple(tuple(b) for b in buckets if b)


def ready_times_ms(cm: CostModel, group: Group) -> dict[str, float]:
    """When each op's weight gradient is ready on the replica of ``group`` with the largest
    batch share: after every forward and the backwards up to it in reverse topological
    order (no fusion, no waiting)."""
    share, device = max(zip(group.shares, group.devices))
    topo = cm.topological_ids
    needs = cm.needs_grad
    t = sum(cm.op_ms(op, device, "fwd", share) for op in topo)
    ready: dict[str, float] = {}
    for op in reversed(topo):
        if needs[op]:
            t += cm.op_ms(op, device, "bwd", share)
        ready[op] = t
    return ready


def horovod_buckets(graph: OpGraph, ready_ms: dict[str, float], *,
                    threshold_bytes: float = HOROVOD_THRESHOLD_MB * MB,
                    cycle_ms: float = HOROVOD_CYCLE_MS) -> tuple[tuple[str, ...], ...]:
    """Horovod's fused buffers: the ops owning parameters in order of ``ready_ms`` (ties in
    reverse topological order), one buffer per cycle of ``cycle_ms`` their gradients became
    ready in, split where adding a gradient would take a buffer over ``threshold_bytes``.
    O(ops log ops)."""
    index = graph.index
    rank = {op: i for i, op in enumerate(reversed(graph.topological_ids()))}
    owners = sorted((op for op in ready_ms if index[op].param_bytes > 0),
                    key=lambda op: (ready_ms[op], rank[op]))
    buckets: list[list[str]] = []
    size, cycle = 0.0, None
    for op in owners:
        nbytes = index[op].param_bytes
        c = int(ready_ms[op] // cycle_ms)
        if c != cycle or size + nbytes > threshold_bytes:
            buckets.append([])
            size, cycle = 0.0, c
        buckets[-1].append(op)
        size += nbytes
    return tuple(tuple(b) for b in buckets)


@dataclass(frozen=True, slots=True)
class Setting:
    """The data-parallel plan every DisCo candidate shares: graph, topology, cost model and
    ``dp``'s plan (without buckets) whose ``fusion`` candidates replace."""

    graph: OpGraph
    topology: Topology
    cm: CostModel
    draft: Plan
    maximal: tuple[tuple[str, ...], ...]  # the greedy maximal fusion (fusible.maximal_groups)

    @property
    def group(self) -> Group:
        return self.draft.groups[0]

    def simulate(self, fusion: Fusion | None):
        return simulate(replace(self.draft, fusion=fusion), self.graph, self.topology,
                        cost_model=self.cm, check_fingerprints=False)


def setting(graph: OpGraph, topology: Topology, *, seed: int = 0, optimizer: str = "sgd",
            collective: str = "auto") -> Setting:
    """``dp``'s plan over every device (no buckets), its cost model, for the candidates."""
    from ..dp import plan as dp_plan

    draft = dp_plan(graph, topology, seed=seed, bucket_mb=0, optimizer=optimizer,
                    collective=collective)
    return Setting(graph=graph, topology=topology, cm=CostModel(graph, topology), draft=draft,
                   maximal=maximal_groups(graph))


def ideal_overlap_bound(s: Setting) -> Bound:
    """The ideal-overlap iteration time (module docstring): max(compute, communication,
    forward + communication)."""
    result = s.simulate(Fusion(op_groups=s.maximal))
    compute = max(result.busy_ms.values())
    total = float(sum(s.cm.ops_by_id[op].param_bytes for op in s.group.ops))
    comm = s.cm.allreduce_ms(list(s.group.devices), total, s.group.collective) \
        if len(s.group.devices) > 1 and total > 0 else 0.0
    forward = forward_ms(s) if comm > 0 else 0.0
    tail = last_gradient_ms(s) if comm > 0 else 0.0
    return Bound(ms=max(compute, comm, forward + comm, tail),
                 parts={"compute, communication hidden": compute,
                        "communication, compute hidden": comm,
                        "forward, then communication": forward + comm,
                        "gradients by ready time, then their AllReduce": tail,
                        "ideal overlap": max(compute, comm)})


def last_gradient_ms(s: Setting) -> float:
    """The ready-time bound of the step. For each op ``p`` owning parameters, the earliest
    its weight gradient can be ready, ``r(p)``: the slowest replica's forward pass under
    maximal fusion, then the backward of every maximal unit made only of ``p`` and ops
    downstream of it (their gradients flow into ``p``'s); units partly downstream are
    left out. Every gradient with ``r >= t`` is AllReduced after ``t``, at best as one
    AllReduce, so the step lasts at least ``t + AllReduce(their bytes)`` for every ``t``
    among the ``r(p)``; the largest. At the earliest ``t`` this is the forward-then-
    communication term; at the latest, the last gradient's (the first layer's) own
    AllReduce after the whole backward. O(params x units) per replica."""
    index, ops = s.cm.graph.index, s.group.ops
    bit = {op: 1 << i for i, op in enumerate(ops)}
    below: dict[str, int] = {}
    succ: dict[str, list[str]] = {}
    for e in s.cm.graph.edges:
        succ.setdefault(e.src, []).append(e.dst)
    for op in reversed(s.cm.topological_ids):
        if op in bit:
            mask = bit[op]
            for d in succ.get(op, ()):
                mask |= below.get(d, 0)
            below[op] = mask
    unit_of = {op: g for g in s.maximal for op in g}
    units = list(dict.fromkeys(unit_of.get(op, (op,)) for op in ops))
    masks = [sum(bit[o] for o in u) for u in units]
    owners = [op for op in ops if index[op].param_bytes > 0]
    ready = {p: 0.0 for p in owners}
    for device, share in zip(s.group.devices, s.group.shares):
        fwd = sum(s.cm.fused_ms(list(u), device, "fwd", share) for u in units)
        bwd = [s.cm.fused_ms(list(u), device, "bwd", share) for u in units]
        for p in owners:
            done = sum(b for m, b in zip(masks, bwd) if m & below[p] == m)
            ready[p] = max(ready[p], fwd + done)
    devices = list(s.group.devices)
    # every gradient ready no earlier than t is AllReduced after t, at best as one
    # AllReduce: the step lasts at least t plus that, for every t among the ready times
    late, best = 0.0, 0.0
    for p in sorted(owners, key=ready.get, reverse=True):
        late += index[p].param_bytes
        best = max(best, ready[p] + s.cm.allreduce_ms(devices, late, s.group.collective))
    return best


def forward_ms(s: Setting) -> float:
    """The slowest replica's forward pass under maximal fusion (every fused group of
    ``s.maximal`` one unit, every other op alone), at its batch share."""
    unit_of = {op: g for g in s.maximal for op in g}
    units = list(dict.fromkeys(unit_of.get(op, (op,)) for op in s.group.ops))
    return max(sum(s.cm.fused_ms(list(u), device, "fwd", share) for u in units)
               for device, share in zip(s.group.devices, s.group.shares))


def baseline_fusions(s: Setting) -> dict[str, Fusion]:
    """The three baselines' fusion fields, by planner name."""
    ops = s.group.ops
    ddp = ddp_buckets(s.graph, ops)
    horovod = horovod_buckets(s.graph, ready_times_ms(s.cm, s.group))
    return {"dp-no-fusion": Fusion(gradient_buckets=ddp),
            "dp-horovod": Fusion(gradient_buckets=horovod),
            "dp-xla-like": Fusion(op_groups=s.maximal, gradient_buckets=ddp)}


def _plan(name: str, graph: OpGraph, topology: Topology, seed: int, optimizer: str,
          collective: str) -> Plan:
    t0 = started()
    s = setting(graph, topology, seed=seed, optimizer=optimizer, collective=collective)
    fusion = baseline_fusions(s)[name]
    return finish(planner=name, graph=graph, topology=topology, groups=s.draft.groups, seed=seed,
                  options={"optimizer": optimizer, "collective": collective}, started_at=t0,
                  bound=ideal_overlap_bound(s), fusion=fusion, optimizer=s.draft.optimizer,
                  cost_model=s.cm)


def plan_no_fusion(graph: OpGraph, topology: Topology, *, seed: int = 0, optimizer: str = "sgd",
                   collective: str = "auto") -> Plan:
    """PyTorch DDP: data parallelism, no op fusion, 25 MiB gradient buckets (the first 1 MiB)
    in reverse parameter order. Complexity: O(ops) plus three simulations.

    Parameters
    ----------
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.
    collective : str
        AllReduce algorithm: auto, ring, tree or hierarchical.
    """
    return _plan("dp-no-fusion", graph, topology, seed, optimizer, collective)


def plan_horovod(graph: OpGraph, topology: Topology, *, seed: int = 0, optimizer: str = "sgd",
                 collective: str = "auto") -> Plan:
    """Horovod: data parallelism, no op fusion, the gradients ready within each 5 ms cycle
    fused up to 64 MiB. Complexity: O(ops log ops) plus three simulations.

    Parameters
    ----------
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.
    collective : str
        AllReduce algorithm: auto, ring, tree or hierarchical.
    """
    return _plan("dp-horovod", graph, topology, seed, optimizer, collective)


def plan_xla_like(graph: OpGraph, topology: Topology, *, seed: int = 0, optimizer: str = "sgd",
                  collective: str = "auto") -> Plan:
    """XLA-like: data parallelism, greedy maximal fusion of fusible chains, DDP's buckets.
    Complexity: O(ops x (ops + edges)) for the fusion plus three simulations.

    Parameters
    ----------
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.
    collective : str
        AllReduce algorithm: auto, ring, tree or hierarchical.
    """
    return _plan("dp-xla-like", graph, topology, seed, optimizer, collective)
