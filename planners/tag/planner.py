"""TAG: a GNN over the joint model-and-topology graph guiding a Monte Carlo tree search.

After "TAG: topology-aware graph deployment" (TPDS 2023): the op graph and the device
topology are read together by one graph network, whose priors and values guide a search
for a per-group strategy; a lossless gradient compression (sufficient-factor
broadcasting, SFB) is then applied where an ILP finds it pays.

Method, ``plan``:

1. **Problem.** The op graph is coarsened into op groups (``learned.coarsen``); a
   strategy is a batching (``tag.batching``: 1 to ``microbatches`` microbatches, GPipe or
   1F1B) and, per group, one of ``learned.decoder.candidates`` (a device, or a replica
   set with even or speed-proportional batch shares and AllReduce or a parameter server).
2. **Incumbent and seeds.** HeteroG's greedy list-scheduling start, or the best uniform
   strategy where one simulates faster (``heterog.greedy_start``, ``heterog.better_start``),
   with one microbatch; and the plans of the ``others`` planners (by default
   ``pipeline``), each as a TAG strategy with the plan's own batch shares
   (``seeds.seed_of_plan``: a note says where it differs from the plan; a plan TAG cannot
   run, e.g. one leaving a replica fewer samples than microbatches, is only a fallback).
3. **Search.** PUCT Monte Carlo tree search (``tag.mcts``): the batching, then the groups,
   largest first; priors and leaf values from the joint-graph network (``tag.joint``; the
   shipped policy, ``DEFAULT_POLICY``, unless ``policy`` names another) or uniform priors
   (``priors: uniform``); every strategy the search finishes or rolls out is simulated
   exactly, and the best one met is kept.
4. **Refinement** (``tag.polish``). Hill climbing on the simulator: each stage cut at
   its best position between its neighbours, single-group moves over HeteroG's
   candidates and the seeds' strategies, and the batching with the placement repaired
   for its microbatch count, in turn; last, the result at every batching; within
   ``max_evaluations`` simulations and the CPU time the search left of ``time_limit``.
5. **Never slower than the fallbacks.** The four DP baselines and the ``others``
   planners' plans (which TAG's strategies only approximate: other stage boundaries,
   batch shares, gradient buckets, list-scheduled orders) are simulated; where the
   fastest that fits beats the refined strategy, it is the plan, with a note.
6. **SFB.** Unless ``sfb`` is off, ``planners.sfb.apply_sfb`` chooses which replicated
   groups all-gather sufficient factors instead of all-reducing their gradients.

Limits: those of the candidates (replica sets are single devices, the cluster, the
per-type and per-host subsets, and the seeds' sets), of the batchings (GPipe and 1F1B
over op-group boundaries) and of the environment (one synchronisation per group, no
per-device order); the search decides the batching and then each group once in one
fixed order; the CPU time limit can make the result depend on the machine's speed (the
playout and evaluation caps are deterministic).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from dl_nfv.artifacts import BadInput, InfeasiblePlan, OpGraph, Plan, Topology
from dl_nfv.artifacts.policy import Policy

from ..base import finish, optimizer_named, started
from ..heterog import best_baseline, better_start, greedy_start, problem_of
from ..learned.policy import build_network, read_policy
from .batching import BatchedEnv, Batching, batchings
from .joint import JointNet
from .mcts import search
from .polish import polish
from .seeds import Rejected, seed_of_plan

PLANNER = "tag"
DEFAULT_POLICY = Path(__file__).parent / "tag.policy.json"
ARCHITECTURE = {"hidden": 48, "layers": 2, "heads": 2}
DEFAULT_GROUPS = 16
PRIORS = ("gnn", "uniform")


def plan(graph: OpGraph, topology: Topology, *, seed: int = 0, playouts: int = 400,
         policy: str = "", priors: str = "gnn", time_limit: float = 60.0,
         max_evaluations: int = 1000, groups: int = DEFAULT_GROUPS, microbatches: int = 32,
         others: str = "pipeline", sfb: bool = True, optimizer: str = "sgd") -> Plan:
    """TAG: a microbatch count and schedule and a strategy per op group, found by a Monte
    Carlo tree search guided by a GNN over the joint op-group and device graph, refined
    on the simulator, never slower than the best data-parallel baseline nor than the
    planners in ``others``, with SFB where it pays.

    Parameters
    ----------
    playouts : int
        Tree-search playouts in all (>= 1; spread over the decisions).
    policy : str
        A policy file from `dl-nfv plan learn tag` (default: the shipped policy).
    priors : str
        gnn (the policy's priors and values) or uniform (no network: rollouts only).
    time_limit : float
        Seconds of CPU time the search and the refinement may take together.
    max_evaluations : int
        Simulations the refinement may run after the search.
    groups : int
        The most op groups the graph is coarsened into.
    microbatches : int
        The most microbatches a strategy may run (powers of two dividing the batch; 1: none).
    others : str
        Comma-separated planners (e.g. pipeline,heterog; empty: none) whose plans seed the
        search and are kept where faster.
    sfb : bool
        Apply sufficient-factor broadcasting where the SFB ILP finds it pays.
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Complexity: the ``others`` planners, ``playouts`` network passes and simulations,
    ``max_evaluations`` simulations, four DP plans and, with ``sfb``, one ILP.
    """
    t0 = time.perf_counter()
    _check(playouts, priors, microbatches, others)
    plans, notes = _others(graph, topology, others, optimizer, seed)
    made = with_plans(graph, topology, plans, notes=notes, seed=seed, playouts=playouts,
                      policy=policy, priors=priors, time_limit=time_limit,
                      max_evaluations=max_evaluations, groups=groups, microbatches=microbatches,
                      others=others, sfb=sfb, optimizer=optimizer)
    return replace(made, wall_time_s=round(time.perf_counter() - t0, 4))  # the others' included


def with_plans(graph: OpGraph, topology: Topology, plans: Sequence[Plan], *,
               baselines: Sequence[Plan] | None = None, notes: Sequence[str] = (),
               seed: int = 0, playouts: int = 400, policy: str = "", priors: str = "gnn",
               time_limit: float = 60.0, max_evaluations: int = 1000,
               groups: int = DEFAULT_GROUPS, microbatches: int = 32, others: str = "",
               sfb: bool = True, optimizer: str = "sgd") -> Plan:
    """``plan`` with the other planners' plans given (``plans``: seeds and fallbacks,
    each made once by the caller) and, where ``baselines`` is given, the DP baselines'
    plans that fit (else planned here); ``others`` is only recorded in the options. Its
    wall time excludes making the given plans."""
    t0 = started()
    opt = optimizer_named(PLANNER, optimizer)
    _check(playouts, priors, microbatches, "")
    problem = problem_of(graph, topology, groups=groups, optimizer=opt)
    env = problem.env
    notes = list(notes)
    net = _network(policy, len(env.devices), notes) if priors == "gnn" else None
    start, origin = better_start(env, greedy_start(env), "greedy")
    baseline = (best_baseline(graph, topology, optimizer) if baselines is None else
                min(baselines, key=lambda p: p.prediction.iteration_ms, default=None))
    ref_ms = (baseline.prediction.iteration_ms if baseline is not None
              else -env.evaluate(start).reward)
    seeds = _seeds(plans, env, notes)
    choices = [b for b in batchings(graph.model.batch_size) if b.microbatches <= microbatches]
    cpu0 = time.process_time()
    found = search(env, problem.graph, start, ref_ms=ref_ms, net=net, playouts=playouts,
                   time_limit_s=time_limit, seed=seed, choices=choices, seeds=seeds)
    left = max(0.0, time_limit - (time.process_time() - cpu0))
    polished = polish(BatchedEnv(env), found.strategies, found.batching, choices,
                      max_evaluations=max_evaluations, time_limit_s=left,
                      extra=[s for _, strategies in seeds for s in strategies])
    notes.append(f"search from {origin} or the seeds ({found.start.iteration_ms:.2f} ms): "
                 f"{found.playouts} playouts, {found.evaluations} simulations -> "
                 f"{found.outcome.iteration_ms:.2f} ms with {found.batching}"
                 + ("; stopped by the time limit" if found.stopped_by_time else ""))
    notes.append(f"refined -> {polished.outcome.iteration_ms:.2f} ms with {polished.batching} "
                 f"in {polished.evaluations} simulations")
    options = {"playouts": playouts, "policy": policy, "priors": priors, "time_limit": time_limit,
               "max_evaluations": max_evaluations, "groups": groups,
               "microbatches": microbatches, "others": others, "sfb": sfb, "optimizer": optimizer}
    fallbacks = [p for p in (baseline, *plans) if p is not None]
    beaten = min(fallbacks, key=lambda p: p.prediction.iteration_ms, default=None)
    if beaten is not None and (not polished.outcome.feasible or
                               beaten.prediction.iteration_ms < polished.outcome.iteration_ms):
        notes.append(f"kept the {beaten.planner} plan, faster than the search's")
        chosen = replace(beaten, planner=PLANNER, options=options, seed=seed,
                         notes=(*beaten.notes, *notes))
    else:
        made = BatchedEnv(env).plan_of(polished.strategies, polished.batching, planner=PLANNER)
        chosen = finish(planner=PLANNER, graph=graph, topology=topology, groups=made.groups,
                        pipeline=made.pipeline, seed=seed, options=options, started_at=t0,
                        optimizer=opt, notes=notes, cost_model=env.cm)
    if sfb:
        chosen = with_sfb(chosen, graph, topology, time_limit_s=max(1.0, left))
    return replace(chosen, wall_time_s=round(time.perf_counter() - t0, 4))


def _network(policy: str, devices: int, notes: list[str]) -> JointNet:
    """The policy's network (the shipped one for ""), with a note where the cluster is
    larger than any it was trained on."""
    source = read_policy(policy or DEFAULT_POLICY)
    seen = source.trained_on.max_devices
    if seen and devices > seen:
        notes.append(f"the policy was trained on clusters of at most {seen} devices, this one "
                     f"has {devices}: its priors are extrapolated")
    return load_net(source)


def _check(playouts: int, priors: str, microbatches: int, others: str) -> None:
    """``BadInput`` naming the first option out of range."""
    from .. import PLANNERS

    if playouts < 1:
        raise BadInput(f"{PLANNER}: playouts must be at least 1, got {playouts}")
    if priors not in PRIORS:
        raise BadInput(f"{PLANNER}: priors must be one of {', '.join(PRIORS)}, got {priors!r}")
    if microbatches < 1:
        raise BadInput(f"{PLANNER}: microbatches must be at least 1, got {microbatches}")
    for name in filter(None, others.split(",")):
        if name not in PLANNERS or name == PLANNER:
            raise BadInput(f"{PLANNER}: others names {name!r}, which is not another planner")


def _others(graph: OpGraph, topology: Topology, others: str, optimizer: str,
            seed: int) -> tuple[list[Plan], list[str]]:
    """The plans of the ``others`` planners that fit, and a note for each with none."""
    from .. import get

    plans, notes = [], []
    for name in filter(None, others.split(",")):
        try:
            plans.append(get(name)(graph, topology, seed=seed, optimizer=optimizer))
        except (InfeasiblePlan, BadInput) as exc:
            notes.append(f"no {name} plan to seed from: {exc}")
    return plans, notes


def _seeds(plans: Sequence[Plan], env, notes: list[str]) -> list[tuple[Batching, tuple]]:
    """Each plan as a TAG strategy (``seeds.seed_of_plan``), with a note saying how exact
    it is; a plan it rejects is a fallback only, with a note naming why."""
    out = []
    for made in plans:
        try:
            got = seed_of_plan(made, env)
        except Rejected as exc:
            notes.append(f"not a seed: {exc}")
            continue
        out.append((got.batching, got.strategies))
        notes.append(f"seed from {made.planner} ({got.ms:.2f} ms with {got.batching}): "
                     + ("exact" if got.exact else "; ".join(got.differences)))
    return out


def with_sfb(chosen: Plan, graph: OpGraph, topology: Topology, *, time_limit_s: float) -> Plan:
    """``chosen`` with SFB applied by ``planners.sfb.apply_sfb`` where that is available;
    otherwise ``chosen`` with a note that SFB was not applied."""
    try:
        from ..sfb import apply_sfb
    except ImportError:
        return replace(chosen, notes=(*chosen.notes, "SFB not applied: this dl-nfv has no SFB "
                                                     "planner (planners/sfb.py)"))
    compressed, _report = apply_sfb(chosen, graph, topology, time_limit_s=time_limit_s)
    return compressed


def load_net(source: Policy) -> JointNet:
    """A ``JointNet`` holding ``source``'s weights (``BadInput`` naming what differs)."""
    return build_network(source, JointNet, ARCHITECTURE, planner=PLANNER)


def new_net(seed: int) -> JointNet:
    """A freshly initialised ``JointNet`` of the shipped architecture (seeded)."""
    torch.manual_seed(seed)
    return JointNet(**ARCHITECTURE)
