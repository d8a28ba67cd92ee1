"""The simulator: one cost model and a discrete-event engine for every kind of plan.

``simulate(plan, graph, topology)`` lowers the plan into a task graph
(``lower``), runs it (``engine.run``) and returns a ``SimResult``. See
docs/simulator.md for what is modelled and what is not.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

from .costs import CostModel, Flow, scale_by_batch
from .result import SimResult


def simulate(plan, graph, topology, *, cost_model: CostModel | None = None,
             check_fingerprints: bool = True) -> SimResult:
    """Simulate one training iteration of ``plan`` on ``graph`` and ``topology``.

    Parameters
    ----------
    plan : Plan
    graph : OpGraph
    topology : Topology
    cost_model : CostModel, optional
        Reuse one across calls on the same graph and topology (planners in a
        search loop should: it caches op tables, routes and collective costs).
    check_fingerprints : bool
        Refuse a graph or topology whose sha256 differs from the plan's.

    Returns
    -------
    SimResult

    Raises
    ------
    ArtifactMismatch
        Fingerprints differ, or the plan names ops or devices that are absent.
    BadInput
        A plan field the simulator does not model, or a cyclic order / a
        pipeline schedule that deadlocks.

    Complexity: O(tasks log tasks) where tasks ~ (ops x replicas x microbatches
    x 2) + transfers + collectives.

    Example
    -------
    >>> result = simulate(plan, graph, topology)        # doctest: +SKIP
    >>> result.iteration_ms, result.feasible             # doctest: +SKIP
    """
    from dl_nfv.artifacts import validate_against

    from .corun import stretch
    from .engine import run
    from .lower import lower

    validate_against(plan, graph, topology, check_fingerprints=check_fingerprints)
    cm = cost_model if cost_model is not None else CostModel(graph, topology)
    with _collector_paused():
        tasks = lower(plan, graph, topology, cm)
        schedule = run(tasks)
        # CPU devices of one host computing at once
        if stretch(tasks, schedule, cm, plan.optimizer.state_factor):
            schedule = run(tasks)
        return SimResult(plan, graph, topology, cm, tasks, schedule)


@contextmanager
def _collector_paused():
    """Pause Python's cyclic garbage collector while a task graph is built and run.

    Lowering allocates hundreds of thousands of small lists and tuples, none of
    them in reference cycles; the collector's generation-0 scans they trigger
    cost 15-20% of a simulation. It is re-enabled (if it was on) afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


__all__ = ["CostModel", "Flow", "SimResult", "scale_by_batch", "simulate"]
