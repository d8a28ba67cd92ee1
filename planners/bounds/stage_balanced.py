"""The stage-balanced bound: the least iteration time of any synchronous pipeline.

Family bounded: plans whose stages are sets of ops run by one group of devices each
(replicas with any whole-sample shares, gradients AllReduced), every device in at most one
stage, stages ordered so data flows forward, ``m`` microbatches with a flush, any
schedule of each stage's forwards and backwards (split backwards included), tied weights
summed by AllReduce or by exchange; pure data parallelism is the one-stage case. Plans
that fuse ops are outside it.

Model: a stage of ops ``R`` on a group of ``k`` devices takes, per iteration, its compute
(``ranges``: a fixed part per microbatch and a part that scales with each replica's share,
at the fastest type over each device's best relative speed), its replicas' upkeep outside
the ops (zeroing gradient buckets, a share of the optimizer update, at the best memory
bandwidth), and for ``k >= 2`` an AllReduce of its parameters at no less than its floor
(``network``: the cost model's figures, those a collective sees on each link). Links are
taken as free of other traffic: an activation costs only the least time one replica's
share of it takes to cross a certain boundary, and memory for activations is free, so the
bound holds however busy the links and however full the devices.

Method: ``T >= max_s (chain before s + busy_s)``, ``T >= max_s (chain before s + around_s
+ least chain after s)`` and ``T >= max_s sync_s`` for every partition into stages, device
counts and share options (the terms: ``cheap``); the bound is the least of that over
partitions (``dp``) and every ``m`` dividing the batch. Two DPs compute it: the cheap one
lets every stage take the fastest devices (a relaxation, on a grid of device counts on
large clusters); on clusters of several device classes the class DP counts the devices
left per class, exactly (``classes``). Microbatch counts are taken best first, one level
at a time (cheap DP at its first caps, refined; class DP without its AllReduce caps, with
them), until every count not finished is at least the best finished one: each level's
value bounds every plan of its ``m`` and is at least the level before.

Limits: communication other than AllReduce floors, boundary crossings and split ties'
sums is not counted, nor any contention; a region of several ops that a stage may split
(branchy graphs) is counted for neither stage; so the bound is loosest on slow links.

Complexity: O(U^2 x D^2 x O) per cheap DP and O(U^2 x S x K x O) per class DP (U regions,
at most about ``ranges.EXACT_REGIONS_UP_TO`` of them, light ones merged past it; D devices,
S states and K class vectors, O <= 4 share options), a few DPs per microbatch count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING

import numpy as np

from dl_nfv.artifacts import TieSync

from .cheap import CheapTerms, cheap_bound, cheap_steps, cheap_terms
from .classes import class_bound, class_states, uncapped_table
from .dp import EXACT_COUNTS_UP_TO, DeviceGrid, Shape
from .network import AllReduceFloors, Boundaries, allreduce_floors, tie_terms
from .ranges import RangeTimes, device_classes, device_speeds, forced_cuts, range_times
from .shares import fractional_capacity

if TYPE_CHECKING:
    from dl_nfv.planners.pipeline.problem import Problem

__all__ = ["forced_cuts", "stage_balanced_bound_ms"]

TERMS_KEPT = 2  # counts whose cheap terms ``_best_first`` keeps between steps


@dataclass(frozen=True, kw_only=True, slots=True)
class Inputs:
    """What the DPs of one bound share (arrays ``[i, j, k]`` are per range of regions and
    device count)."""

    ranges: RangeTimes
    boundaries: Boundaries
    holders: dict  # (i, j) -> speeds of the devices whose memory holds the range, fastest first
    batch: int
    devices: int
    fastest: float  # the largest relative speed of a device
    classes: list[tuple[float, float, int, int]]  # ranges.device_classes
    floors: AllReduceFloors
    allreduce: np.ndarray  # the range's AllReduce floor on k devices
    outside: np.ndarray  # a replica's zeroing and 1/k share of the update
    tail: np.ndarray  # after its last backward: zeroing, and on one device the whole update
    ties: np.ndarray  # [i, j]: split ties' sums after the stage's chain-offset term
    balanced_capacity: np.ndarray  # shares.fractional_capacity
    zero: float  # ms per parameter byte to zero the buckets, at the best memory bandwidth
    update: float  # ms per parameter byte of the optimizer step, at the best
    grid: DeviceGrid | None


def stage_balanced_bound_ms(problem: Problem, devices: list[str] | None = None,
                            tie_sync: TieSync | None = None,
                            deadline: float = np.inf) -> float:
    """The bound of the module docstring (ms) on ``devices`` (default: all); inf when no
    partition fits in memory.

    ``tie_sync`` says how the bounded plans may sum tied weights (default: as the
    problem's plans do); ``EXCHANGE`` bounds plans that AllReduce them too. ``deadline``:
    the ``time.process_time()`` after which no level is refined further (``_best_first``:
    the bound is then the least value the counts have reached, a bound still)."""
    x = inputs(problem, list(devices or problem.devices), tie_sync or problem.tie_sync)
    return _best_first(x, deadline)


def inputs(p: Problem, devices: list[str], tie_sync: TieSync) -> Inputs:
    """The ``Inputs`` of the bound on ``devices``."""
    cols = sorted({int(p.type_of[p.device_index[d]]) for d in devices})
    speeds = device_speeds(p, devices, cols)
    classes = device_classes(speeds)
    r = range_times(p, devices, cols, classes)
    n, regions = len(devices), r.regions
    holders = {(i, j): tuple(sorted(speeds.sigma[speeds.memory >= r.static[i, j]].tolist(),
                                    reverse=True))
               for i in range(regions + 1) for j in range(i + 1, regions + 1)}
    index = {(c[0], c[1], c[3]): q for q, c in enumerate(classes)}
    device_class = [index[key] for key in zip(speeds.sigma.tolist(), speeds.memory.tolist(),
                                              speeds.column)]
    floors = allreduce_floors(p, devices, device_class,
                              class_states(tuple(c[2] for c in classes))[0])
    boundaries = Boundaries(p, r.cuts, r.split, devices, r.forced)
    update = min(p.cm.update_ms_per_byte(d, p.optimizer) for d in devices)
    zero = min(p.cm.upkeep_ms_per_byte(d, 0) for d in devices)  # zeroing the buckets
    count = np.arange(n + 1)
    ties = np.zeros((regions + 1, regions + 1))
    if n >= 2:
        # a split tie after the chain of the regions before its earlier user
        before = (r.whole.fixed[0] + r.whole.scalable[0] / (p.batch_size * speeds.fastest)
                  + boundaries.through(1.0))
        ties = tie_terms(p, r.cuts, before, float(floors.by_size[2]),
                         tie_sync is TieSync.EXCHANGE)
    params = r.params[:, :, None]
    return Inputs(ranges=r, boundaries=boundaries, holders=holders, batch=p.batch_size,
                  devices=n, fastest=speeds.fastest, classes=classes, floors=floors,
                  allreduce=params * floors.by_size[None, None, :],
                  outside=params * (zero + update / np.maximum(count, 1)[None, None, :]),
                  tail=params * (zero + update * (count == 1)[None, None, :]),
                  ties=ties, balanced_capacity=fractional_capacity(holders, regions, n),
                  zero=zero, update=update,
                  grid=DeviceGrid(n) if n > EXACT_COUNTS_UP_TO else None)


def _best_first(x: Inputs, deadline: float = np.inf) -> float:
    """The least bound over microbatch counts, levels taken best first (module docstring).

    Anytime: every value on the heap bounds every plan of its count, so once
    ``time.process_time()`` passes ``deadline`` the least of them and of the finished counts'
    values is a bound of every plan; it is returned at once (looser than refining on).

    The cheap level is taken one step at a time (``cheap_steps``, each a bound of its own,
    the level's value their largest): the count whose value is least so far takes its next
    step, so a count whose first steps already lift it above another's finished value is
    refined no further. The result is the one of taking each count's level whole, in less
    work. (Each level rebuilds its arrays; the cheap terms of the count least at first and of
    the ``TERMS_KEPT`` counts refined last are kept: keeping every count's would take tens
    of MB each on a cluster of several classes or a graph of many regions.)"""
    last = 1 if len(x.classes) == 1 else 3
    shape = Shape(split=x.ranges.split, devices=x.devices, grid=x.grid)
    kept: dict[int, CheapTerms] = {}  # per count, the most recently used last

    def terms_of(m: int) -> CheapTerms:
        t = kept.pop(m, None)
        kept[m] = t if t is not None else cheap_terms(x, m, shape)
        while len(kept) > TERMS_KEPT:
            kept.pop(next(iter(kept)))
        return kept[m]

    # (value, level, step of the cheap level, count); the least count's terms kept
    heap = []
    for m in (m for m in range(1, x.batch + 1) if x.batch % m == 0):
        heap.append((cheap_bound(x, m, enough=0.0, t=terms_of(m)), 0, 0, m))
        if min(heap)[3] != m:
            kept.pop(m)
    heapify(heap)
    best = np.inf
    uncapped: dict[int, np.ndarray] = {}  # per count: the class DP's table without caps
    while heap and heap[0][0] < best:
        if time.process_time() > deadline:
            return float(heap[0][0])  # (the least on the heap, below ``best``)
        value, level, step, m = heappop(heap)
        if level == 0:
            steps = cheap_steps(x, m, terms_of(m))
            value = max(value, steps[step](best))
            if step + 1 < len(steps):
                heappush(heap, (value, 0, step + 1, m))
                continue
            kept.pop(m, None)
        elif level == 1:
            uncapped[m] = uncapped_table(x, m)
            value = max(value, float(uncapped[m][0, -1]))
        else:
            value = max(value, class_bound(x, m, enough=best, uncapped=uncapped[m],
                                           known=value))
        if level + 1 == last:
            best = min(best, value)
        else:
            heappush(heap, (value, level + 1, 0, m))
    return best
