"""``dl-nfv plan pipeline``: the synchronous pipeline planner.

Decides the number of stages, the partition of the op graph into stages
(contiguous ranges of a topological order, so no two stages feed each other),
the device mapping (each stage on a run of a topology-aware device ordering,
replicated with integer batch shares balanced to the devices' speeds), the
microbatch count and every device's microbatch schedule (GPipe, 1F1B or the
list scheduler), minimising the simulated iteration time with the flush,
including transfers on their real routes, gradient synchronisation of
replicated stages and every device's memory. See docs/planners/pipeline.md.

The final choice is made on the shared simulator: the best layouts of the
search, the one-stage data-parallel plan, and the plans the ``dp``,
``gpipe``, ``1f1b`` and ``pipedream`` baselines would make (all in this
planner's search space) are simulated, and the fastest plan that fits in
memory wins. The plan's notes say which candidate won.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from dl_nfv.artifacts import (
    BadInput,
    Collective,
    Fusion,
    Group,
    InfeasiblePlan,
    OpGraph,
    Pipeline,
    Plan,
    PlanStatus,
    SyncMethod,
    TieSync,
    Topology,
)
from dl_nfv.planners.base import GIB, finish, gradient_buckets, optimizer_named, started
from dl_nfv.planners.bounds import Bound, critical_path_ms, stage_balanced_bound_ms, work_bound_ms
from dl_nfv.planners.runnable import require_rows

from .build import (
    BUCKET_BYTES,
    Replicas,
    first_stage_cap,
    groups_and_pipeline,
    stage_buckets,
)
from .partition import Layout
from .problem import Problem
from .scheduler import Policy, schedule_options
from .search import (
    CLIMB_SHARE,
    Evaluated,
    Outcome,
    device_swaps,
    evaluate,
    fastest_first,
    search,
)
from .symmetry import nested_hosts, sub_topology

SIMULATED_CANDIDATES = 6
POLISH_ROUNDS = 4  # rounds of device swaps of the winner, judged by the simulator
POLISH_SIMULATED = 6  # per round: the swaps the scheduler times fastest, each simulated
# work of the swaps' schedulings (stages x microbatches each, as the search's climbs): on
# 16 devices and 8 stages of 32 microbatches, 120 swaps take 30720: the winner stays
POLISH_BUDGET = 16384
POLISH_SHARE = 0.85  # of the time limit, after which no round of swaps starts
# CPU s (``plan``'s default): the limit cuts the search only on the largest cases (16
# heterogeneous devices at large batches, nested clusters of 64 GPUs and more), where a
# shorter limit keeps a sub-cluster's or an earlier layout's plan, slower by up to half
DEFAULT_TIME_LIMIT = 30.0
SCHEDULES_SIMULATED = 4  # per candidate layout, its best schedules by the scheduler's estimate
SEED_MICROBATCH_COUNTS = 2  # the baselines' layouts are also tried at the search's best counts
# a graph the problem coarsened has hundreds of ops, and a simulation costs in proportion:
# fewer candidates, schedules per candidate and swaps per polish round are simulated
COARSENED_EFFORT = {"candidates": 3, "schedules": 2, "polish": 2}
SCHEDULES = {"auto": tuple(Policy), "gpipe": (Policy.GPIPE,), "1f1b": (Policy.ONE_F_ONE_B,),
             "custom": (Policy.LIST,)}


@dataclass(slots=True)
class _Draft:
    """A candidate plan before stamping: its parts, where it came from, its simulation."""

    origin: str
    groups: list[Group]
    pipeline: Pipeline | None
    fusion: Fusion | None
    estimate_ms: float | None = None
    iteration_ms: float = float("inf")
    feasible: bool = False
    overflow: str = ""
    source: Evaluated | None = None  # the search's layout it was made from
    cap: float | None = None  # its first stage's gradient bucket cap (None: not bucketed)
    anytime: bool = False  # made whatever the time limit (``_kept``)


def plan(graph: OpGraph, topology: Topology, *, seed: int = 0, microbatches: int = 0,
         max_stages: int = 0, max_replicas: int = 0, schedule: str = "auto",
         time_limit: float = DEFAULT_TIME_LIMIT, optimizer: str = "sgd") -> Plan:
    """Synchronous pipeline planning: partition, device mapping, microbatches, schedule.

    Parameters
    ----------
    microbatches : int
        Microbatches per iteration (0: search the divisors of the batch).
    max_stages : int
        Most pipeline stages (0: up to one per device).
    max_replicas : int
        Most devices per stage (0: any; 1: no replicated stage, as ``plan exact``).
    schedule : str
        auto (the fastest of gpipe, 1f1b and the list scheduler), gpipe, 1f1b or custom
        (the list scheduler only).
    time_limit : float
        CPU seconds for the plan, bound included (a larger limit never gives a slower
        plan): a uniform cluster's nested sub-clusters are planned first, then the bound,
        refined until the plan has used a quarter of the limit (then the least value it
        has reached, still a bound); on every cluster of that chain the ordering search
        stops early once the whole plan has used half the limit, the boundary climbs at
        70% and the device swaps of the winner at 85% (all normally end sooner where the
        graph and cluster are small), and a cluster of the chain that would start its own
        search past 70% keeps its sub-cluster's plan; the first cluster's plan, the first
        orderings, the final scheduling and the simulations are never cut, so a limit of
        a few seconds can be exceeded.
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Returns a ``Plan`` with ``bound_ms`` (work, critical path and the stage-balanced
    bound, see ``pipeline_bound``). Raises ``BadInput`` for a bad option (a microbatch count
    that does not divide the batch, more stages than ops) and ``InfeasiblePlan`` when
    no plan fits in memory, naming the shortfall, or when a microbatch holds fewer rows
    than a batch norm of the graph needs in training (``runnable.min_slice_rows``).

    Complexity: O(orderings x microbatch counts x n^2 D^2) for the DP (n ops, D
    devices), O(layouts x stages^2 x microbatches) for scheduling, plus ~10 simulations.
    """
    return _plan(graph, topology, seed=seed, microbatches=microbatches, max_stages=max_stages,
                 max_replicas=max_replicas, schedule=schedule, time_limit=time_limit,
                 optimizer=optimizer, with_bound=True)


def _plan(graph: OpGraph, topology: Topology, *, seed: int, microbatches: int, max_stages: int,
          max_replicas: int, schedule: str, time_limit: float, optimizer: str,
          with_bound: bool, started_cpu: float | None = None,
          shared: dict | None = None) -> Plan:
    """``plan``; a sub-cluster's plan (``with_bound`` False) skips the bound and counts its
    time limit from the CPU time the whole plan started at (``started_cpu``). ``shared``:
    what a uniform cluster's chain of nested sub-clusters computes once and shares: the
    cost model's AllReduce terms per class (``terms``) and the search's AllReduce
    coefficients per class (``collectives``)."""
    t0 = started()
    problem = Problem(graph, topology, tie_sync=TieSync.EXCHANGE,
                      optimizer=optimizer_named("pipeline", optimizer))
    shared = shared if shared is not None else {"terms": problem.cm.class_terms,
                                                "collectives": {}}
    if problem.labels is not None:
        # the nested clusters' AllReduce costs per class of device sets are the same
        # (``symmetry``: a group of a sub-cluster has the routes it has in the whole)
        problem.cm.class_terms = shared["terms"]
    _check_options(problem, microbatches, max_stages, max_replicas, schedule, time_limit)
    _check_memory_floor(problem)
    m = microbatches or 1
    require_rows(graph, problem.batch_size // m, "pipeline",
                 f"{m} microbatch(es) of the batch of {problem.batch_size}")
    policies = SCHEDULES[schedule]
    options = {"microbatches": microbatches, "max_stages": max_stages,
               "max_replicas": max_replicas, "schedule": schedule,
               "time_limit": time_limit, "optimizer": optimizer}
    # the sub-cluster and the bound first; the search's cut-offs count the plan's CPU time
    # from here, so that the steps never cut have the rest of the limit whatever they took
    cpu0 = time.process_time() if started_cpu is None else started_cpu
    incumbent = _sub_cluster_draft(graph, topology, seed, options, cpu0, shared)
    bound = pipeline_bound(problem, cpu_s=max(cpu0 + time_limit * BOUND_SHARE
                                              - time.process_time(), 0.0)) \
        if with_bound else Bound(0.0, {})
    if incumbent is not None and time.process_time() > cpu0 + time_limit * CLIMB_SHARE:
        # out of time with a plan in hand (where the climbs would stop): this cluster's own
        # search and seeds are cut
        return _finish(problem, options, seed, t0, bound, [incumbent], policies, 0,
                       Outcome(candidates=[], timed_out=True), 0.0)
    outcome = search(problem, microbatches=microbatches, max_stages=max_stages,
                     max_replicas=max_replicas, policies=policies, seed=seed,
                     time_limit=time_limit, started=cpu0,
                     collectives=shared["collectives"] if problem.labels is not None else None)
    coarse, problem = problem, outcome.problem or problem  # finer units around the best cuts
    effort = COARSENED_EFFORT if coarse.coarsened else {
        "candidates": SIMULATED_CANDIDATES, "schedules": SCHEDULES_SIMULATED,
        "polish": POLISH_SIMULATED}
    drafts = _search_drafts(problem, outcome, policies, effort)
    # the baselines' layouts also at the microbatch counts the search liked best
    sure = _liked(outcome.base or outcome.candidates)
    more = [*sure, *(m for m in _liked(outcome.candidates) if m not in sure)]
    drafts.extend(_seed_drafts(graph, topology, coarse, microbatches, max_stages, schedule,
                               more, sure))
    drafts.extend([incumbent] if incumbent is not None else [])
    if max_replicas:
        drafts = [d for d in drafts if all(len(g.devices) <= max_replicas for g in d.groups)]
    return _finish(problem, options, seed, t0, bound, drafts, policies, effort["polish"],
                   outcome, cpu0 + time_limit * POLISH_SHARE)


def _finish(problem: Problem, options: dict, seed: int, t0, bound: Bound,
            drafts: list[_Draft], policies, polish: int, outcome: Outcome,
            deadline: float) -> Plan:
    """Simulate the drafts, keep the fastest that fits (polished until the CPU time
    ``deadline``) and stamp the plan."""
    for d in drafts:
        _simulate(problem, d)
    fitting = [d for d in drafts if d.feasible]
    if not fitting:
        worst = next((d.overflow for d in drafts if d.overflow), "no candidate layout fits")
        raise InfeasiblePlan(f"pipeline: no plan fits in memory; the closest candidate: {worst}")
    best, swaps = _kept(problem, fitting, policies, polish, deadline)
    notes = _notes(best, outcome, drafts, swaps, bound)
    status = PlanStatus.TIME_LIMIT if outcome.timed_out else PlanStatus.HEURISTIC
    return finish(planner="pipeline", graph=problem.graph, topology=problem.topology,
                  groups=best.groups, seed=seed, options=options, started_at=t0, bound=bound,
                  status=status, pipeline=best.pipeline, fusion=best.fusion,
                  optimizer=problem.optimizer, cost_model=problem.cm, notes=notes,
                  tie_sync=problem.tie_sync)


def _fastest(drafts: Sequence[_Draft]) -> _Draft:
    return min(drafts, key=lambda d: (round(d.iteration_ms, 9), _stage_count(d), d.origin))


def _kept(problem: Problem, fitting: Sequence[_Draft], policies, simulated: int,
          deadline: float) -> tuple[_Draft, int]:
    """The fastest of ``fitting`` polished, and the fastest of the drafts any time limit
    makes (``anytime``) polished, whichever is faster: a plan given more time keeps every
    draft a shorter limit makes, so it is never slower."""
    best, swaps = _polish(problem, _fastest(fitting), policies, simulated, deadline)
    sure = [d for d in fitting if d.anytime]
    if sure and _fastest(sure) is not _fastest(fitting):
        other, more = _polish(problem, _fastest(sure), policies, simulated, deadline)
        if _fastest([best, other]) is other:
            return other, more
    return best, swaps


def _liked(candidates: Sequence[Evaluated]) -> list[int]:
    return list(dict.fromkeys(ev.layout.microbatches for ev in candidates
                              if ev.layout.microbatches > 1))[:SEED_MICROBATCH_COUNTS]


def _search_drafts(problem: Problem, outcome, policies, effort: dict) -> list[_Draft]:
    """Drafts of the search's best candidates, and of the best it had before the steps a
    time limit may cut (``Outcome.base``), those marked ``anytime``."""
    top = outcome.candidates[:effort["candidates"]]
    seen = {ev.layout.key for ev in top}
    base = [ev for ev in (outcome.base or outcome.candidates)[:effort["candidates"]]]
    out = []
    for ev in [*top, *(ev for ev in base if ev.layout.key not in seen)]:
        for d in _drafts_of(problem, ev, policies)[:2 * effort["schedules"]]:
            d.anytime = any(ev is b or ev.layout.key == b.layout.key for b in base)
            out.append(d)
    return out


def _sub_cluster_draft(graph: OpGraph, topology: Topology, seed: int, options: dict,
                       started_cpu: float, shared: dict) -> _Draft | None:
    """The plan of the first half of a uniform cluster's leaves (``symmetry.nested_hosts``,
    planned the same way, so recursively down to one host; its cut-offs counted from
    ``started_cpu``, the whole plan's start), as a draft on the whole cluster:
    every route between its devices stays inside it, so it simulates as it did there.
    None when the cluster has no such part or nothing fits on it."""
    hosts = nested_hosts(topology)
    if not hosts:
        return None
    try:
        sub = _plan(graph, sub_topology(topology, hosts), seed=seed, with_bound=False,
                    started_cpu=started_cpu, shared=shared, **options)
    except InfeasiblePlan:
        return None
    return _Draft(f"sub-cluster of the first {hosts} host(s) ({sub.notes[0]})", list(sub.groups),
                  sub.pipeline, sub.fusion, anytime=True)


def _notes(best: _Draft, outcome, drafts: Sequence[_Draft], swaps: int, bound: Bound) -> list[str]:
    """The plan's notes: the winner and where it came from, the search's work, the bound."""
    own = min((d.iteration_ms for d in drafts if d.origin.startswith("search")),
              default=float("inf"))
    return [f"chosen: {best.origin}; {_stage_count(best)} stage(s) on "
            f"{[len(g.devices) for g in best.groups]} device(s), "
            f"{best.pipeline.microbatches if best.pipeline else 1} microbatch(es)"
            + (f", {best.pipeline.schedule_kind.value} schedule" if best.pipeline else ""),
            f"searched {outcome.orderings_tried} device orderings, screened "
            f"{outcome.layouts_timed} layouts, simulated {len(drafts)} candidates (best own "
            f"layout {own:.3f} ms)"
            + (f"; {swaps} device swap(s) of it on the simulator" if swaps else ""),
            "bound parts (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in bound.parts.items())]


def pipeline_bound(problem: Problem, cpu_s: float | None = None) -> Bound:
    """Lower bound for every plan of the pipeline family on ``problem`` (docs/planners/pipeline.md).

    The work bound, the critical path at the smallest batch fraction a replica
    can hold (one sample), and the stage-balanced bound, refined for at most ``cpu_s``
    CPU seconds (default: ``BOUND_SHARE`` of the default time limit; then the least value
    its counts have reached, a bound still, looser). (An op's full-batch
    time is no bound here: replicated stages split every op by the batch.) The
    family's plans may sum a tied embedding by exchange or by AllReduce, so every
    planner of the family (this one, gpipe, 1f1b, pipedream) reports the same bound
    and their ratios to it compare like with like; it is computed once per graph,
    topology and optimizer in a process (``plan compare`` runs them all), and again only
    for a caller with more time than a cut one had.
    """
    cpu_s = BOUND_SHARE * DEFAULT_TIME_LIMIT if cpu_s is None else cpu_s
    if not problem.default_cost_model:
        return _pipeline_bound(problem, cpu_s)
    key = (*problem.fingerprints, problem.optimizer,
           tuple(int(b) for b in problem.bounds))
    kept = _BOUNDS.get(key)
    if kept is None or (kept[1] < cpu_s and kept[2]):
        if len(_BOUNDS) >= BOUNDS_KEPT and key not in _BOUNDS:
            _BOUNDS.pop(next(iter(_BOUNDS)))
        cpu = time.process_time()
        bound = _pipeline_bound(problem, cpu_s)
        _BOUNDS[key] = kept = (bound, cpu_s, time.process_time() - cpu > cpu_s)
    return Bound(kept[0].ms, dict(kept[0].parts))


BOUND_SHARE = 0.25  # of the plan's time limit, the most the stage-balanced bound refines for
BOUNDS_KEPT = 8
# pipeline_bound's, oldest first: (bound, CPU s it was given, whether that cut it)
_BOUNDS: dict[tuple, tuple[Bound, float, bool]] = {}


def _pipeline_bound(problem: Problem, cpu_s: float = float("inf")) -> Bound:
    deadline = time.process_time() + cpu_s
    cm, devices = problem.cm, list(problem.devices)
    parts = {"work": work_bound_ms(cm, devices),
             "critical_path": critical_path_ms(cm, devices, 1.0 / problem.batch_size,
                                               split_backwards=True)}
    balanced = stage_balanced_bound_ms(problem, tie_sync=TieSync.EXCHANGE, deadline=deadline)
    if balanced != float("inf"):
        parts["stage_balanced"] = balanced
    return Bound(max(parts.values()), parts)


# --------------------------------------------------------------------------- checks
def _check_options(problem: Problem, microbatches: int, max_stages: int, max_replicas: int,
                   schedule: str, time_limit: float) -> None:
    name = problem.graph.model.name
    if schedule not in SCHEDULES:
        raise BadInput(f"pipeline: schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if microbatches < 0:
        raise BadInput(f"pipeline: microbatches must be >= 0, got {microbatches}")
    if microbatches and problem.batch_size % microbatches:
        raise BadInput(f"pipeline: {microbatches} microbatches do not divide the batch of "
                       f"{problem.batch_size} samples of {name!r} (a microbatch must hold a "
                       f"whole number of samples)")
    ops = len(problem.order)
    if max_stages < 0:
        raise BadInput(f"pipeline: max_stages must be >= 0, got {max_stages}")
    if max_stages > ops:
        raise BadInput(f"pipeline: max_stages {max_stages} exceeds the {ops} ops of {name!r}; "
                       f"a stage needs at least one op")
    if max_stages > problem.n:
        raise BadInput(f"pipeline: max_stages {max_stages} exceeds the {problem.n} units the "
                       f"graph of {name!r} is planned in")
    if max_replicas < 0:
        raise BadInput(f"pipeline: max_replicas must be >= 0, got {max_replicas}")
    if time_limit <= 0:
        raise BadInput(f"pipeline: time_limit must be > 0 seconds, got {time_limit}")


def _check_memory_floor(problem: Problem) -> None:
    """InfeasiblePlan when the model cannot fit even split as finely as possible."""
    cm = problem.cm
    largest_mem = float(problem.memory_bytes.max())
    per_op = cm.param_bytes * (2.0 + problem.state_factor)
    worst = int(per_op.argmax())
    if per_op[worst] > largest_mem:
        raise InfeasiblePlan(
            f"pipeline: op {cm.op_ids[worst]!r} alone needs {per_op[worst] / GIB:.2f} GiB (parameters, "
            f"gradients, optimizer state) but the largest device has {largest_mem / GIB:.2f} GiB "
            f"(short by {(per_op[worst] - largest_mem) / GIB:.2f} GiB)")
    total = problem.static_bytes(0, problem.n)
    capacity = float(problem.memory_bytes.sum())
    if total > capacity:
        raise InfeasiblePlan(
            f"pipeline: {problem.graph.model.name!r} needs {total / GIB:.2f} GiB of parameters, "
            f"gradients and optimizer state but the {len(problem.devices)} devices of "
            f"{cm.cluster.topology.name!r} have {capacity / GIB:.2f} GiB together (short by "
            f"{(total - capacity) / GIB:.2f} GiB)")


# --------------------------------------------------------------------------- drafts
def _drafts_of(problem: Problem, ev: Evaluated, policies,
               caps: Sequence[float | None] = (None, BUCKET_BYTES)) -> list[_Draft]:
    """A draft of ``ev`` for each distinct schedule the scheduler offers for its layout: the
    scheduler ranks them by its own estimate, the simulator decides. Each schedule is
    drafted with the first stage's gradient buckets of each distinct cap of ``caps``
    (None: the cap the scheduler charged, ``first_stage_cap``): the scheduler counts no
    link that a bucket's AllReduce takes from the transfers, so DDP's 25 MiB buckets are
    drafted too. A cap other than 25 MiB is named in the draft's origin."""
    layout, reps = ev.layout, ev.reps
    if len(layout.stages) == 1 and layout.microbatches == 1:
        return [_data_parallel_draft(problem, layout, reps[0], "search (one stage: data parallel)",
                                     ev.makespan_ms)]
    chosen = first_stage_cap(problem, layout, reps)
    own = list(dict.fromkeys(chosen if cap is None else cap for cap in caps)) if chosen else [None]
    fusions = {cap: stage_buckets(problem, layout, reps, cap) for cap in own}
    out = []
    for timed in schedule_options(ev.costs, policies, wide=True)[:SCHEDULES_SIMULATED]:
        groups, pipeline = groups_and_pipeline(problem, layout, reps, timed.schedule)
        for cap, fusion in fusions.items():
            label = f", {cap / 2**20:g} MiB buckets" if cap not in (None, BUCKET_BYTES) else ""
            out.append(_Draft(f"search ({timed.label}{label})", groups, pipeline, fusion,
                              timed.makespan_ms, source=ev, cap=cap))
    return out


