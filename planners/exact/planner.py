"""``dl-nfv plan exact``: the optimal contiguous split into single-device stages.

Lists the ideals of the graph's block DAG (``blocks``), runs the dynamic program over
them (``dp``) for the bottleneck objective (``stages``), gives each stage a device of the
class the optimum chose, and makes the layout a plan: the op order that lists the stages
one after another is topological, so the pipeline planner's scheduler and builders take
it as a layout of ranges, pick its microbatch schedule, and ``finish`` simulates it.
See docs/planners/exact.md.
"""

from __future__ import annotations

import time

from dl_nfv.artifacts import BadInput, InfeasiblePlan, OpGraph, Plan, PlanStatus, Topology
from dl_nfv.planners.base import finish, optimizer_named, started
from dl_nfv.planners.gpipe import check_microbatches, default_microbatches
from dl_nfv.planners.pipeline.build import Replicas, groups_and_pipeline
from dl_nfv.planners.pipeline.partition import Layout, StageSpec
from dl_nfv.planners.pipeline.problem import Problem
from dl_nfv.planners.pipeline.search import evaluate as time_layout
from dl_nfv.planners.runnable import min_slice_rows, require_rows
from dl_nfv.planners.schedules import one_f_one_b
from dl_nfv.simulator.costs import CostModel

from .blocks import block_graph, enumerate_ideals
from .dp import Solution, Tables, count_vectors, solve
from .stages import device_classes, uniform_route

MAX_IDEALS = 20_000


def plan(graph: OpGraph, topology: Topology, *, seed: int = 0, microbatches: int = 0,
         time_limit: float = 60.0, max_ideals: int = MAX_IDEALS, optimizer: str = "sgd") -> Plan:
    """Exact contiguous split into single-device stages, minimising the bottleneck load.

    Parameters
    ----------
    microbatches : int
        Microbatches per iteration the loads are counted at (0: the largest divisor of
        the batch not above 4 x devices).
    time_limit : float
        CPU seconds for listing the ideals and the dynamic program; past it the planner
        stops with exit code 2 (building and simulating the plan come after).
    max_ideals : int
        Most ideals (contiguous cut points) of the graph before the planner gives up with
        exit code 2.
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Returns a ``Plan`` with status ``optimal``; its notes give the objective (the
    bottleneck load per iteration and per sample) and every stage's load. Raises
    ``ExactLimit`` (exit 2) past the time limit or the ideal cap, ``BadInput`` for a bad
    option or a topology whose routes differ, ``InfeasiblePlan`` when no split fits in
    memory or a microbatch holds fewer rows than a batch norm needs.

    Complexity: O(ideals^2 x count vectors) time (docs/planners/exact.md).
    """
    t0 = started()
    opt = optimizer_named("exact", optimizer)
    check_microbatches(graph.model.batch_size, microbatches, "exact")
    if time_limit <= 0:
        raise BadInput(f"exact: time_limit must be > 0 seconds, got {time_limit}")
    if max_ideals < 1:
        raise BadInput(f"exact: max_ideals must be >= 1, got {max_ideals}")
    cm = CostModel(graph, topology)
    pair = uniform_route(cm)
    classes = device_classes(cm)
    batch = graph.model.batch_size
    m = microbatches or default_microbatches(batch, len(cm.cluster.devices),
                                             min_rows=min_slice_rows(graph))
    require_rows(graph, batch // m, "exact", f"{m} microbatch(es) of the batch of {batch}")
    deadline = time.process_time() + time_limit
    blocks = block_graph(graph)
    ideals = enumerate_ideals(blocks, max_ideals=max_ideals, deadline=deadline)
    tables = Tables(cm, blocks, classes, microbatches=m, optimizer=opt, pair=pair)
    vectors, step = count_vectors(classes, blocks.size)
    solution = solve(tables, ideals, vectors, step, deadline=deadline)
    if not solution.stages:
        raise InfeasiblePlan(f"exact: no split of {graph.model.name!r} into at most "
                             f"{len(cm.cluster.devices)} stages fits in the devices' memory")
    placed = _place(blocks, classes, solution)
    problem = Problem(graph, topology, cost_model=cm, optimizer=opt,
                      order=[op for ops, _ in placed for op in ops],
                      max_units=len(graph.ops))
    layout, start = [], 0  # op positions to units (a colocation group is one unit)
    for ops, device in placed:
        layout.append(StageSpec(problem.unit_at(start), problem.unit_at(start + len(ops)),
                                (device,)))
        start += len(ops)
    groups, pipeline, label = _pipeline_parts(problem, Layout(tuple(layout), m, "exact"))
    per_sample = solution.bottleneck_ms / graph.model.batch_size
    notes = [f"objective: bottleneck {solution.bottleneck_ms:.6f} ms per iteration at {m} "
             f"microbatches ({per_sample:.6f} ms per sample), {len(placed)} stage(s) on "
             f"{[d for _, d in placed]}; {label} schedule",
             f"{solution.ideals} ideals of {blocks.size} blocks ({len(graph.ops)} ops)"]
    return finish(planner="exact", graph=graph, topology=topology, groups=groups, seed=seed,
                  options={"microbatches": microbatches, "time_limit": time_limit,
                           "max_ideals": max_ideals, "optimizer": optimizer},
                  started_at=t0, status=PlanStatus.OPTIMAL, pipeline=pipeline, optimizer=opt,
                  cost_model=cm, notes=notes)


def _place(blocks, classes, solution: Solution) -> list[tuple[list[str], str]]:
    """Each stage's ops (in the graph's topological order) and a device of its class."""
    position = {op: i for i, ops in enumerate(blocks.blocks) for op in ops}
    free = {k: list(c.devices) for k, c in enumerate(classes)}
    out = []
    for block_ids, k in solution.stages:
        ops = sorted((op for b in block_ids for op in blocks.blocks[b]),
                     key=lambda op: (position[op], blocks.blocks[position[op]].index(op)))
        out.append((ops, free[k].pop(0)))
    return out


def _pipeline_parts(problem: Problem, layout: Layout):
    """Groups and pipeline of ``layout`` with the schedule the pipeline planner's scheduler
    times fastest (1F1B where no schedule fits its memory caps)."""
    timed = time_layout(problem, layout, full=True)
    if timed is not None:
        groups, pipeline = groups_and_pipeline(problem, layout, timed.reps, timed.timed.schedule)
        return groups, pipeline, timed.timed.label
    m = layout.microbatches
    reps = [Replicas(st.devices, (problem.batch_size // m,)) for st in layout.stages]
    groups, pipeline = groups_and_pipeline(problem, layout, reps,
                                           one_f_one_b(len(layout.stages), m))
    return groups, pipeline, "1f1b"
