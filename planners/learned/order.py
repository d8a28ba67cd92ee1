"""Per-device execution order from a priority per op group, by list scheduling.

A strategy per op group fixes where every op runs; what is left is the order in which
each device runs its ops. Here that order comes from one number per op group, its
priority: the list scheduler the op-placement planners share
(``listsched.list_schedule``, HEFT's ready queue) takes the forwards with every unit
pinned to its device (a replicated group's ops split over its replicas with its batch
shares, ``listsched.Split``) and, among the forwards whose inputs are scheduled, takes
the one of highest group priority first (within a group, the topological order), at
its earliest start on its device (insertion into idle gaps). Each device's order is
its ops by earliest start (``OpSchedule.order``): all devices' orders follow one
global order that respects the data edges, so no two devices wait on each other. The
plan's ``order`` carries it; the simulator and the runtime run a device's forwards in
that order and its backwards in the reverse.

Priorities (``refine_order``): two rule-based starts, the topological one (an earlier
group first: what the simulator does without an order) and HEFT's upward rank of each
group (its longest path to the end of the step, on mean costs: the critical path
first); the better by the simulator is hill-climbed by swapping the priorities of two
groups that compete (they share a device and neither depends on the other), first
improvement, until no swap helps or ``max_evaluations`` simulations. Orders already
simulated are not simulated again (a swap that leaves every device's order as it was
costs one list schedule), and where no two groups compete, as on a chain of ops,
there is nothing to search.

Limits: a plan's order is static: a device waits for the next op of its order even
when a later one is ready, where the simulator without an order runs whatever is
ready (forward in topological order, backward in reverse). ``refine_order`` reports
both and leaves the choice to its caller. The list scheduler's own times only rank
the ops (the simulator scores every order); it models every replicated group's
gradient exchange as an AllReduce.

Complexity: one ``StepGraph`` per placement, O((U + E) log U) per list schedule for
U units and E unit edges, plus one simulation per new order.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from dl_nfv.artifacts import Plan

from ..listsched import Split, StepGraph, list_schedule, upward_ranks
from .env import GroupStrategy, Outcome, StrategyEnv

IMPROVEMENT = 1e-9
STARTS = ("topological", "upward rank")


@dataclass(frozen=True, kw_only=True, slots=True)
class Ordering:
    """The best order found: the priority of each op group (higher runs first), each
    device's op order, its simulated outcome, and, for comparison, the outcome of the
    same plan without an order (the simulator's own ready-task priority)."""

    priorities: tuple[float, ...]
    order: dict[str, tuple[str, ...]]
    outcome: Outcome
    unordered: Outcome
    start: str
    evaluations: int
    swaps: int

    @property
    def helps(self) -> bool:
        """The order simulates no slower than the plan without one."""
        return self.outcome.reward >= self.unordered.reward - IMPROVEMENT * abs(self.unordered.reward)


class OrderScheduler:
    """The list scheduler of one placement: ``order(priorities)`` gives each device's order.

    Parameters
    ----------
    env : StrategyEnv
        The problem (its cost model and op groups).
    plan : Plan
        A plan of ``env`` (``env.plan_of``): its groups fix every op's devices and shares.
    """

    def __init__(self, env: StrategyEnv, plan: Plan):
        self.env = env
        self.plan = plan
        cm = env.cm
        splits, pins = {}, {}
        for group in plan.groups:
            if len(group.devices) > 1:
                total = float(sum(group.batch_shares))
                split = Split(devices=tuple(group.devices),
                              shares=tuple(s / total for s in group.batch_shares))
                splits.update(dict.fromkeys(group.ops, split))
        self.sg = sg = StepGraph(cm, env.devices, splits=splits, optimizer=plan.optimizer)
        index = {d: j for j, d in enumerate(env.devices)}
        group_of = {op: g for g, group in enumerate(plan.groups) for op in group.ops}
        self.unit_group = [group_of[sg.op_ids[i]] for i in sg.unit_op]
        for group in plan.groups:
            if len(group.devices) == 1:
                for op in group.ops:
                    pins[sg.units_of_op[cm.op_index[op]][0]] = index[group.devices[0]]
        self.pins = pins
        self.capacity = [math.inf] * sg.D

    def order(self, priorities: Sequence[float]) -> dict[str, tuple[str, ...]]:
        """Each device's op order under ``priorities`` (one per op group, higher first)."""
        unit_priority = [priorities[g] for g in self.unit_group]
        sched = list_schedule(self.sg, unit_priority, allowed=range(self.sg.D),
                              capacity_bytes=self.capacity, pins=self.pins, algorithm="priority")
        return sched.order()

    def upward_priorities(self) -> tuple[float, ...]:
        """HEFT's upward rank of each op group: the largest of its forwards' (mean costs)."""
        rank = upward_ranks(self.sg, range(self.sg.D))
        best = [0.0] * len(self.plan.groups)
        for u, g in enumerate(self.unit_group):
            best[g] = max(best[g], rank[u])
        return tuple(best)

    def competing(self) -> list[tuple[int, int]]:
        """Pairs of op groups whose relative priority can matter: they share a device and
        an op of the later group does not depend on some op of the earlier one (through
        the graph's edges), so both can be ready at once."""
        cm, groups = self.env.cm, self.plan.groups
        topo = cm.graph.topological_ids()
        bit = {op: 1 << i for i, op in enumerate(topo)}
        succ: dict[str, list[str]] = {}
        for e in cm.graph.edges:
            succ.setdefault(e.src, []).append(e.dst)
        below: dict[str, int] = {}  # an op and every op that depends on it
        for op in reversed(topo):
            mask = bit[op]
            for nxt in succ.get(op, ()):
                mask |= below[nxt]
            below[op] = mask
        members = [sum(bit[op] for op in g.ops) for g in groups]
        after = []  # the ops that depend on every op of a group
        for g in groups:
            common = -1
            for op in g.ops:
                common &= below[op]
            after.append(common)
        devices = [set(g.devices) for g in groups]
        n = len(groups)
        return [(a, b) for a in range(n) for b in range(a + 1, n)
                if devices[a] & devices[b] and members[b] & ~after[a]]


def topological_priorities(n: int) -> tuple[float, ...]:
    """An earlier op group first (groups follow one topological order)."""
    return tuple(float(n - g) for g in range(n))


def refine_order(env: StrategyEnv, strategies: Sequence[GroupStrategy], *,
                 max_evaluations: int = 200, time_limit_s: float = 30.0,
                 priorities: Sequence[float] | None = None) -> Ordering:
    """The best per-device order found for ``strategies`` (see the module docstring):
    the better rule-based start (or ``priorities`` where given), then swaps of competing
    groups' priorities, bounded by ``max_evaluations`` simulations and ``time_limit_s``
    seconds of CPU time."""
    plan = env.plan_of(strategies)
    unordered = env.evaluate_plan(plan)
    scheduler = OrderScheduler(env, plan)
    seen: dict[tuple, Outcome] = {}
    evaluations = 1

    def outcome_of(prio: Sequence[float]) -> tuple[Outcome, dict]:
        nonlocal evaluations
        order = scheduler.order(prio)
        key = tuple(sorted(order.items()))
        if key not in seen:
            seen[key] = env.evaluate_plan(replace(plan, order=order))
            evaluations += 1
        return seen[key], order

    n = len(plan.groups)
    starts = ({"given": tuple(priorities)} if priorities is not None else
              {"topological": topological_priorities(n), "upward rank": scheduler.upward_priorities()})
    best = None
    for name, prio in starts.items():
        got, order = outcome_of(prio)
        if best is None or got.reward > best[0].reward + IMPROVEMENT * abs(best[0].reward):
            best = (got, order, tuple(prio), name)
    outcome, order, current, origin = best
    swaps, deadline = 0, time.process_time() + time_limit_s
    moved = True
    while moved:
        moved = False
        for a, b in scheduler.competing():
            if evaluations >= max_evaluations or time.process_time() > deadline:
                moved = False
                break
            trial = list(current)
            trial[a], trial[b] = trial[b], trial[a]
            if trial[a] == trial[b]:
                continue
            got, got_order = outcome_of(trial)
            if got.reward > outcome.reward + IMPROVEMENT * abs(outcome.reward):
                outcome, order, current, moved = got, got_order, tuple(trial), True
                swaps += 1
    return Ordering(priorities=current, order=order, outcome=outcome, unordered=unordered,
                    start=origin, evaluations=evaluations, swaps=swaps)


def order_of(env: StrategyEnv, strategies: Sequence[GroupStrategy],
             priorities: Sequence[float]) -> Mapping[str, tuple[str, ...]]:
    """Each device's op order for ``strategies`` under ``priorities`` (one per op group)."""
    return OrderScheduler(env, env.plan_of(strategies)).order(priorities)