def _polish(problem: Problem, draft: _Draft, policies, simulated: int = POLISH_SIMULATED,
            deadline: float = float("inf")) -> tuple[_Draft, int]:
    """Swap devices of the winning layout where the simulator says it pays: per round,
    every swap (``device_swaps``) is scheduled, the ``simulated`` the scheduler
    times fastest are simulated (their two best schedules), and the fastest is kept if it
    beats the winner. The scheduler and the simulator differ most where links are shared
    (a ring, an AllReduce crossing other stages' links), which is where a swap helps.
    The work is bounded by ``POLISH_BUDGET``, and no round starts once
    ``time.process_time()`` has passed ``deadline``. Returns the draft kept and the number
    of swaps made."""
    swaps = 0
    budget = POLISH_BUDGET
    while draft.source is not None and swaps < POLISH_ROUNDS:
        layout = draft.source.layout
        moves = device_swaps(problem, layout)
        budget -= len(moves) * len(layout.stages) * layout.microbatches
        if not moves or budget < 0 or time.process_time() > deadline:
            break
        timed = sorted((x for lay in moves
                        if (x := evaluate(problem, lay, full=True, policies=policies))),
                       key=fastest_first)
        better = draft
        for ev in timed[:simulated]:
            for d in _drafts_of(problem, ev, policies, caps=(draft.cap,))[:2]:
                _simulate(problem, d)
                if d.feasible and d.iteration_ms < better.iteration_ms - 1e-9:
                    better = d
        if better is draft:
            break
        draft, swaps = better, swaps + 1
    return draft, swaps


