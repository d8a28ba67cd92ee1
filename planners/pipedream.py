"""PipeDream (baseline): PipeDream's dynamic-programming partitioner over its hierarchical-bandwidth model.

A re-implementation of ``compute_partitioning`` in PipeDream's
``optimizer_graph_hierarchical.py`` (SOSP'19), on the ops in topological
order (PipeDream's antichain states are the same thing for a chain):

* one level per tier of the hierarchy, ``(machines at this level, bandwidth)``:
  devices in a host over the intra-host bandwidth, then hosts over the
  inter-host bandwidth, when every host has the same number of devices; a
  single flat level over the narrowest route otherwise (PipeDream's model has
  no way to say that hosts differ);
* a range ``[i, j)`` replicated on ``m`` machines costs
  ``(compute + 4 (m - 1) params / (bandwidth m)) / m`` (divided again by the
  machines inside each machine at the upper level), compute being the
  forward+backward time on the first device's type (PipeDream assumes equal
  devices); ``A[j][m] = min over k, m' of max(A[k][m - m'], cost of [k, j) on m')``;
  activation transfers count only with ``activation_compression_ratio`` set,
  as in PipeDream;
* stage boundaries only where they keep every colocation group in one stage
  (the DP runs over the ranges between those cuts);
* the memory constraint: parameters, gradients and optimizer state plus the
  stash of ``ceil((N - m) / m')`` in-flight microbatches must fit the smallest
  device;
* the rows constraint: a stage is replicated on no more devices than leave each
  replica's even slice of a microbatch the rows the graph's batch norms need in
  training (``runnable.min_slice_rows``), counting the devices inside each machine of
  an upper level; ``InfeasiblePlan`` names the batch norm when a microbatch itself is
  smaller.

The stages and replication factors are then laid on the devices in topology
order (each upper-level stage on whole hosts, its lower-level stages on runs
of devices inside each host), with even batch shares, and run synchronously
with the 1F1B schedule and a flush (PipeDream-Flush); microbatches as for
``gpipe``.

Complexity: O(levels x ops^3 x machines^2) for the DP (each row of a start and a machine
count taken for every end at once in numpy, with the loop's arithmetic term by term, so
the results are the loop's), plus one simulation.
"""

from __future__ import annotations

import math

import numpy as np

from dl_nfv.artifacts import BadInput, InfeasiblePlan, OpGraph, Topology

from .base import finish, optimizer_named, started
from .gpipe import baseline_draft, check_microbatches, default_microbatches, stage_cuts
from .pipeline.partition import Layout, StageSpec
from .pipeline.planner import pipeline_bound
from .pipeline.problem import Problem
from .runnable import require_rows

INF = float("inf")


def hierarchy(problem: Problem) -> list[tuple[int, float]]:
    """PipeDream's levels ``(machines, bandwidth in bytes per ms)``, innermost first."""
    cluster = problem.cm.cluster
    hosts: dict[str, list[str]] = {}
    for d in problem.devices:
        hosts.setdefault(cluster.device(d).host, []).append(d)
    sizes = {len(v) for v in hosts.values()}

    def narrowest(pairs) -> float:
        slowest = max((problem.cm.transfer_affine(a, b)[1] for a, b in pairs), default=0.0)
        return 1.0 / slowest if slowest > 0 else 0.0  # bytes per ms

    if len(hosts) > 1 and len(sizes) == 1 and sizes != {1}:
        per = sizes.pop()
        intra = narrowest((a, b) for v in hosts.values() for a in v for b in v if a != b)
        firsts = [v[0] for v in hosts.values()]
        inter = narrowest((a, b) for a in firsts for b in firsts if a != b)
        return [(per, intra), (len(hosts), inter)]
    devs = problem.devices
    return [(len(devs), narrowest((a, b) for a in devs for b in devs if a != b))]


