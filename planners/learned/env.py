"""The simulator as a training environment: a strategy per op group -> a plan -> a reward.

A ``GroupStrategy`` says where one op group runs: on one device (model parallel), or
replicated over a device set with batch shares even or proportional to device speed
(``base.device_speeds``, the samples split by ``base.integer_shares``), its gradients
synchronised by AllReduce (the cost model's algorithms, ``collective``) or through a
parameter server on a chosen device. ``StrategyEnv.plan_of`` turns one strategy per
group into a ``Plan`` (one plan group per op group), and ``StrategyEnv.evaluate``
simulates it on the shared simulator with one cost model reused across calls.

Reward: ``-iteration_ms`` for a plan that fits; a plan that overflows some device's
memory is penalised by its shortfall, scale-free:
``-iteration_ms x (1 + OVERFLOW_WEIGHT x sum(shortfall) / sum(memory of the devices short))``,
so a plan twice over its devices' memory scores far worse than any plan that fits at
a similar speed, and a small overflow only a little worse than a fit.

``plan_of`` leaves each device's order to the simulator (ready tasks, forward in
topological order, backward in reverse); ``evaluate_plan`` scores a plan given one
(``order.refine_order``).

Limits: no pipeline microbatches, no gradient buckets (one synchronisation per group
after its backward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from dl_nfv.artifacts import (
    BadInput,
    Collective,
    Group,
    OpGraph,
    Optimizer,
    Plan,
    SyncMethod,
    Topology,
    fingerprint,
)
from dl_nfv.artifacts.plan import SHARE_TOLERANCE
from dl_nfv.simulator import simulate
from dl_nfv.simulator.costs import CostModel

from ..base import device_speeds, integer_shares, replicas
from .coarsen import Coarsening

OVERFLOW_WEIGHT = 10.0
BALANCES = ("even", "proportional", "given")


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupStrategy:
    """Where one op group runs and how its replicas synchronise.

    ``devices``: one device, or the replica set; ``balance``: ``even`` or
    ``proportional`` batch shares, or ``given``: ``shares``, one batch fraction per
    device (another planner's plan's, kept exactly); ``sync``: ``allreduce`` or ``ps``
    (with ``ps_server``) for a replica set, ignored for one device.
    """

    devices: tuple[str, ...]
    balance: str = "even"
    sync: SyncMethod = SyncMethod.ALLREDUCE
    ps_server: str = ""
    collective: Collective = Collective.AUTO
    shares: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.devices:
            raise BadInput("a group strategy needs at least one device")
        if self.balance not in BALANCES:
            raise BadInput(f"balance must be one of {', '.join(BALANCES)}, got {self.balance!r}")
        if len(self.devices) > 1 and self.sync is SyncMethod.PS and not self.ps_server:
            raise BadInput(f"a parameter-server strategy over {list(self.devices)} names no server")
        if (self.balance == "given") != bool(self.shares) or (
                self.shares and (len(self.shares) != len(self.devices) or min(self.shares) <= 0
                                 or abs(sum(self.shares) - 1.0) > SHARE_TOLERANCE)):
            raise BadInput(f"balance 'given' needs a positive share per device summing to 1 (and "
                           f"only it takes shares): {self.balance!r}, {list(self.shares)} for "
                           f"{list(self.devices)}")

    def rebalanced(self, balance: str) -> GroupStrategy:
        """This replica set with ``even`` or ``proportional`` shares instead."""
        return replace(self, balance=balance, shares=())


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What one evaluation gave: the reward and the figures it came from."""

    reward: float
    iteration_ms: float
    shortfall_bytes: int
    feasible: bool


