"""Baechi's memory-constrained placers (SoCC 2020) as baselines: m-TOPO, m-ETF and m-SCT.

All three place whole ops (no splitting) and run on the shared cost model and
the shared list-scheduling machinery (``listsched``), so they compare with
FastT on equal terms. Memory per op is its parameters, gradients and
optimizer state plus its stashed activation (and inputs received from other
devices); every placer keeps each device under ``memory_fraction`` of its
memory.

* **m-TOPO**: ops in topological order fill one device after another; a
  device takes ops until it holds ``total memory / devices + largest op``
  (or its own capacity, if smaller). Ops then run in topological order.
* **m-ETF**: earliest task first - repeatedly start the ready op on the
  device where it can start earliest, among devices with room for it.
* **m-SCT**: small-communication-time scheduling. A linear relaxation of the
  favourite-child program (Hanen and Munier) is solved with PuLP/CBC: for
  every edge ``x[i,j]`` in [0, 1] (0: ``j`` is ``i``'s favourite child, which
  runs right after ``i`` on its device and pays no transfer), each op has at
  most one favourite child and is the favourite of at most one parent,
  ``start[j] >= start[i] + p[i] + c[i,j] x[i,j]``, minimise the makespan
  (ties broken towards fewer paid transfers by a tiny secondary term).
  ``x < 0.5`` rounds to a favourite; ETF then keeps each ready favourite
  child on its parent's device when it fits. ``p`` is an op's mean
  forward+backward time over the devices and ``c`` the mean transfer time of
  the edge's bytes, both ways.

All three keep the ops of a colocation group (``OpGraph.colocation``) on one
device: the one its first op goes to, which must have room for the whole
group.

Complexity: m-TOPO O((U + E) x D); m-ETF O(U x R x D) (R: largest ready
set); m-SCT adds one LP of U + E + 1 variables and ~2U + E constraints.
"""

from __future__ import annotations

import warnings

import pulp

from dl_nfv.artifacts import BadInput, InfeasiblePlan, OpGraph, SolverError, Topology
from dl_nfv.simulator.costs import CostModel

from .base import finish, optimizer_named, started
from .bounds import lower_bound
from .listsched import (
    MemoryShortfall,
    OpSchedule,
    StepGraph,
    etf_schedule,
    list_schedule,
    plan_groups,
)

LP_TIME_LIMIT_S = 120
TIE_BREAK = 1e-6


def plan_topo(graph: OpGraph, topology: Topology, *, seed: int = 0, memory_fraction: float = 1.0,
              optimizer: str = "sgd"):
    """Baechi m-TOPO: fill devices in topological order up to a per-device memory cap.

    Parameters
    ----------
    memory_fraction : float
        Fraction of each device's memory the plan may fill (0 < f <= 1).
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Raises ``InfeasiblePlan`` naming the op that fits nowhere and the shortfall.
    """
    return _run("m-topo", graph, topology, seed, memory_fraction, optimizer, topo_schedule)


def plan_etf(graph: OpGraph, topology: Topology, *, seed: int = 0, memory_fraction: float = 1.0,
             optimizer: str = "sgd"):
    """Baechi m-ETF: earliest-task-first list scheduling with memory checks.

    Parameters
    ----------
    memory_fraction : float
        Fraction of each device's memory the plan may fill (0 < f <= 1).
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Raises ``InfeasiblePlan`` naming the op that fits nowhere and the shortfall.
    """
    return _run("m-etf", graph, topology, seed, memory_fraction, optimizer, _etf)


def plan_sct(graph: OpGraph, topology: Topology, *, seed: int = 0, memory_fraction: float = 1.0,
             optimizer: str = "sgd"):
    """Baechi m-SCT: favourite-child LP relaxation (PuLP), rounded at 0.5, then ETF.

    Parameters
    ----------
    memory_fraction : float
        Fraction of each device's memory the plan may fill (0 < f <= 1).
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Raises ``InfeasiblePlan`` naming the op that fits nowhere and the shortfall;
    ``SolverError`` when the LP solver fails.
    """
    return _run("m-sct", graph, topology, seed, memory_fraction, optimizer, _sct)


def _run(name: str, graph: OpGraph, topology: Topology, seed: int, memory_fraction: float,
         optimizer: str, placer):
    t0 = started()
    if not 0 < memory_fraction <= 1:
        raise BadInput(f"{name}: memory_fraction must be in (0, 1], got {memory_fraction}")
    opt = optimizer_named(name, optimizer)
    cm = CostModel(graph, topology)
    devices = list(cm.cluster.device_names)
    sg = StepGraph(cm, devices, optimizer=opt)
    capacity = [cm.memory_bytes(d) * memory_fraction for d in devices]
    try:
        sched, notes = placer(sg, capacity)
    except MemoryShortfall as exc:
        raise InfeasiblePlan(f"{name}: {exc.describe()}") from None
    groups, order, _ = plan_groups(sched)
    bound = lower_bound(cm, devices, min_batch_fraction=1.0, ops_splittable=False)
    return finish(planner=name, graph=graph, topology=topology, groups=groups, seed=seed,
                  options={"memory_fraction": memory_fraction, "optimizer": optimizer},
                  started_at=t0, bound=bound, order=order, notes=notes, optimizer=opt, cost_model=cm)