class _Level:
    """One level of PipeDream's DP: ``best[i][j][m]`` = (time, split, replicas) for range [i, j)."""

    def __init__(self, compute, params, stash, machines: int, bandwidth: float, within: int,
                 total_machines: int, memory: float, final: bool, ratio: float, out_act,
                 wide, most: int):
        # wide[i][j]: devices per machine a range [i, j) runs on; most: devices a stage may have
        n = len(compute) - 1
        self.n, self.machines = n, machines
        A = [[[(INF, None, None)] * machines for _ in range(n + 1)] for _ in range(n + 1)]
        for i in range(n):
            for j in range(i + 1, n + 1):
                c = compute[i][j]
                if c == INF:
                    continue
                for m in range(min(machines, most // wide[i][j])):
                    in_flight = math.ceil((total_machines - (m + 1)) / (m + 1))
                    if params[i][j] + stash[i][j] * max(in_flight, 1) > memory:
                        continue
                    comm = 4 * m * params[i][j] / (bandwidth * (m + 1)) / within
                    A[i][j][m] = ((c + comm) / (m + 1), None, m + 1)
        starts = [0] if final else range(n)
        times = np.array([[[a[0] for a in row] for row in col] for col in A])  # [i, j, m]
        arrays = _Arrays(compute, params, stash, wide, out_act)
        for i in starts:
            for m in range(1, machines):
                t, k, mp = _best_splits(arrays, times[i], i, m, most, bandwidth, total_machines,
                                        memory, ratio)
                for j in range(i + 1, n + 1):
                    best = A[i][j][m]
                    if A[i][j][m - 1][0] < best[0]:  # use fewer machines
                        best = A[i][j][m - 1]
                    if t[j] < best[0]:
                        best = (float(t[j]), (int(k[j]), m - int(mp[j])), int(mp[j]))
                    A[i][j][m] = best
                    times[i, j, m] = best[0]
        self.A = A

    def splits(self, i: int, j: int) -> list[tuple[int, int, int]]:
        """Stages ``(start, stop, replicas)`` of the best solution for [i, j) on all machines."""
        out = []
        meta = self.A[i][j][self.machines - 1]
        stop = j
        while meta[1] is not None:
            k, m_rest = meta[1]
            out.append((k, stop, meta[2]))
            stop = k
            meta = self.A[i][k][m_rest]
        out.append((i, stop, meta[2]))
        return list(reversed(out))



class _Arrays:
    """A level's inputs as arrays ``[k, j]`` (ranges ``[k, j)``) and ``[k]``."""

    __slots__ = ("compute", "params", "stash", "wide", "out_act")

    def __init__(self, compute, params, stash, wide, out_act):
        self.compute, self.params, self.stash = (np.array(x, dtype=float)
                                                 for x in (compute, params, stash))
        self.wide = np.array(wide, dtype=np.int64)
        self.out_act = np.array(out_act, dtype=float)


def _best_splits(x: _Arrays, times: np.ndarray, i: int, m: int, most: int, bandwidth: float,
                 total_machines: int, memory: float, ratio: float):
    """For ranges ``[i, j)`` on ``m + 1`` machines, every ``j`` at once: the best split into
    ``[i, k)`` on ``m + 1 - mp`` machines (their times ``times[k, m - mp]``) and a last stage
    ``[k, j)`` replicated ``mp`` times, as PipeDream's loop over ``k`` then ``mp`` finds it
    (the first of equal times). Returns per ``j`` the time (inf: none) and its ``k`` and
    ``mp``; the arithmetic is the loop's, term by term, so the times are identical."""
    n = len(x.out_act) - 1
    mps = np.arange(1, m + 1)
    prev = times[:, m - mps]  # [k, mp]
    in_flight = np.maximum(np.ceil((total_machines - (m + 1)) / mps), 1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        last = (x.compute[:, :, None] + 4 * (mps - 1) * x.params[:, :, None]
                / (bandwidth * mps)) / mps  # [k, j, mp]
        t = np.maximum(prev[:, None, :], last)
        if ratio:
            t = np.maximum(t, (2.0 * x.out_act[:, None] / (bandwidth * mps) / ratio)[:, None, :])
            after = 2.0 * x.out_act[None, :, None] / (bandwidth * mps) / ratio
            t = np.where((np.arange(n + 1) < n)[None, :, None], np.maximum(t, after), t)
        fits = x.params[:, :, None] + x.stash[:, :, None] * in_flight <= memory
    ks = np.arange(n + 1)
    valid = ((ks[:, None] > i) & (ks[:, None] < ks[None, :]))[:, :, None] & fits
    valid &= mps[None, None, :] <= (most // x.wide)[:, :, None]
    valid &= (prev < INF)[:, None, :] & (x.compute < INF)[:, :, None]
    flat = np.where(valid, t, INF).transpose(1, 0, 2).reshape(n + 1, -1)  # [j, (k, mp)]
    at = flat.argmin(axis=1)
    return flat[np.arange(n + 1), at], at // m, at % m + 1

def pipedream_layout(problem: Problem, microbatches: int, ratio: float = 0.0) -> Layout:
    """PipeDream's partition laid on the devices (see the module docstring)."""
    rows = problem.batch_size // microbatches
    require_rows(problem.graph, rows, "pipedream",
                 f"{microbatches} microbatch(es) of the batch of {problem.batch_size}")
    # devices a stage may be replicated on (a replica given no rows is simply left out)
    most = rows // problem.min_rows if problem.min_rows > 1 else len(problem.devices)
    cuts = stage_cuts(problem)  # the DP runs over the ranges between these positions
    n = len(cuts) - 1
    t = int(problem.type_of[0])
    total = problem.f_fixed[t] + problem.f_scal[t] + problem.b_fixed[t] + problem.b_scal[t]
    levels = hierarchy(problem)
    N = len(problem.devices)
    memory = float(problem.memory_bytes.min())
    static = [[INF] * (n + 1) for _ in range(n + 1)]
    stash = [[INF] * (n + 1) for _ in range(n + 1)]
    compute = [[INF] * (n + 1) for _ in range(n + 1)]
    for i in range(n):
        for j in range(i + 1, n + 1):
            a, b = cuts[i], cuts[j]
            compute[i][j] = float(total[b] - total[a])
            static[i][j] = problem.static_bytes(a, b)
            stash[i][j] = problem.activation_bytes(a, b) / microbatches
    out_act = [float(problem.cut_bytes[b]) for b in cuts]
    tiers = []
    within = 1
    wide = [[1] * (n + 1) for _ in range(n + 1)]
    for k, (machines, bandwidth) in enumerate(levels):
        final = k == len(levels) - 1
        level = _Level(compute, static, stash, machines, bandwidth, within, N, memory, final,
                       ratio, out_act, wide, most)
        tiers.append(level)
        if not final:
            compute = [[level.A[i][j][machines - 1][0] if j > i else INF for j in range(n + 1)]
                       for i in range(n + 1)]
            wide = [[max((r for _, _, r in level.splits(i, j)), default=1)
                     if compute[i][j] < INF else 1 for j in range(n + 1)] for i in range(n + 1)]
        within = machines
    top = tiers[-1]
    if top.A[0][n][top.machines - 1][0] == INF:
        raise InfeasiblePlan(f"pipedream: no partition of {problem.graph.model.name!r} fits "
                             f"{memory / 2**30:.2f} GiB per device under PipeDream's memory model")
    # lay stages on devices in topology order
    cluster = problem.cm.cluster
    hosts: dict[str, list[str]] = {}
    for d in problem.devices:
        hosts.setdefault(cluster.device(d).host, []).append(d)
    stages: list[StageSpec] = []
    if len(tiers) == 1:
        pos = 0
        for a, b, r in top.splits(0, n):
            stages.append(StageSpec(cuts[a], cuts[b], tuple(problem.devices[pos:pos + r])))
            pos += r
    else:
        host_list = list(hosts.values())
        hpos = 0
        for a, b, r_hosts in top.splits(0, n):
            chosen = host_list[hpos:hpos + r_hosts]
            hpos += r_hosts
            dpos = 0
            for a2, b2, r_dev in tiers[0].splits(a, b):
                devs = tuple(d for h in chosen for d in h[dpos:dpos + r_dev])
                stages.append(StageSpec(cuts[a2], cuts[b2], devs))
                dpos += r_dev
    return Layout(tuple(stages), microbatches, "pipedream")


def plan(graph: OpGraph, topology: Topology, *, seed: int = 0, microbatches: int = 0,
         activation_compression_ratio: float = 0.0, optimizer: str = "sgd"):
    """PipeDream's partitioner (baseline): hierarchical-bandwidth DP with stage replication, 1F1B.

    Parameters
    ----------
    microbatches : int
        Microbatches per iteration (0: largest divisor of the batch <= 4 x stages).
    activation_compression_ratio : float
        Count activation transfers in the DP, divided by this ratio (0: ignore
        them, PipeDream's default).
    optimizer : str
        sgd (with momentum) or adam: its state and step are planned for.

    Complexity: O(levels x ops^3 x machines^2) plus one simulation.
    """
    t0 = started()
    problem = Problem(graph, topology, optimizer=optimizer_named("pipedream", optimizer))
    check_microbatches(problem.batch_size, microbatches, "pipedream")
    if activation_compression_ratio < 0:
        raise BadInput(f"pipedream: activation_compression_ratio must be >= 0, got "
                       f"{activation_compression_ratio}")
    layout = pipedream_layout(problem, microbatches or 1, activation_compression_ratio)
    m = microbatches or auto_microbatches(problem, layout)
    if m != layout.microbatches:
        layout = pipedream_layout(problem, m, activation_compression_ratio)
        layout = Layout(layout.stages, m, "pipedream")
    groups, pipeline = baseline_draft(problem, layout, "1f1b")
    bound = pipeline_bound(problem)
    levels = ", ".join(f"{k} x {bw * 8e3 / 1e9:.1f} Gbps" for k, bw in hierarchy(problem))
    return finish(planner="pipedream", graph=graph, topology=topology, groups=groups, seed=seed,
                  options={"microbatches": microbatches,
                           "activation_compression_ratio": activation_compression_ratio,
                           "optimizer": optimizer},
                  started_at=t0, bound=bound, pipeline=pipeline, optimizer=problem.optimizer,
                  cost_model=problem.cm,
                  notes=(f"PipeDream levels: {levels}; {len(layout.stages)} stages, replication "
                         f"{[len(s.devices) for s in layout.stages]}, {m} microbatches, 1F1B",))


def auto_microbatches(problem: Problem, layout: Layout) -> int:
    """The gpipe rule, keeping every replica the rows a batch norm needs (a sample at least)."""
    widest = max(len(s.devices) for s in layout.stages)
    return default_microbatches(problem.batch_size, len(layout.stages), widest,
                                min_rows=problem.min_rows)