class StrategyEnv:
    """One (graph, cluster, coarsening) as an environment.

    Parameters
    ----------
    graph, topology
        The problem.
    coarsening : Coarsening
        Its op groups (``coarsen.coarsen``).
    optimizer : Optimizer
        The optimizer planned for (its state and step).
    """

    def __init__(self, graph: OpGraph, topology: Topology, coarsening: Coarsening, *,
                 optimizer: Optimizer = Optimizer.SGD, cost_model: CostModel | None = None):
        self.graph = graph
        self.topology = topology
        self.coarsening = coarsening
        self.optimizer = optimizer
        self.cm = cost_model or CostModel(graph, topology)
        self.devices = tuple(self.cm.cluster.device_names)
        self._graph_sha = fingerprint(graph)
        self._topology_sha = fingerprint(topology)
        self._speeds = dict(zip(self.devices, device_speeds(self.cm, self.devices)))

    def group_of(self, index: int, strategy: GroupStrategy) -> Group:
        """The plan group of op group ``index`` under ``strategy``."""
        for d in (*strategy.devices, *([strategy.ps_server] if strategy.ps_server else [])):
            self.cm.cluster.device(d)  # raises UnknownName
        ops = self.coarsening.groups[index]
        gid = f"g{index}"
        if len(strategy.devices) == 1:
            return Group(id=gid, ops=ops, devices=strategy.devices, sync=SyncMethod.NONE)
        if strategy.shares:
            used, shares = strategy.devices, strategy.shares
        else:
            weights = ([self._speeds[d] for d in strategy.devices]
                       if strategy.balance == "proportional" else [1.0] * len(strategy.devices))
            used, shares = replicas(strategy.devices,
                                    integer_shares(self.graph.model.batch_size, weights))
        if len(used) == 1:  # the batch is smaller than the replica set
            return Group(id=gid, ops=ops, devices=used, sync=SyncMethod.NONE)
        if strategy.sync is SyncMethod.PS:
            return Group(id=gid, ops=ops, devices=used, batch_shares=shares, sync=SyncMethod.PS,
                         ps_servers=(strategy.ps_server,))
        return Group(id=gid, ops=ops, devices=used, batch_shares=shares,
                     sync=SyncMethod.ALLREDUCE, collective=strategy.collective)

    def plan_of(self, strategies: Sequence[GroupStrategy], *, planner: str = "learned") -> Plan:
        """A plan with one group per op group (no prediction: ``evaluate`` simulates it)."""
        if len(strategies) != len(self.coarsening.groups):
            raise BadInput(f"{len(strategies)} strategies for {len(self.coarsening.groups)} op groups")
        groups = tuple(self.group_of(i, s) for i, s in enumerate(strategies))
        return Plan(planner=planner, graph_sha256=self._graph_sha,
                    topology_sha256=self._topology_sha, batch_size=self.graph.model.batch_size,
                    optimizer=self.optimizer, groups=groups)

    def evaluate(self, strategies: Sequence[GroupStrategy]) -> Outcome:
        """Simulate the plan of ``strategies`` and score it (see the module docstring)."""
        return self.evaluate_plan(self.plan_of(strategies))

    def evaluate_plan(self, plan: Plan) -> Outcome:
        """Simulate a plan of this problem (``plan_of``'s, perhaps given an ``order``) and
        score it."""
        result = simulate(plan, self.graph, self.topology, cost_model=self.cm,
                          check_fingerprints=False)
        return score(result.iteration_ms, result.overflows, self.cm)


def score(iteration_ms: float, overflows: Sequence[tuple[str, float, int]], cm: CostModel) -> Outcome:
    """The reward of a simulated iteration with its ``(device, time, shortfall)`` overflows."""
    short = sum(int(b) for _, _, b in overflows)
    if not short:
        return Outcome(reward=-iteration_ms, iteration_ms=iteration_ms, shortfall_bytes=0,
                       feasible=True)
    memory = sum(cm.memory_bytes(d) for d in dict.fromkeys(d for d, _, _ in overflows))
    penalty = 1.0 + OVERFLOW_WEIGHT * short / memory
    return Outcome(reward=-iteration_ms * penalty, iteration_ms=iteration_ms,
                   shortfall_bytes=short, feasible=False)
