"""``disco``: joint op fusion and gradient tensor fusion for data-parallel training.

After DisCo (TPDS 2022, "Optimizing DNN compilation for distributed training with joint
OP and tensor fusion"; only its abstract is known, the design here is ours). The plan is
``dp``'s data parallelism over every device; DisCo decides its ``fusion``: which ops run
as one fused kernel and which gradients are AllReduced together, in what order.

1. **Seeds**: the three baselines' strategies (``dp-no-fusion``, ``dp-horovod``,
   ``dp-xla-like``: ``baselines``) and greedy maximal fusion with DDP-style buckets of
   every size in ``SEED_BUCKETS_MB`` and with one bucket of everything. The search starts
   from the fastest, so the plan is never slower than the best baseline.
2. **Search**: backtracking over fusion and bucket moves, each candidate scored by the
   shared simulator, stopped at the ideal-overlap bound, the evaluation cap or the CPU
   time limit (``search.backtrack``).
3. **Costs**: fused kernels are timed by ``CostModel.fused_ms`` (the sum-of-ops rule
   less the launches and memory round trips fusion saves, or a learned estimator where
   one is given to the cost model).

``bound_ms`` of the plan is the ideal-overlap bound (``baselines.ideal_overlap_bound``).
Limits: data parallelism only (one group, every device); buckets are contiguous runs of
an order the seeds fix (reverse topological order of the ops owning parameters); the
fused groups are those ``fusible`` allows.
"""

from __future__ import annotations

import math

from dl_nfv.artifacts import BadInput, Fusion, OpGraph, Plan, PlanStatus, Topology

from ..base import finish, started
from .baselines import MB, baseline_fusions, ddp_buckets, ideal_overlap_bound, setting
from .search import Candidate, backtrack, simulated_score

PLANNER = "disco"
SEED_BUCKETS_MB = (1.0, 4.0, 16.0, 64.0, 256.0)


def plan(graph: OpGraph, topology: Topology, *, seed: int = 0, time_limit: float = 20.0,
         max_evaluations: int = 300, fusion_moves: int = 6, optimizer: str = "sgd",
         collective: str = "auto", estimator: str = "") -> Plan:
    """DisCo: data parallelism with op fusion and gradient buckets chosen jointly by a
    backtracking search on the simulator.

    Parameters
    ----------
    time_limit : float
        CPU seconds the search may take.
    max_evaluations : int
        Candidates the search may simulate (the deterministic cap).
    fusion_moves : int
        Fusion moves tried from every node of the search (drawn with the seed).
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.
    collective : str
        AllReduce algorithm: auto, ring, tree or hierarchical.
    estimator : str
        A fused-kernel estimator (`dl-nfv plan learn disco`): fused groups are priced by it,
        with the per-call cost of a compiled region, instead of the sum-of-ops rule.

    Raises ``BadInput`` for a non-positive or non-finite limit, or an estimator file that
    is not one.
    Complexity: O(evaluations x one simulation) plus the seeds' greedy fusion.
    """
    t0 = started()
    for name, value in (("time_limit", time_limit), ("max_evaluations", max_evaluations)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise BadInput(f"disco: {name} must be > 0, got {value}")
    if fusion_moves < 0:
        raise BadInput(f"disco: fusion_moves must be >= 0, got {fusion_moves}")
    s = setting(graph, topology, seed=seed, optimizer=optimizer, collective=collective)
    if estimator:
        from .estimator import load_estimator

        s.cm.fused_estimator = load_estimator(estimator)
    bound = ideal_overlap_bound(s)
    seeds = seed_candidates(s)
    simulated = simulated_score(lambda fusion: s.simulate(fusion).iteration_ms)
    memo: dict[Candidate, float] = {}

    def score(c: Candidate) -> float:
        if c not in memo:
            memo[c] = simulated(c)
        return memo[c]

    result = backtrack(list(seeds.values()), score, graph, bound_ms=bound.ms, seed=seed,
                       time_limit_s=time_limit, max_evaluations=max_evaluations,
                       fusion_moves_per_node=fusion_moves)
    start = min(seeds, key=lambda k: (score(seeds[k]), k))
    notes = (f"disco: {result.evaluations} candidates simulated from the best seed "
             f"({start}); stopped by {result.stopped_by}; best {result.best_ms:.3f} ms, "
             f"ideal-overlap bound {bound.ms:.3f} ms",)
    status = PlanStatus.TIME_LIMIT if result.stopped_by == "time" else PlanStatus.HEURISTIC
    return finish(planner=PLANNER, graph=graph, topology=topology, groups=s.draft.groups,
                  seed=seed, options={"time_limit": time_limit, "max_evaluations": max_evaluations,
                                      "fusion_moves": fusion_moves, "optimizer": optimizer,
                                      "collective": collective,
                                      **({"estimator": estimator} if estimator else {})},
                  started_at=t0, bound=bound, status=status, fusion=result.best.fusion(),
                  optimizer=s.draft.optimizer, notes=notes, cost_model=s.cm)


def seed_candidates(s) -> dict[str, Candidate]:
    """The search's seeds by name: the baselines, and maximal fusion with buckets of each
    size in ``SEED_BUCKETS_MB`` and of everything. Where some maximal groups do not pay
    (a fused-kernel estimator prices them above their ops unfused: a compiled region's
    per-call cost), the same again with only the groups that pay fused."""
    seeds = {name: Candidate.of(f) for name, f in baseline_fusions(s).items()}
    ops = s.group.ops
    fusions = {"maximal fusion": s.maximal}
    paying = profitable_groups(s)
    if paying != s.maximal:
        fusions["paying fusion"] = paying
    for label, groups in fusions.items():
        for mb in SEED_BUCKETS_MB:
            buckets = ddp_buckets(s.graph, ops, first_bytes=mb * MB, bucket_bytes=mb * MB)
            seeds[f"{label}, {mb:g} MiB buckets"] = Candidate.of(
                Fusion(op_groups=groups, gradient_buckets=buckets))
        everything = ddp_buckets(s.graph, ops, first_bytes=math.inf, bucket_bytes=math.inf)
        seeds[f"{label}, one bucket"] = Candidate.of(Fusion(op_groups=groups,
                                                            gradient_buckets=everything))
    return seeds


def profitable_groups(s) -> tuple[tuple[str, ...], ...]:
    """The groups of maximal fusion whose fused forward plus backward is below their ops'
    unfused sum on the replica of the largest share (all of them under the sum-of-ops rule,
    which never prices a group above its parts)."""
    share, device = max(zip(s.group.shares, s.group.devices))
    cm = s.cm
    needs = cm.needs_grad

    def fused(group) -> float:
        grads = [o for o in group if needs[o]]
        return cm.fused_ms(group, device, "fwd", share) + (
            cm.fused_ms(grads, device, "bwd", share) if grads else 0.0)

    def apart(group) -> float:
        return sum(cm.op_ms(o, device, "fwd", share) + (cm.op_ms(o, device, "bwd", share)
                                                         if needs[o] else 0.0) for o in group)

    return tuple(g for g in s.maximal if fused(list(g)) < apart(g))
