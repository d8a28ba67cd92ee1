"""FastT (Middleware 2020): op placement and execution order by list scheduling, with
critical-path op splitting for mixed data/model parallelism.

The algorithm (docs/planners/fastt.md has the details and the measurements):

1. **Candidates.** List-schedule the training step (every op's forward and
   backward) with HEFT - upward rank on mean costs, each op to the device of
   earliest finish time with transfers on the topology's real routes - with
   and without a backward look-ahead, with CPOP (the critical path pinned to
   the one device minimising its total cost), and with HEFT restricted to the
   fastest 1, 2, 4, ... devices and to the fastest device's host. A data-
   parallel start (every splittable op split over every device by speed, the
   rest placed by HEFT, gradients bucketed) is a candidate too: it is the far
   end of FastT's mixed parallelism. Memory is respected per device while
   scheduling. Each candidate is simulated; the fastest is kept.
2. **Execution order.** Each device runs its ops in order of earliest start
   (``Plan.order``), its backwards in the reverse order.
3. **Critical-path splitting.** Ops on the simulated critical path that can
   be split on the batch dimension are tried k = 2..``max_split`` ways, the
   split/concat transfers costed, re-scheduled; a split is kept only when the
   simulated iteration time falls; a bounded number of rounds.
4. **Refinement** (``refine_with``): costs measured by ``dl-nfv train`` replace
   the profiled ones before planning (see ``refine.py`` for exactly what).
"""

from __future__ import annotations

import time

from dl_nfv.artifacts import BadInput, OpGraph, Topology
from dl_nfv.simulator.costs import CostModel

from ..base import finish, optimizer_named, started
from ..bounds import lower_bound
from .search import Context, search

UNREPLICATE_TRIES = 8


def plan(graph: OpGraph, topology: Topology, *, seed: int = 0, split_critical: bool = True,
         max_split: int = 8, memory_fraction: float = 1.0, refine_with: str = "",
         split_rounds: int = 2, time_limit: float = 5.0, optimizer: str = "sgd"):
    """Op placement and execution order by list scheduling (FastT), with critical-path splits.

    Parameters
    ----------
    split_critical : bool
        Split ops over the batch: try the data-parallel start, and split ops on the critical path while the simulated iteration time falls.
    max_split : int
        Most devices one op is split over (also capped by the device count and the batch size).
    memory_fraction : float
        Fraction of each device's memory the plan may fill (0 < f <= 1).
    refine_with : str
        A run report from `dl-nfv train`: re-plan with the costs it measured.
    split_rounds : int
        Rounds of critical-path splitting; each re-reads the simulated critical path.
    time_limit : float
        CPU seconds of planning after which the unreplication and split searches stop (0: no limit).
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Returns a ``Plan`` whose ``notes`` name the winning list scheduler, every
    candidate's simulated time, each split kept, and what a refinement changed.

    Raises ``InfeasiblePlan`` naming the op that fits on no device and by how
    much; ``BadInput`` for a bad option or run report.

    Complexity: O(C x (U + E) x D) for C (about 8) list schedules of U ops, E
    edges and D devices, plus 4 + (data-parallel starts) simulations, then at
    most 8 x (schedule + simulation) for unreplication and ``split_rounds`` x 6
    x (2 schedules + 1 simulation) for splitting, both cut at ``time_limit``.
    """
    t0 = started()
    cpu0 = time.process_time()
    if not 0 < memory_fraction <= 1:
        raise BadInput(f"fastt: memory_fraction must be in (0, 1], got {memory_fraction}")
    if max_split < 1 or split_rounds < 0 or time_limit < 0:
        raise BadInput(f"fastt: max_split must be >= 1, split_rounds and time_limit >= 0; got "
                       f"{max_split}, {split_rounds}, {time_limit}")
    opt = optimizer_named("fastt", optimizer)
    notes: list[str] = []
    costed = graph
    if refine_with:
        from .refine import refined_graph

        costed, refine_notes = refined_graph(graph, topology, refine_with)
        notes += [f"refined with {refine_with}: {n}" for n in refine_notes]
    cm = CostModel(costed, topology)
    ctx = Context(graph, topology, cm, memory_fraction=memory_fraction, optimizer=opt)
    deadline = cpu0 + time_limit if time_limit > 0 else float("inf")
    best, search_notes = search(ctx, split_critical=split_critical, max_split=max_split,
                                split_rounds=split_rounds, deadline=deadline)
    notes = search_notes[:1] + notes + search_notes[1:]
    k = min(ctx.D, graph.model.batch_size)
    bound = lower_bound(cm, ctx.devices, min_batch_fraction=1.0 / k)
    return finish(planner="fastt", graph=graph, topology=topology, groups=best.groups, seed=seed,
                  options={"split_critical": split_critical, "max_split": max_split,
                           "memory_fraction": memory_fraction, "refine_with": refine_with,
                           "split_rounds": split_rounds, "time_limit": time_limit,
                           "optimizer": optimizer},
                  started_at=t0, bound=bound, order=best.order, fusion=best.fusion, notes=notes,
                  optimizer=opt, cost_model=cm)
