"""HeteroG: hybrid parallelism per op group on heterogeneous clusters, from a learned policy.

After Yi et al., "Optimizing distributed training deployment in heterogeneous GPU
clusters" (CoNEXT 2020). The op graph is coarsened into op groups
(``learned.coarsen``); for each group a strategy (``learned.env.GroupStrategy``) says
which devices run it (one device, or a replica set with even or speed-proportional
batch shares) and how a replica set synchronises its gradients (AllReduce, or a
parameter server on a chosen device); the candidates are ``learned.decoder.candidates``.

Method, ``plan``:

1. **Start.** A trained policy (``learned.decoder.StrategyPolicy``: a graph-attention
   encoder over the group graph and the devices, a per-group decoder) reads the
   features (``learned.features``) and each group takes its most likely candidate.
   The shipped policy (``DEFAULT_POLICY``) serves unless ``policy`` names another;
   ``start`` may instead be ``greedy`` (``greedy_start``, a list-scheduling heuristic)
   or ``random`` (seeded), to measure what the learning contributes. Where a uniform
   strategy (every group the same candidate: data parallelism over a device set, or
   the whole model on one device) simulates faster, refinement starts from that.
2. **Refinement.** First-improvement hill climbing over single-group moves on the
   simulator (``learned.refine``), bounded by ``max_evaluations`` simulations and
   ``search_s`` seconds of CPU time.
3. **Execution order.** Each device's order comes from a priority per op group by
   list scheduling (``learned.order``): rule-based priorities (topological, or HEFT's
   upward rank) refined by swapping the priorities of competing groups on the
   simulator, bounded by ``order_evaluations`` simulations. The plan's ``order`` carries
   it where it simulates no slower than the simulator's ready-task order without one.
4. **Microbatches** (dl-nfv's extension, beyond the published HeteroG; ``microbatches``
   1 turns it off). The refined strategy and rule-based stage starts (contiguous op
   groups per device or per host, work in proportion to speed) are simulated under
   every batching (``tag.batching``: 2 to ``microbatches`` microbatches, GPipe or
   1F1B), and the best is climbed by TAG's refinement (``tag.polish``) within
   ``pipeline_evaluations`` simulations (``learned.pipelined``); it is the plan where it
   beats the one-batch strategy with its order.
5. **Never worse than data parallelism.** The four DP baselines (``dp-even``,
   ``dp-prop``, ``ps-even``, ``ps-prop``, with their gradient buckets) are planned
   too; where the fastest of them that fits beats the refined strategy, it is the
   plan, with a note saying so.

Why rule-based priorities refined by search rather than a policy output: the order
only matters once the placement is fixed, which the refinement changes; priorities on
the final placement are cheap to search (an order already simulated is not simulated
again, and where no two groups compete, as on a chain, there is nothing to search).

``learn`` trains a policy over (graph, topology) pairs: each pair's strategy is first
refined from the better of the greedy start and the uniform strategies, and REINFORCE
with a baseline then trains the policy with self-imitation of the best strategy known
(``learned.reinforce``).

Limits: the plan has one group per op group; a micro-batched plan runs the op groups
as pipeline stages with GPipe or 1F1B (no order search); the order is searched after the
strategies (which the refinement scores with the simulator's ready-task order), and a
static order can only be kept where it is no slower than that; a replicated group
synchronises once after its backward (no buckets); candidates are those of
``learned.decoder``. The policy's
parameters do not depend on the cluster's size, so any cluster is accepted; one larger
than any it was trained on is planned with a note that its start is extrapolated
(refinement and the DP baselines still bound the result). Where the CPU time limit
stops refinement, the plan can depend on the machine's speed; the evaluation cap is
deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from dl_nfv.artifacts import BadInput, InfeasiblePlan, OpGraph, Optimizer, SyncMethod, Topology
from dl_nfv.artifacts.policy import Policy, TrainedOn
from dl_nfv.simulator.costs import CostModel

from .base import finish, optimizer_named, started
from .learned.coarsen import coarsen
from .learned.decoder import StrategyPolicy, candidates, greedy
from .learned.env import GroupStrategy, Outcome, StrategyEnv
from .learned.features import group_graph
from .learned.order import Ordering, refine_order
from .learned.pipelined import MICROBATCHES, Pipelined, pipelined
from .learned.policy import build_network, policy_of, read_policy
from .learned.refine import refine
from .learned.reinforce import Problem, reinforce
from .tag.batching import BatchedEnv

PLANNER = "heterog"
DEFAULT_POLICY = Path(__file__).parent / "learned" / "heterog.policy.json"
ARCHITECTURE = {"hidden": 64, "layers": 2, "heads": 4}
DEFAULT_GROUPS = 32
ORDER_EVALUATIONS = 200
PIPELINE_EVALUATIONS = 300
BASELINES = ("dp-even", "dp-prop", "ps-even", "ps-prop")
STARTS = ("policy", "greedy", "random")


def _start(problem, start: str, policy: str, seed: int, notes: list[str]):
    """The strategy refinement starts from and where it came from: the policy's (noting an
    extrapolation past the cluster sizes it was trained on), greedy or random, or a
    uniform strategy where that simulates faster (``better_start``)."""
    if start == "policy":
        source = read_policy(policy or DEFAULT_POLICY)
        first = greedy(load_policy(source), problem.env, problem.graph)
        seen = source.trained_on.max_devices
        if seen and len(problem.env.devices) > seen:
            notes.append(f"the policy was trained on clusters of at most {seen} devices, this one "
                         f"has {len(problem.env.devices)}: its start is extrapolated")
    elif start == "greedy":
        first = greedy_start(problem.env)
    else:
        first = random_start(problem.env, seed)
    return better_start(problem.env, first, start)


def plan(graph: OpGraph, topology: Topology, *, seed: int = 0, policy: str = "",
         search_s: float = 30.0, max_evaluations: int = 2000,
         order_evaluations: int = ORDER_EVALUATIONS, groups: int = DEFAULT_GROUPS,
         start: str = "policy", microbatches: int = MICROBATCHES,
         pipeline_evaluations: int = PIPELINE_EVALUATIONS, optimizer: str = "sgd"):
    """HeteroG: a strategy per op group (devices, batch shares, AllReduce or a parameter
    server) decoded by a trained policy, refined on the simulator, with each device's
    execution order from a priority per group, never slower than the best data-parallel
    baseline.

    Parameters
    ----------
    policy : str
        A policy file from `dl-nfv plan learn heterog` (default: the shipped policy).
    search_s : float
        Seconds of CPU time the refinement may take.
    max_evaluations : int
        Simulations the refinement may run (the deterministic budget).
    order_evaluations : int
        Simulations the search for each device's execution order may run.
    groups : int
        The most op groups the graph is coarsened into.
    start : str
        Where refinement starts: policy (the policy's strategy), greedy or random.
    microbatches : int
        The most microbatches the plan may run as a pipeline (powers of two dividing the
        batch; 1: one batch, as the published HeteroG).
    pipeline_evaluations : int
        Simulations the refinement of a micro-batched strategy may run.
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Complexity: one policy pass, up to ``max_evaluations + order_evaluations +
    pipeline_evaluations`` simulations plus one per (start, batching), four DP plans.
    """
    t0 = started()
    opt = optimizer_named(PLANNER, optimizer)
    if start not in STARTS:
        raise BadInput(f"{PLANNER}: start must be one of {', '.join(STARTS)}, got {start!r}")
    if microbatches < 1:
        raise BadInput(f"{PLANNER}: microbatches must be at least 1, got {microbatches}")
    problem = problem_of(graph, topology, groups=groups, optimizer=opt)
    notes: list[str] = []
    first, origin = _start(problem, start, policy, seed, notes)
    refined = refine(problem.env, first, max_evaluations=max_evaluations, time_limit_s=search_s)
    options = {"policy": policy, "search_s": search_s, "max_evaluations": max_evaluations,
               "order_evaluations": order_evaluations, "groups": groups, "start": start,
               "microbatches": microbatches, "pipeline_evaluations": pipeline_evaluations,
               "optimizer": optimizer}
    notes.append(f"refined from {origin}: {refined.start.iteration_ms:.2f} -> "
                 f"{refined.outcome.iteration_ms:.2f} ms in {refined.evaluations} simulations")
    ordering = refine_order(problem.env, refined.strategies, max_evaluations=order_evaluations,
                            time_limit_s=search_s)
    outcome = ordering.outcome if ordering.helps else ordering.unordered
    notes.append(order_note(ordering))
    piped = None
    if microbatches > 1:
        piped = pipelined(problem.env, refined.strategies, microbatches=microbatches,
                          max_evaluations=pipeline_evaluations, time_limit_s=search_s)
        notes.append(pipeline_note(piped, outcome))
        if piped.batching.microbatches == 1 or piped.outcome.reward <= outcome.reward:
            piped = None
        else:
            outcome = piped.outcome
    baseline = best_baseline(graph, topology, optimizer)
    if baseline is not None and (not outcome.feasible or
                                 baseline.prediction.iteration_ms < outcome.iteration_ms):
        notes.append(f"kept the best data-parallel baseline, {baseline.planner}")
        return replace(baseline, planner=PLANNER, options=options, seed=seed,
                       notes=(*baseline.notes, *notes),
                       wall_time_s=round(time.perf_counter() - t0, 4))
    if piped is not None:
        made = BatchedEnv(problem.env).plan_of(piped.strategies, piped.batching, planner=PLANNER)
        return finish(planner=PLANNER, graph=graph, topology=topology, groups=made.groups,
                      pipeline=made.pipeline, seed=seed, options=options, started_at=t0,
                      optimizer=opt, notes=notes, cost_model=problem.env.cm)
    chosen = problem.env.plan_of(refined.strategies, planner=PLANNER)
    return finish(planner=PLANNER, graph=graph, topology=topology, groups=chosen.groups, seed=seed,
                  options=options, started_at=t0, optimizer=opt, notes=notes,
                  order=ordering.order if ordering.helps else None, cost_model=problem.env.cm)


def pipeline_note(piped: Pipelined, unbatched: Outcome) -> str:
    """What the search over microbatches found, for the plan's notes."""
    if piped.batching.microbatches == 1 or piped.outcome.reward <= unbatched.reward:
        return (f"no micro-batched strategy beat one batch ({piped.evaluations} simulations; "
                f"best {piped.outcome.iteration_ms:.2f} ms with {piped.batching})")
    return (f"run as a pipeline of {piped.batching} from {piped.origin}: "
            f"{piped.outcome.iteration_ms:.2f} ms in {piped.evaluations} simulations, "
            f"{unbatched.iteration_ms:.2f} ms as one batch")


def order_note(ordering: Ordering) -> str:
    """What the order search found, for the plan's notes."""
    said = (f"execution order from group priorities ({ordering.start} start, "
            f"{ordering.swaps} swaps, {ordering.evaluations} simulations): "
            f"{ordering.outcome.iteration_ms:.2f} ms")
    if ordering.helps:
        return f"{said}, {ordering.unordered.iteration_ms:.2f} ms without an order"
    return (f"{said}; no order kept: the simulator's ready-task order gives "
            f"{ordering.unordered.iteration_ms:.2f} ms")


def better_start(env: StrategyEnv, first: Sequence[GroupStrategy], start: str
                  ) -> tuple[tuple[GroupStrategy, ...], str]:
    """The better of ``first`` and every uniform strategy (each group the same candidate:
    data parallelism over a device set, or the whole model on one device), by the
    simulator, with a word on which it is."""
    best, origin = tuple(first), f"the {start} start"
    score = env.evaluate(best).reward
    n = len(env.coarsening.groups)
    for c in candidates(env.cm.cluster):
        uniform = (c.strategy,) * n
        reward = env.evaluate(uniform).reward
        if reward > score:
            best, score, origin = uniform, reward, "a uniform strategy"
    return best, origin


def problem_of(graph: OpGraph, topology: Topology, *, groups: int = DEFAULT_GROUPS,
               optimizer: Optimizer = Optimizer.SGD) -> Problem:
    """The graph on the cluster, coarsened and featurised: an environment and its features."""
    cm = CostModel(graph, topology)
    coarsening = coarsen(cm, groups)
    env = StrategyEnv(graph, topology, coarsening, optimizer=optimizer, cost_model=cm)
    return Problem(env=env, graph=group_graph(cm, coarsening))


def load_policy(source: Policy) -> StrategyPolicy:
    """A ``StrategyPolicy`` holding ``source``'s weights (``BadInput`` naming what differs)."""
    return build_network(source, StrategyPolicy, ARCHITECTURE, planner=PLANNER)


def best_baseline(graph: OpGraph, topology: Topology, optimizer: str):
    """The fastest of the four DP baselines that fits, or None where none does."""
    from . import get

    plans = []
    for name in BASELINES:
        try:
            plans.append(get(name)(graph, topology, optimizer=optimizer))
        except InfeasiblePlan:
            continue
    return min(plans, key=lambda p: p.prediction.iteration_ms, default=None)


def greedy_start(env: StrategyEnv) -> tuple[GroupStrategy, ...]:
    """A list-scheduling heuristic: walking the groups in order, each takes the candidate
    whose replicas finish it earliest given the work already placed (each device's
    busy time so far plus its share of the group's forward and backward), plus the
    group's gradient synchronisation (the cost model's AllReduce or parameter-server
    exchange of its parameters); ties go to the earlier candidate. Memory and
    activation transfers are ignored (refinement scores both)."""
    cm = env.cm
    options = candidates(cm.cluster)
    busy = dict.fromkeys(env.devices, 0.0)
    chosen = []
    for g, ops in enumerate(env.coarsening.groups):
        params = float(sum(cm.param_bytes[cm.op_index[o]] for o in ops))
        best_ms, best = np.inf, None
        for c in options:
            group = env.group_of(g, c.strategy)
            work = {d: sum(cm.ops_ms(ops, d, share)) for d, share in zip(group.devices, group.shares)}
            if group.sync is SyncMethod.ALLREDUCE:
                sync_ms = cm.allreduce_ms(group.devices, params)
            elif group.sync is SyncMethod.PS:
                sync_ms = cm.ps_ms(group.devices, group.ps_servers, params)
            else:
                sync_ms = 0.0
            ms = max(busy[d] + w for d, w in work.items()) + sync_ms
            if ms < best_ms:
                best_ms, best = ms, (c.strategy, work)
        chosen.append(best[0])
        for d, w in best[1].items():
            busy[d] += w
    return tuple(chosen)


def random_start(env: StrategyEnv, seed: int) -> tuple[GroupStrategy, ...]:
    """Each group a candidate drawn uniformly (seeded)."""
    options = candidates(env.cm.cluster)
    rng = np.random.default_rng(seed)
    return tuple(options[int(i)].strategy
                 for i in rng.integers(len(options), size=len(env.coarsening.groups)))


def learn(pairs: Sequence[tuple[str, OpGraph]], topologies: Sequence[tuple[str, Topology]], *,
          episodes: int, seed: int = 0, groups: int = DEFAULT_GROUPS, search_s: float = 10.0,
          max_evaluations: int = 1500, imitation_weight: float = 1.0, command: str = "",
          progress=None) -> Policy:
    """Train a HeteroG policy over every (graph, topology) pair.

    Parameters
    ----------
    pairs, topologies
        ``(name, artifact)`` of each graph and each topology; every graph is trained on
        every topology.
    episodes
        Episodes in all (one per problem per step).
    seed
        Seeds the initial weights and the sampling.
    groups, search_s, max_evaluations
        The coarsening target, and each problem's refinement budget for the strategy
        it then imitates.
    command
        The command line recorded in the policy.
    progress
        Called with a line of text per stage (optional).

    Returns
    -------
    Policy
        The artifact: weights, what it was trained on, seed, command.
    """
    if not pairs or not topologies:
        raise BadInput("training needs at least one graph and one topology")
    problems, starts = [], []
    for gname, graph in pairs:
        for tname, topology in topologies:
            problem = problem_of(graph, topology, groups=groups)
            env = problem.env
            first, _ = better_start(env, greedy_start(env), "greedy")
            best = refine(env, first, max_evaluations=max_evaluations, time_limit_s=search_s)
            if progress is not None:
                progress(f"{gname} on {tname}: {len(env.coarsening.groups)} groups, refined "
                         f"{best.outcome.iteration_ms:.2f} ms")
            problems.append(problem)
            starts.append(best.strategies)
    torch.manual_seed(seed)
    network = StrategyPolicy(**ARCHITECTURE)
    reinforce(network, problems, episodes=episodes, seed=seed, starts=starts,
              imitation_weight=imitation_weight)
    trained_on = TrainedOn(graphs=tuple(n for n, _ in pairs), topologies=tuple(n for n, _ in topologies),
                           episodes=episodes,
                           max_devices=max(len(p.env.devices) for p in problems))
    return policy_of(network, planner=PLANNER, architecture=ARCHITECTURE, trained_on=trained_on,
                     seed=seed, command=command)