def _data_parallel_draft(problem: Problem, layout: Layout, reps: Replicas, origin: str,
                         estimate: float | None) -> _Draft:
    """One stage, one microbatch: plain data parallelism with DDP-style gradient buckets."""
    ops = problem.stage_ops(0, problem.n)
    multi = len(reps.devices) > 1
    group = Group(id="stage0", ops=ops, devices=reps.devices,
                  batch_shares=reps.shares() if multi else (),
                  sync=SyncMethod.ALLREDUCE if multi else SyncMethod.NONE,
                  collective=Collective.AUTO)
    fusion = Fusion(gradient_buckets=gradient_buckets(problem.graph, ops, BUCKET_BYTES)) \
        if multi else None
    return _Draft(origin, [group], None, fusion, estimate)


def _seed_drafts(graph, topology, problem: Problem, microbatches: int, max_stages: int,
                 schedule: str, more_counts: Sequence[int] = (),
                 sure_counts: Sequence[int] = ()) -> list[_Draft]:
    """The plans of the dp, gpipe, 1f1b and pipedream baselines (each in this search space),
    each also at the microbatch counts ``more_counts`` when the user fixed none; all but
    those at a count of ``more_counts`` outside ``sure_counts`` are ``anytime``."""
    from dl_nfv.planners import dp
    from dl_nfv.planners.gpipe import baseline_draft, default_microbatches, even_layout
    from dl_nfv.planners.pipedream import auto_microbatches, pipedream_layout

    out: list[_Draft] = []
    if not microbatches or microbatches == 1:
        try:
            ddp = dp.plan(graph, topology, optimizer=problem.optimizer.value)
            out.append(_Draft("seed: dp baseline", list(ddp.groups), None, ddp.fusion,
                              anytime=True))
        except BadInput:
            pass
    count = min(len(problem.devices), problem.n)
    if max_stages:
        count = min(count, max_stages)

    def counts(own: int) -> list[int]:
        return [microbatches] if microbatches else list(dict.fromkeys((own, *more_counts)))

    def sure(m: int, own: int) -> bool:
        return bool(microbatches) or m == own or m in sure_counts

    for kind in ("gpipe", "1f1b"):
        if schedule not in ("auto", kind):
            continue
        own_m = default_microbatches(problem.batch_size, count, min_rows=problem.min_rows)
        for m in counts(own_m):
            try:
                layout = even_layout(problem, count, m, "time", kind)
                groups, pipeline = baseline_draft(problem, layout, kind)
                out.append(_Draft(f"seed: {kind} baseline" + _at(m, microbatches), groups,
                                  pipeline, None, anytime=sure(m, own_m)))
            except BadInput:
                pass
    if schedule in ("auto", "1f1b") and len(problem.devices) > 1:  # (PipeDream's DP needs two)
        try:
            first = pipedream_layout(problem, microbatches or 1)
            own = microbatches or auto_microbatches(problem, first)
        except BadInput:
            return out
        for m in counts(own):
            try:
                layout = first if m == first.microbatches else pipedream_layout(problem, m)
                if not max_stages or len(layout.stages) <= max_stages:
                    groups, pipeline = baseline_draft(problem, layout, "1f1b")
                    out.append(_Draft("seed: pipedream baseline" + _at(m, microbatches), groups,
                                      pipeline, None, anytime=sure(m, own)))
            except BadInput:
                pass
    return out


def _at(m: int, fixed: int) -> str:
    return "" if fixed else f" at {m} microbatches"


def _simulate(problem: Problem, draft: _Draft) -> None:
    from dl_nfv.planners.base import describe_overflow
    from dl_nfv.simulator import simulate

    graph, topology = problem.graph, problem.topology
    graph_sha256, topology_sha256 = problem.fingerprints
    plan = Plan(planner="pipeline", graph_sha256=graph_sha256,
                topology_sha256=topology_sha256, batch_size=graph.model.batch_size,
                optimizer=problem.optimizer, groups=tuple(draft.groups), pipeline=draft.pipeline,
                fusion=draft.fusion, tie_sync=problem.tie_sync)
    result = simulate(plan, graph, topology, cost_model=problem.cm, check_fingerprints=False)
    draft.iteration_ms = result.iteration_ms
    draft.feasible = result.feasible
    if not result.feasible:
        draft.overflow = describe_overflow(result, problem.cm)


def _stage_count(d: _Draft) -> int:
    return len(d.pipeline.stages) if d.pipeline else 1
