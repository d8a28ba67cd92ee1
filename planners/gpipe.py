"""GPipe and 1F1B baselines: an even split over the devices in topology order, fill-drain or 1F1B.

The model's ops, in topological order, are cut into ``stages`` contiguous
ranges balanced by forward+backward time on the first device's type (as
torchgpipe's ``balance_by_time`` profiles on one device) or by parameter
bytes (``balance_by_size``); the split minimising the largest range is found
exactly (linear partition by binary search over the cap). Stage ``s`` runs on
the ``s``-th device of the topology, one device per stage, no replication.
A cut never falls inside a colocation group: the split is over the ranges
between the cuts that keep every group whole. The schedule is fill-drain
(``gpipe``: every forward, then every backward) or one-forward-one-backward
with a flush (``1f1b``). The microbatch count defaults to the largest divisor
of the batch not above ``4 x stages`` (GPipe's advice of at least four
microbatches per stage, within the batch) that leaves every replica's slice the rows
the graph's batch norms need in training (``runnable.min_slice_rows``: two where a
batch norm has one value per channel and row); ``InfeasiblePlan`` names the batch norm
when no count (or the count given) does.

These baselines know nothing of heterogeneous devices or links; that is the
point of comparing against them.

Complexity: O(ops x log(total)) for the split plus one simulation.
"""

from __future__ import annotations

from dl_nfv.artifacts import BadInput, OpGraph, Topology

from .base import finish, optimizer_named, started
from .colocation import cut_positions
from .pipeline.build import Replicas, groups_and_pipeline
from .pipeline.partition import Layout, StageSpec
from .pipeline.planner import pipeline_bound
from .pipeline.problem import Problem
from .runnable import require_rows
from .schedules import gpipe as gpipe_schedule
from .schedules import one_f_one_b


