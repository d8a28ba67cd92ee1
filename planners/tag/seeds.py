"""Other planners' plans as TAG strategies: the seeds of ``plan tag``'s search.

A plan becomes a ``batching.Batching`` and one ``learned.env.GroupStrategy`` per op group
of TAG's coarsening (``seed_of_plan``):

* each op group takes the placement of the plan group holding most of its ops: its one
  device; or its replica set with the plan's own batch shares (``balance: even`` or
  ``proportional`` where TAG's even or speed-proportional split gives exactly those
  shares, else ``given``: the plan's fractions kept as they are), synchronised by
  AllReduce with the plan's collective, or by a parameter server on its first server;
* the plan's microbatch count, with GPipe where its schedule is GPipe, else 1F1B.

The batch shares are therefore exact: a replica holds what it holds in the plan, so the
strategy is as valid for the plan's microbatch count as the plan is. What TAG's space
cannot express is listed in ``Seed.differences`` (empty: the seed is exact): an op group
whose ops the plan places differently (a stage boundary inside an op group: the op group
follows most of its ops), parameter servers beyond the first, a schedule other than
GPipe or 1F1B (TAG's runs it as 1F1B over its own stage order), gradient buckets, a
per-device op order, SFB, exchanged tied weights; and, as the check of all of these,
where the strategy simulates (``batching.BatchedEnv.evaluate``) to another time than
the plan's prediction.

A plan TAG cannot run as a strategy is **rejected** (``Rejected``, whose message is the
reason): one on devices the cluster lacks; one under which a replica would hold fewer
samples than microbatches (``batching.valid``: with the plan's own shares, only where
the plan itself splits a replica's rows so, or an op group follows another plan group
than its own ops'); and one whose strategy overflows a device's memory as TAG runs it.

Complexity: one pass over the ops and one simulation per plan.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from dl_nfv.artifacts import Compression, Group, Plan, ScheduleKind, SyncMethod, TieSync

from ..learned.env import GroupStrategy, StrategyEnv
from .batching import ONE, BatchedEnv, Batching, valid

SAME = 1e-4  # relative: a seed simulating within this of the plan's prediction is exact


class Rejected(Exception):
    """A plan TAG cannot run as one of its strategies; the message says why."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Seed:
    """A plan as a TAG strategy: its batching, a strategy per op group, its simulated
    effective ms as TAG runs it, and where it differs from the plan (empty: exact)."""

    planner: str
    batching: Batching
    strategies: tuple[GroupStrategy, ...]
    ms: float
    differences: tuple[str, ...]

    @property
    def exact(self) -> bool:
        return not self.differences


def seed_of_plan(plan: Plan, env: StrategyEnv) -> Seed:
    """``plan`` as a TAG strategy (module docstring); ``Rejected`` naming why it cannot be."""
    known = set(env.devices)
    missing = sorted({d for g in plan.groups for d in (*g.devices, *g.ps_servers)} - known)
    if missing:
        raise Rejected(f"the {plan.planner} plan uses devices this cluster lacks: "
                       f"{', '.join(missing)}")
    batch = env.graph.model.batch_size
    batching = _batching(plan)
    holder = plan.group_of_op
    placement = {g.id: _strategy(g, env) for g in plan.groups}
    strategies, split = [], []
    for k, ops in enumerate(env.coarsening.groups):
        counts = Counter(holder[op].id for op in ops)
        strategies.append(placement[max(counts, key=counts.__getitem__)])
        if len({placement[gid] for gid in counts}) > 1:
            split.append(k)
    batched = BatchedEnv(env)
    made = batched.plan_of(strategies, batching)
    if batching.microbatches > 1 and not valid(made.groups, batch, batching):
        raise Rejected(f"as a TAG strategy the {plan.planner} plan leaves a replica fewer than "
                       f"{batching.microbatches} samples (op groups follow most of their ops)")
    outcome = batched.evaluate(strategies, batching)
    if outcome.shortfall_bytes:
        raise Rejected(f"as a TAG strategy ({batching}) the {plan.planner} plan overflows memory "
                       f"by {outcome.shortfall_bytes / 2**20:.0f} MiB")
    tied = any(op.shared_params for op in env.graph.ops)
    differences = _differences(plan, split, [g for g in plan.groups if len(g.ps_servers) > 1],
                               tied)
    predicted = plan.prediction.iteration_ms if plan.prediction is not None else None
    if predicted is not None and abs(outcome.iteration_ms - predicted) > SAME * predicted:
        differences.append(f"it simulates to {outcome.iteration_ms:.2f} ms as TAG runs it, "
                           f"against the plan's {predicted:.2f} ms")
    return Seed(planner=plan.planner, batching=batching, strategies=tuple(strategies),
                ms=outcome.iteration_ms, differences=tuple(differences))


def _batching(plan: Plan) -> Batching:
    pipe = plan.pipeline
    if pipe is None or pipe.microbatches == 1:
        return ONE
    return Batching(pipe.microbatches, "gpipe" if pipe.schedule_kind is ScheduleKind.GPIPE
                    else "1f1b")


def _strategy(group: Group, env: StrategyEnv) -> GroupStrategy:
    """The strategy of one plan group, its batch shares exact (module docstring)."""
    if len(group.devices) == 1:
        return GroupStrategy(devices=group.devices)
    ps = group.sync is SyncMethod.PS
    common = ({"sync": SyncMethod.PS, "ps_server": group.ps_servers[0]} if ps
              else {"collective": group.collective})
    for balance in ("even", "proportional"):
        trial = GroupStrategy(devices=group.devices, balance=balance, **common)
        made = env.group_of(0, trial)
        if made.devices == group.devices and all(
                abs(a - b) <= 1e-9 for a, b in zip(made.shares, group.shares)):
            return trial
    return GroupStrategy(devices=group.devices, balance="given", shares=group.shares, **common)


def _differences(plan: Plan, split: list[int], servers: list[Group], tied: bool) -> list[str]:
    """What of ``plan`` TAG's strategy leaves out, in words."""
    out = []
    if split:
        out.append(f"op groups {', '.join(map(str, split))} hold ops the plan places apart (a "
                   f"stage boundary inside an op group): each follows most of its ops")
    if servers:
        out.append(f"groups {', '.join(g.id for g in servers)} keep only their first parameter "
                   f"server")
    pipe = plan.pipeline
    if pipe is not None and pipe.microbatches > 1 and pipe.schedule_kind is ScheduleKind.CUSTOM:
        out.append("its own schedule is run as 1F1B over TAG's stages")
    if plan.fusion is not None and plan.fusion.gradient_buckets:
        out.append(f"its {len(plan.fusion.gradient_buckets)} gradient buckets are one "
                   f"synchronisation per op group")
    if plan.order:
        out.append("its per-device op order is left to the simulator")
    if any(g.compression is not Compression.NONE for g in plan.groups):
        out.append("its gradient compression is left out")
    if tied and plan.tie_sync is not TieSync.ALLREDUCE:
        out.append("its tied weights are all-reduced")
    return out
