"""Micro-batched TAG strategies: a strategy per op group run as a synchronous pipeline.

A TAG strategy is a ``Batching`` (the number of microbatches ``M`` and the pipeline
schedule) and one ``learned.env.GroupStrategy`` per op group. The plan has one plan
group per op group (HeteroG's plan); with ``M > 1`` the groups, in topological order,
are also the stages of a ``Pipeline`` of ``M`` microbatches (the coarsening keeps op
groups contiguous in one topological order, so data only flows to later stages). A
stage may be replicated (its group's replica set and batch shares) and a device may run
several stages; each group still synchronises its own gradients after its last
backward, as a gradient bucket would.

Schedules (``SCHEDULES``): ``gpipe`` (fill-drain) and ``1f1b`` (warm-up, alternate,
drain), each stage's order from ``planners.schedules``, made for the **runs** of
consecutive groups that take one strategy (a run is one pipeline stage in the usual
sense; its groups run each of its actions in turn). The global order: every run
performs its order in unit-time rounds (an action runs in the first round after its
forward predecessor on the run before, or its backward successor on the run after, has
run), and actions are ranked by (round, run). Each device runs its groups' actions in
that rank; since the global order respects every dependency, the projection cannot
deadlock.

A batching is **valid** for a strategy when ``M`` divides the batch and every replica of
every replicated plan group holds at least ``M`` samples (one row per microbatch, as the
runtime splits rows). An invalid strategy, and one whose simulation overflows a device's
memory, is scored as ``learned.env.score`` penalises an overflow (``INVALID_PENALTY``
for the former): memory is checked by the same simulation that times the plan.

Limits: the schedules are GPipe and 1F1B only (no interleaving, no split backward, no
list-scheduled orders as ``plan pipeline`` makes); stage boundaries are op-group
boundaries; no gradient buckets (one synchronisation per plan group).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dl_nfv.artifacts import (
    Action,
    Group,
    Pipeline,
    Plan,
    ScheduleKind,
    SyncMethod,
    format_schedule,
)
from dl_nfv.simulator import simulate

from ..learned.decoder import PS_PROP, SINGLE, SUBSET_PROP, Candidate
from ..learned.env import OVERFLOW_WEIGHT, GroupStrategy, Outcome, StrategyEnv, score
from ..schedules import gpipe, one_f_one_b

SCHEDULES = ("gpipe", "1f1b")
MICROBATCH_COUNTS = (2, 4, 8, 16, 32)
INVALID_PENALTY = 1.0 + OVERFLOW_WEIGHT


@dataclass(frozen=True, order=True, slots=True)
class Batching:
    """``microbatches`` per iteration and the pipeline ``schedule`` (``none`` for one)."""

    microbatches: int = 1
    schedule: str = "none"

    def __str__(self) -> str:
        return "1 microbatch" if self.microbatches == 1 else \
            f"{self.microbatches} microbatches, {self.schedule}"


ONE = Batching()


def batchings(batch_size: int, extra: Sequence[Batching] = ()) -> tuple[Batching, ...]:
    """``ONE``, then every count of ``MICROBATCH_COUNTS`` dividing ``batch_size`` with each
    schedule, then any of ``extra`` not yet listed (each dividing the batch)."""
    out = [ONE] + [Batching(m, s) for m in MICROBATCH_COUNTS if batch_size % m == 0
                   for s in SCHEDULES]
    out += [b for b in extra if b not in out and batch_size % b.microbatches == 0]
    return tuple(dict.fromkeys(out))


def runs(strategies: Sequence[GroupStrategy]) -> list[range]:
    """The runs of consecutive op groups that take one strategy, in order."""
    out, first = [], 0
    for i in range(1, len(strategies) + 1):
        if i == len(strategies) or strategies[i] != strategies[first]:
            out.append(range(first, i))
            first = i
    return out


def device_schedules(groups: Sequence[Group], strategies: Sequence[GroupStrategy],
                     batching: Batching) -> dict[str, str]:
    """Every device's action list (module docstring): the schedule is made for the runs
    of groups with one strategy as its stages; each action of a run stands for that
    action of its groups in turn (forwards first to last, backwards last to first)."""
    spans = runs(strategies)
    make = gpipe if batching.schedule == "gpipe" else one_f_one_b
    orders = make(len(spans), batching.microbatches).orders
    rank = _rounds(orders)
    every = sorted((a for order in orders for a in order), key=lambda a: (rank[a], a.stage))
    out: dict[str, list[Action]] = defaultdict(list)
    for a in every:
        span = spans[a.stage]
        devices = groups[span[0]].devices
        for s in (span if a.op == "F" else reversed(span)):
            step = Action(s, a.op, a.microbatch)
            for d in devices:
                out[d].append(step)
    return {d: format_schedule(actions) for d, actions in out.items()}


def _rounds(orders: Sequence[Sequence[Action]]) -> dict[Action, int]:
    """The unit-time round each action runs in (F after the stage before's F of its
    microbatch, B after the stage after's B; each stage one action a round, in order)."""
    last = len(orders) - 1
    done: dict[tuple[int, str, int], int] = {}
    rank: dict[Action, int] = {}
    pos = [0] * len(orders)
    r = 0
    while any(p < len(o) for p, o in zip(pos, orders)):
        ran = []
        for s, order in enumerate(orders):
            if pos[s] == len(order):
                continue
            a = order[pos[s]]
            need = ((s - 1, "F", a.microbatch) if a.op == "F" and s > 0 else
                    (s + 1, "B", a.microbatch) if a.op == "B" and s < last else None)
            if need is None or done.get(need, r) < r:
                ran.append(a)
        if not ran:  # the generators' orders never deadlock; this guards the loop
            raise ValueError("the stage orders deadlock")
        for a in ran:
            done[(a.stage, a.op, a.microbatch)] = rank[a] = r
            pos[a.stage] += 1
        r += 1
    return rank


def valid(plan_groups: Sequence[Group], batch_size: int, batching: Batching) -> bool:
    """``batching.microbatches`` divides the batch and every replica of every replicated
    group holds at least that many samples."""
    m = batching.microbatches
    if batch_size % m:
        return False
    return all(round(s * batch_size) >= m for g in plan_groups if len(g.devices) > 1
               for s in g.shares)


class BatchedEnv:
    """A ``StrategyEnv`` whose strategies also take a ``Batching``.

    ``plan_of`` and ``evaluate`` take the batching; ``at(batching)`` is a view with the
    batching fixed, whose ``evaluate(strategies)`` and ``cm`` serve ``learned.refine``.
    """

    def __init__(self, env: StrategyEnv):
        self.env, self.cm = env, env.cm
        self.batch_size = env.graph.model.batch_size

    def plan_of(self, strategies: Sequence[GroupStrategy], batching: Batching = ONE, *,
                planner: str = "learned") -> Plan:
        """The plan of ``strategies`` run with ``batching`` (module docstring)."""
        plan = self.env.plan_of(strategies, planner=planner)
        if batching.microbatches == 1:
            return plan
        schedule = device_schedules(plan.groups, strategies, batching)
        one_each = all(sum(d in g.devices for g in plan.groups) == 1 for d in schedule)
        kind = ScheduleKind(batching.schedule) if one_each else ScheduleKind.CUSTOM
        pipe = Pipeline(microbatches=batching.microbatches,
                        stages=tuple(g.id for g in plan.groups), schedule_kind=kind,
                        schedule=schedule)
        return replace(plan, pipeline=pipe)

    def evaluate(self, strategies: Sequence[GroupStrategy], batching: Batching = ONE) -> Outcome:
        """Simulate and score (``learned.env.score``; an invalid batching is penalised)."""
        plan = self.plan_of(strategies, batching)
        result = simulate(plan, self.env.graph, self.env.topology, cost_model=self.cm,
                          check_fingerprints=False)
        got = score(result.iteration_ms, result.overflows, self.cm)
        if batching.microbatches > 1 and not valid(plan.groups, self.batch_size, batching):
            return Outcome(reward=got.reward * INVALID_PENALTY, iteration_ms=got.iteration_ms,
                           shortfall_bytes=got.shortfall_bytes, feasible=False)
        return got

    def at(self, batching: Batching) -> _Fixed:
        return _Fixed(self, batching)


class _Fixed:
    """``BatchedEnv`` at one batching, with ``StrategyEnv``'s ``evaluate`` signature."""

    def __init__(self, env: BatchedEnv, batching: Batching):
        self.env, self.batching, self.cm = env, batching, env.cm

    def evaluate(self, strategies: Sequence[GroupStrategy]) -> Outcome:
        return self.env.evaluate(strategies, self.batching)


def candidate_of(strategy: GroupStrategy, devices: Sequence[str]) -> Candidate:
    """A candidate for a strategy outside ``learned.decoder.candidates`` (a seed's), of the
    kind the network embeds it as: one device, a parameter server, or a replica subset."""
    index = {d: i for i, d in enumerate(devices)}
    members = tuple(index[d] for d in strategy.devices)
    if len(members) == 1:
        return Candidate(kind=SINGLE, strategy=strategy, members=members)
    if strategy.sync is SyncMethod.PS:
        return Candidate(kind=PS_PROP, strategy=strategy, members=members,
                         server=index[strategy.ps_server])
    return Candidate(kind=SUBSET_PROP, strategy=strategy, members=members)