def default_microbatches(batch_size: int, stages: int, max_replicas: int = 1,
                         min_rows: int = 1) -> int:
    """Largest divisor of the batch <= 4 x stages that leaves each of ``max_replicas`` even
    replicas ``min_rows`` samples (1 when none does)."""
    best = 1
    for m in range(1, batch_size + 1):
        if (batch_size % m == 0 and m <= 4 * stages
                and batch_size // m >= max_replicas * min_rows):
            best = m
    return best


def check_microbatches(batch_size: int, microbatches: int, planner: str) -> None:
    """BadInput unless ``microbatches`` is 0 (automatic) or divides the batch."""
    if microbatches < 0:
        raise BadInput(f"{planner}: microbatches must be >= 0, got {microbatches}")
    if microbatches and batch_size % microbatches:
        raise BadInput(f"{planner}: {microbatches} microbatches do not divide the batch of "
                       f"{batch_size} samples (a microbatch must hold a whole number of samples)")


def even_split(weights: list[float], parts: int) -> list[int]:
    """Boundaries [0, b1, ..., n] of ``parts`` non-empty ranges minimising the largest sum.

    Binary search over the cap; a cap is feasible when a greedy left-to-right
    fill (closing a range early only to leave one op per remaining range)
    uses exactly ``parts`` ranges. Requires ``1 <= parts <= len(weights)``.
    """
    n = len(weights)

    def fill(cap: float) -> list[int] | None:
        bounds, acc = [0], 0.0
        for i, w in enumerate(weights):
            if i > bounds[-1] and len(bounds) < parts and (acc + w > cap or n - i <= parts - len(bounds)):
                bounds.append(i)
                acc = 0.0
            acc += w
            if acc > cap:
                return None
        return bounds + [n] if len(bounds) == parts else None

    lo, hi = max(weights), sum(weights)
    best = fill(hi)
    for _ in range(200):
        if hi - lo <= 1e-9 * hi:
            break
        mid = (lo + hi) / 2
        got = fill(mid)
        if got is not None:
            best, hi = got, mid
        else:
            lo = mid
    assert best is not None
    return best


def stage_cuts(problem: Problem) -> list[int]:
    """The positions of ``problem`` (its units) where a stage may begin or end: ``0``,
    ``problem.n`` and every cut between that keeps each colocation group in one stage."""
    return cut_positions(problem.graph, problem.order, problem.bounds)


def even_layout(problem: Problem, stages: int, microbatches: int, balance: str,
                origin: str) -> Layout:
    """The even split of ``problem`` over the first ``stages`` devices (see the module doc)."""
    n = problem.n
    cuts = stage_cuts(problem)
    ranges = len(cuts) - 1
    if stages > n:
        raise BadInput(f"{origin}: {stages} stages for {n} ops of {problem.graph.model.name!r}; "
                       f"a stage needs at least one op")
    if stages > ranges:
        raise BadInput(f"{origin}: {stages} stages, but the colocation groups of "
                       f"{problem.graph.model.name!r} allow at most {ranges} (a stage boundary "
                       f"never splits a group)")
    if stages > len(problem.devices):
        raise BadInput(f"{origin}: {stages} stages but the topology has "
                       f"{len(problem.devices)} devices (one stage per device)")
    if balance == "time":
        t = int(problem.type_of[0])
        w = (problem.f_fixed[t] + problem.f_scal[t] + problem.b_fixed[t] + problem.b_scal[t])
    elif balance == "params":
        w = problem.param_prefix
    else:
        raise BadInput(f"{origin}: balance must be 'time' or 'params', got {balance!r}")
    weights = [max(float(w[i + 1] - w[i]), 0.0) + 1e-9 for i in range(n)]
    per_range = [sum(weights[a:b]) for a, b in zip(cuts, cuts[1:])]
    bounds = [cuts[k] for k in even_split(per_range, stages)]
    devices = problem.devices
    return Layout(tuple(StageSpec(bounds[s], bounds[s + 1], (devices[s],)) for s in range(stages)),
                  microbatches, origin)


def baseline_draft(problem: Problem, layout: Layout, kind: str, reps: list[Replicas] | None = None):
    """Groups and pipeline of a baseline layout with even shares and a fixed schedule."""
    from .base import integer_shares

    m = layout.microbatches
    mb = problem.batch_size // m
    if reps is None:
        reps = []
        for st in layout.stages:
            counts = integer_shares(mb, [1.0] * len(st.devices))
            kept = [(d, c) for d, c in zip(st.devices, counts) if c > 0]
            reps.append(Replicas(tuple(d for d, _ in kept), tuple(c for _, c in kept)))
    maker = gpipe_schedule if kind == "gpipe" else one_f_one_b
    return groups_and_pipeline(problem, layout, reps, maker(len(layout.stages), m))


def _plan(graph: OpGraph, topology: Topology, kind: str, seed: int, stages: int,
          microbatches: int, balance: str, optimizer: str):
    t0 = started()
    problem = Problem(graph, topology, optimizer=optimizer_named(kind, optimizer))
    check_microbatches(problem.batch_size, microbatches, kind)
    if stages < 0:
        raise BadInput(f"{kind}: stages must be >= 0, got {stages}")
    count = stages or min(len(problem.devices), len(stage_cuts(problem)) - 1)
    m = microbatches or default_microbatches(problem.batch_size, count,
                                             min_rows=problem.min_rows)
    require_rows(graph, problem.batch_size // m, kind,
                 f"{m} microbatch(es) of the batch of {problem.batch_size}")
    layout = even_layout(problem, count, m, balance, kind)
    groups, pipeline = baseline_draft(problem, layout, kind)
    bound = pipeline_bound(problem)
    return finish(planner=kind, graph=graph, topology=topology, groups=groups, seed=seed,
                  options={"stages": stages, "microbatches": microbatches, "balance": balance,
                           "optimizer": optimizer},
                  started_at=t0, bound=bound, pipeline=pipeline, optimizer=problem.optimizer,
                  cost_model=problem.cm,
                  notes=(f"{count} stages balanced by {balance} on "
                         f"{problem.cm.cluster.device(problem.devices[0]).type.name}, "
                         f"{m} microbatches, {kind} schedule",))


def plan_gpipe(graph: OpGraph, topology: Topology, *, seed: int = 0, stages: int = 0,
               microbatches: int = 0, balance: str = "time", optimizer: str = "sgd"):
    """GPipe (baseline): even split, one device per stage, fill-drain schedule.

    Parameters
    ----------
    stages : int
        Number of stages (0: one per device, at most one per op).
    microbatches : int
        Microbatches per iteration (0: largest divisor of the batch <= 4 x stages).
    balance : str
        time (forward+backward time on the first device's type) or params.
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Complexity: O(ops log ops) plus one simulation.
    """
    return _plan(graph, topology, "gpipe", seed, stages, microbatches, balance, optimizer)


def plan_1f1b(graph: OpGraph, topology: Topology, *, seed: int = 0, stages: int = 0,
              microbatches: int = 0, balance: str = "time", optimizer: str = "sgd"):
    """1F1B (baseline): GPipe's even split with the one-forward-one-backward schedule.

    Parameters
    ----------
    stages : int
        Number of stages (0: one per device, at most one per op).
    microbatches : int
        Microbatches per iteration (0: largest divisor of the batch <= 4 x stages).
    balance : str
        time (forward+backward time on the first device's type) or params.
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Complexity: O(ops log ops) plus one simulation.
    """
    return _plan(graph, topology, "1f1b", seed, stages, microbatches, balance, optimizer)