def topo_schedule(sg: StepGraph, capacity: list[float]) -> tuple[OpSchedule, list[str]]:
    """m-TOPO: fill the devices in topological order up to an even cap, then schedule. The
    first op of a colocation group takes the whole group's memory to its device, and the
    group's other ops follow it there; the cap is ``total / devices`` plus the largest op
    or group."""
    U = sg.U
    need = [sg.static_bytes[u] + sg.act_bytes[u] for u in range(U)]
    # a colocation group is placed as one block: the largest block, not op, tops up the cap
    cap = sum(need) / sg.D + max([*need, *sg.group_bytes.values()])
    limits = [min(c, cap) for c in capacity]
    pins: dict[int, int] = {}
    homes: dict[int, int] = {}  # colocation group -> the device of its first op
    used = [0.0] * sg.D
    d = 0
    for u in range(U):  # units are in topological order
        g = sg.group[u]
        if g in homes:  # a later op of a group: where the first went, its bytes reserved
            pins[u] = homes[g]
            continue
        block = sg.group_bytes[g] if g >= 0 else need[u]
        while d < sg.D and used[d] + block > limits[d]:
            d += 1
        if d == sg.D:
            best = max(range(sg.D), key=lambda j: (capacity[j] - used[j], -j))
            raise MemoryShortfall(sg.op_ids[sg.unit_op[u]], block, sg.devices[best],
                                  max(0.0, limits[best] - used[best]), limits[best])
        pins[u] = d
        used[d] += block
        if g >= 0:
            homes[g] = d
    # run the placement in topological order (placement fixed; memory was checked above)
    priority = [float(2 * U - t) for t in range(2 * U)]
    sched = list_schedule(sg, priority, allowed=list(range(sg.D)),
                          capacity_bytes=[float("inf")] * sg.D, pins=pins, insertion=False,
                          algorithm="m-topo")
    return sched, [f"m-TOPO cap {cap / 2**30:.3f} GiB per device; {len(set(pins.values()))} "
                   f"devices used"]


def _etf(sg: StepGraph, capacity: list[float]) -> tuple[OpSchedule, list[str]]:
    return etf_schedule(sg, allowed=list(range(sg.D)), capacity_bytes=capacity,
                        algorithm="m-etf"), []


def _sct(sg: StepGraph, capacity: list[float]) -> tuple[OpSchedule, list[str]]:
    favourite, lp_ms = favourite_children(sg)
    sched = etf_schedule(sg, allowed=list(range(sg.D)), capacity_bytes=capacity,
                         favourite=favourite, algorithm="m-sct")
    kept = sum(1 for child, parent in favourite.items() if sched.device[child] == sched.device[parent])
    return sched, [f"m-SCT: LP relaxed makespan {lp_ms:.3f} ms (mean costs); {len(favourite)} "
                   f"favourite children, {kept} kept on their parent's device"]


def favourite_children(sg: StepGraph) -> tuple[dict[int, int], float]:
    """Solve the favourite-child LP relaxation and round at 0.5: child unit -> parent unit.

    Returns the favourites and the LP's relaxed makespan (ms, on mean costs).
    Raises ``SolverError`` when CBC reports no optimal or feasible solution.
    """
    allowed = list(range(sg.D))
    w, lat, per_byte = sg.mean_costs(allowed)
    U = sg.U
    p = [w[u] + w[U + u] for u in range(U)]
    prob = pulp.LpProblem("m_sct", pulp.LpMinimize)
    start = [prob.add_variable(f"s{u}", lowBound=0) for u in range(U)]
    makespan = prob.add_variable("w", lowBound=0)
    edges = [(a, b, nbytes) for a in range(U) for b, nbytes in sg.succ[a]]
    x = [prob.add_variable(f"x{k}", lowBound=0, upBound=1) for k in range(len(edges))]
    cost = [2 * (lat + nbytes * per_byte) if nbytes > 0 else 0.0 for _, _, nbytes in edges]
    scale = TIE_BREAK / max(sum(cost), 1e-12)
    prob += makespan + pulp.lpSum(c * scale * xv for c, xv in zip(cost, x) if c > 0)
    out_edges: list[list[int]] = [[] for _ in range(U)]
    in_edges: list[list[int]] = [[] for _ in range(U)]
    for k, (a, b, _) in enumerate(edges):
        prob += start[b] >= start[a] + p[a] + cost[k] * x[k]
        out_edges[a].append(k)
        in_edges[b].append(k)
    for u in range(U):
        if len(out_edges[u]) > 1:
            prob += pulp.lpSum(x[k] for k in out_edges[u]) >= len(out_edges[u]) - 1
        if len(in_edges[u]) > 1:
            prob += pulp.lpSum(x[k] for k in in_edges[u]) >= len(in_edges[u]) - 1
        if not out_edges[u]:
            prob += makespan >= start[u] + p[u]
    with warnings.catch_warnings():  # PuLP 3 flags its bundled CBC as deprecated; it still ships
        warnings.simplefilter("ignore", DeprecationWarning)
        status = prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=LP_TIME_LIMIT_S))
    if pulp.LpStatus[status] != "Optimal" and makespan.varValue is None:
        raise SolverError(f"m-sct: the favourite-child LP ended {pulp.LpStatus[status]!r}")
    favourite: dict[int, int] = {}
    for k, (a, b, _) in enumerate(edges):
        if (x[k].varValue if x[k].varValue is not None else 1.0) < 0.5:
            favourite[b] = a
    return favourite, float(makespan.varValue or 0.0)
