"""The stage-balanced bound's view of the op graph: regions, and the work of every range.

Regions: the topological order of the ops is cut at the positions every topological order
shares (each op before such a position is an ancestor of each op after it,
``forced_cuts``); a stage of any plan of the family either holds whole regions or splits a
region of several ops, which the bound then counts for neither stage (``RangeTimes.split``).
For a chain every op is a region.

Per range of regions ``[i, j)`` (arrays ``[i, j]`` over region boundaries ``0..U``) and per
kind of work (``Part``), the time one replica spends on it per iteration is
``m x fixed + scalable x share``: ``fixed`` is what does not shrink with the batch (the cost
model's fixed part, per microbatch; with the adding of the range's weight gradients into
their buckets in every backward, at the best memory bandwidth), ``scalable`` the rest at
the whole batch, both at the fastest device type op by op. The kinds:

* ``whole``: forwards and whole backwards;
* ``forward`` and ``backward`` apart;
* ``passing``: what a microbatch passing through the stage waits for: its forwards and the
  input-gradient part of its backwards (``CostModel.bwd_input_share``) where the plans may
  defer the weight gradients (a stage that is not the first and holds an op whose split was
  profiled), else the whole; ``passing_backward`` the backward part of that.

Merged regions: the DPs' work grows with the square of the regions, so on graphs of more
than ``EXACT_REGIONS_UP_TO`` regions (operator-level graphs of hundreds of ops) each run
of light regions between heavy ones becomes one block (``coarse_cuts``), which the bound
treats as it treats a region of several ops: a stage may end inside it, and then it counts
for neither stage. That is a relaxation of the same bound. A stage of any plan holds every
region from the first block boundary in it to the last, and each of its terms is at least
the same term of those regions alone: its work, chain, parameters (AllReduce, upkeep,
memory) and the backward it may defer are sums over the ops it holds, and the crossing
before it is counted only where the stage must start there (between two single-op
regions). Two terms would grow where a cut is no longer counted, because they are taken
off: the most the stages in front may add to a chain offset (``drain_most``) and the head
start a split tie's AllReduce may have (``tie_terms``) still sum the crossings over every
forced cut (``RangeTimes.forced``); and a region holding a user of a tied weight is never
merged, so a range that holds the later user and none of the earlier one's region belongs
to a stage that splits the tie. The bound then loses at most the light work of the blocks
at the ends of each stage: two blocks are never neighbours, so the DP skips at most one
block before each stage.

Device speeds (``DeviceSpeeds``): a device's ``sigma`` is its best speed relative to the
fastest type over all ops and parts (so ``scalable / sigma`` never overstates its time).

Complexity: O(ops x types + regions^2), regions at most about ``EXACT_REGIONS_UP_TO``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dl_nfv.planners.pipeline.problem import Problem

PART_NAMES = ("whole", "forward", "backward", "passing", "passing_backward")
# the DPs take every forced cut on graphs of at most this many regions; on larger ones, runs
# of regions are merged into blocks (``coarse_cuts``), each counted as a region that a stage
# may split: a relaxation of the same bound
EXACT_REGIONS_UP_TO = 200


def forced_cuts(problem: Problem) -> list[int]:
    """Op positions i (0 < i < n) where every op before i is an ancestor of every op after."""
    order, pos = problem.order, problem.pos
    n = len(order)
    preds: dict[int, list[int]] = {i: [] for i in range(n)}
    for e in problem.graph.edges:
        preds[pos[e.dst]].append(pos[e.src])
    ancestors = [0] * n
    for v in range(n):
        mask = 0
        for u in preds[v]:
            mask |= ancestors[u] | (1 << u)
        ancestors[v] = mask
    # leading[v]: positions 0..leading-1 are all ancestors of v
    leading = [((~a) & (a + 1)).bit_length() - 1 for a in ancestors]
    least_after = [0] * (n + 1)
    least_after[n] = n
    for v in range(n - 1, -1, -1):
        least_after[v] = min(least_after[v + 1], leading[v])
    return [i for i in range(1, n) if least_after[i] >= i]


def coarse_cuts(cuts: list[int], weight: np.ndarray, keep: set[int], most: int) -> list[int]:
    """``cuts`` (region boundaries ``0, ..., n`` over op positions) with about ``most``
    regions left: every region whose work (``weight`` per op position, summed) is above a
    threshold, that holds several ops or a position in ``keep`` stays as it is; each run of
    the other, light, regions between them becomes one block. The threshold is the least
    that leaves at most ``most`` regions, or the one below it where that leaves fewer
    than half as many. Two blocks are never neighbours, so the DP skips at most one
    before each stage (``dp``)."""
    if len(cuts) - 1 <= most:
        return list(cuts)
    at = np.concatenate([[0.0], np.cumsum(weight)])
    bounds = np.asarray(cuts)
    work = at[bounds[1:]] - at[bounds[:-1]]
    fixed = (bounds[1:] - bounds[:-1] > 1) | np.array(
        [any(a <= q < b for q in keep) for a, b in zip(cuts, cuts[1:])], dtype=bool)

    def heavy_of(threshold: float) -> np.ndarray:
        return fixed | (work > threshold)

    def count(heavy: np.ndarray) -> int:  # heavy regions and runs of light ones
        light = ~heavy
        return int(heavy.sum() + light[0] + np.sum(light[1:] & ~light[:-1]))

    levels = np.unique(work)
    lo, hi = 0, len(levels) - 1  # the least level whose threshold leaves at most ``most``
    while lo < hi:
        mid = (lo + hi) // 2
        if count(heavy_of(levels[mid])) <= most:
            hi = mid
        else:
            lo = mid + 1
    heavy = heavy_of(levels[lo])
    if lo > 0 and count(heavy) < most // 2:  # the threshold jumped: keep the finer one
        heavy = heavy_of(levels[lo - 1])
    out = [cuts[0]]
    for r in range(len(work)):
        if heavy[r] or r == 0 or heavy[r - 1]:
            out.append(cuts[r])
    return sorted({*out, cuts[-1]})


@dataclass(frozen=True, kw_only=True, slots=True)
class Part:
    """One kind of a range's work: ms per microbatch that do not shrink with the batch, and
    ms of the whole batch that do (``[i, j]`` each, at the fastest type)."""

    fixed: np.ndarray
    scalable: np.ndarray


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceSpeeds:
    """The devices a bound is for: best relative speed, memory bytes and type column each."""

    sigma: np.ndarray
    memory: np.ndarray
    column: list[int]  # index into the bound's type columns

    @property
    def fastest(self) -> float:
        return float(self.sigma.max())


@dataclass(frozen=True, kw_only=True, slots=True)
class RangeTimes:
    """Per range of regions ``[i, j)``: its work by kind (see the module docstring), its
    parameter bytes and what a replica holds of them (with gradients and optimizer state),
    and per device class its own scalable times (``by_class[part]``, ``[i, j, C]``)."""

    whole: Part
    forward: Part
    backward: Part
    passing: Part
    passing_backward: Part
    params: np.ndarray
    static: np.ndarray
    split: np.ndarray  # [U]: whether region u holds several ops (a stage may end inside it)
    defers: np.ndarray  # [i, j]: whether plans may defer some of the range's backward
    cuts: list[int]  # op positions of the region boundaries: 0, ..., n
    forced: list[int]  # the forced cuts (with 0 and n): ``cuts`` or a superset of them
    by_class: dict[str, np.ndarray]
    class_sigma: np.ndarray  # [C]: each class's best speed relative to the fastest type

    @property
    def regions(self) -> int:
        return len(self.split)

    def part(self, name: str) -> Part:
        return getattr(self, name)


@dataclass(frozen=True, kw_only=True, slots=True)
class _OpTables:
    """Per op (in the problem's order) and type column: fixed and scalable ms of each part,
    the fixed parts less the tie sums a split tie leaves to its AllReduce."""

    fwd_fixed: np.ndarray
    fwd_scalable: np.ndarray
    bwd_fixed: np.ndarray  # less the tie sums
    bwd_scalable: np.ndarray
    whole_fixed: np.ndarray  # forward and backward, less the tie sums
    whole_scalable: np.ndarray
    input_share: np.ndarray  # [ops]: the input-gradient share of each backward
    param_bytes: np.ndarray  # [ops]


def _op_tables(p: Problem, cols: list[int]) -> _OpTables:
    order_ids = [p.cm.op_index[o] for o in p.order]
    fwd_fixed = p.fwd_fixed_ms[:, cols]
    bwd_fixed = p.bwd_fixed_ms[:, cols]
    fixed = fwd_fixed + bwd_fixed
    # the owner of a tied weight no longer sums its sharer's gradient in the graph once a
    # plan splits them (the simulator takes that time out of the owner's backward)
    untie = p.tie_sum_ms[:, cols]
    return _OpTables(fwd_fixed=fwd_fixed, fwd_scalable=p.fwd_ms[:, cols] - fwd_fixed,
                     bwd_fixed=bwd_fixed - untie, bwd_scalable=p.bwd_ms[:, cols] - bwd_fixed,
                     whole_fixed=fixed - untie,
                     whole_scalable=(p.fwd_ms[:, cols] + p.bwd_ms[:, cols]) - fixed,
                     input_share=p.cm.bwd_input_share[order_ids],
                     param_bytes=p.cm.param_bytes[order_ids])


def device_speeds(p: Problem, devices: list[str], cols: list[int]) -> DeviceSpeeds:
    """Each device's best speed relative to the fastest type, op by op, over the whole work,
    the forward and the backward (the DPs divide each part by these speeds)."""
    ops = _op_tables(p, cols)
    parts = [ops.whole_scalable, ops.fwd_scalable, ops.bwd_scalable]
    sigma_of = {}
    for k, c in enumerate(cols):
        ratios = []
        for x in parts:
            least = x.min(axis=1)
            ratios.append(least[least > 0] / np.maximum(x[least > 0, k], 1e-12))
        ratios = np.concatenate(ratios)
        sigma_of[c] = float(ratios.max()) if ratios.size else 1.0
    types = [int(p.type_of[p.device_index[d]]) for d in devices]
    return DeviceSpeeds(sigma=np.array([sigma_of[t] for t in types]),
                        memory=np.array([p.cm.memory_bytes(d) for d in devices], dtype=np.float64),
                        column=[cols.index(t) for t in types])


class _Prefix:
    """Sums of per-op values over ranges of regions: ``[i, j]`` for regions ``[i, j)``."""

    def __init__(self, n_ops: int, cuts: list[int]):
        self.n_ops, self.cuts = n_ops, np.asarray(cuts)

    def at_cuts(self, values: np.ndarray) -> np.ndarray:
        out = np.zeros(self.n_ops + 1)
        np.cumsum(values, out=out[1:])
        return out[self.cuts]

    def ranges(self, values: np.ndarray) -> np.ndarray:
        at = self.at_cuts(values)
        return at[None, :] - at[:, None]


def range_times(p: Problem, devices: list[str], cols: list[int],
                classes: list[tuple[float, float, int, int]]) -> RangeTimes:
    """The work of every range of regions on ``devices`` (type columns ``cols``), with each
    device class's own scalable times (``classes`` from ``device_classes``)."""
    ops = _op_tables(p, cols)
    cuts = forced = [0, *forced_cuts(p), len(p.order)]
    if len(cuts) - 1 > EXACT_REGIONS_UP_TO:
        tied = {p.pos[op] for _, owner, sharer, _ in p.cm.ties for op in (owner, sharer)}
        work = ops.whole_fixed.min(axis=1) + ops.whole_scalable.min(axis=1)
        cuts = coarse_cuts(cuts, work, tied, EXACT_REGIONS_UP_TO)
    prefix = _Prefix(len(p.order), cuts)
    rate = min(p.cm.accumulate_ms_per_byte(d) for d in devices)
    params = prefix.ranges(ops.param_bytes)
    # every backward of a microbatch adds the range's weight gradients into their buckets,
    # on every replica whatever its share: a fixed part per microbatch
    accumulate = params * rate
    forward = Part(fixed=prefix.ranges(ops.fwd_fixed.min(axis=1)),
                   scalable=prefix.ranges(ops.fwd_scalable.min(axis=1)))
    backward = Part(fixed=prefix.ranges(ops.bwd_fixed.min(axis=1)) + accumulate,
                    scalable=prefix.ranges(ops.bwd_scalable.min(axis=1)))
    whole = Part(fixed=prefix.ranges(ops.whole_fixed.min(axis=1)) + accumulate,
                 scalable=prefix.ranges(ops.whole_scalable.min(axis=1)))
    passing_backward, defers = _passing_backward(ops, prefix, backward, rate)
    passing = Part(fixed=np.where(defers, forward.fixed + passing_backward.fixed, whole.fixed),
                   scalable=np.where(defers, forward.scalable + passing_backward.scalable,
                                     whole.scalable))
    by_class = _class_times(ops, prefix, defers, classes)
    return RangeTimes(whole=whole, forward=forward, backward=backward, passing=passing,
                      passing_backward=passing_backward, params=params,
                      static=params * (2.0 + p.state_factor),
                      split=np.array([b - a > 1 for a, b in zip(cuts, cuts[1:])]), cuts=cuts,
                      forced=forced,
                      defers=defers,
                      by_class=by_class, class_sigma=np.array([c[0] for c in classes]))


def _passing_backward(ops: _OpTables, prefix: _Prefix, backward: Part,
                      rate: float) -> tuple[Part, np.ndarray]:
    """The backward part a microbatch passing through a range waits for, and ``[i, j]``
    whether the plans may defer some of it (a range not at the start that holds an op whose
    split was profiled): there the input gradients (``input_share`` of each backward; all of
    it, with adding into buckets, for ops that defer nothing), else the whole backward."""
    share = ops.input_share
    splits = share < 1.0
    regions = len(prefix.cuts) - 1
    defers = ~((np.arange(regions + 1) == 0)[:, None] | (prefix.ranges(splits.astype(float)) == 0))
    inputs_fixed = (prefix.ranges((ops.bwd_fixed * share[:, None]).min(axis=1))
                    + prefix.ranges(ops.param_bytes * ~splits) * rate)
    inputs_scalable = prefix.ranges((ops.bwd_scalable * share[:, None]).min(axis=1))
    return Part(fixed=np.where(defers, inputs_fixed, backward.fixed),
                scalable=np.where(defers, inputs_scalable, backward.scalable)), defers


def _class_times(ops: _OpTables, prefix: _Prefix, defers: np.ndarray,
                 classes: list[tuple[float, float, int, int]]) -> dict[str, np.ndarray]:
    """Per part, ``[i, j, C]``: each device class's own scalable time of every range (the
    class DP divides it by nothing but the class's share, ``RangeTimes.by_class``)."""
    def ranges(x: np.ndarray) -> np.ndarray:  # [i, j, T]
        at = np.stack([prefix.at_cuts(x[:, k]) for k in range(x.shape[1])], axis=-1)
        return at[None, :, :] - at[:, None, :]

    by_type = {"whole": ranges(ops.whole_scalable),
               "forward": ranges(ops.fwd_scalable), "backward": ranges(ops.bwd_scalable)}
    inputs = ranges(ops.bwd_scalable * ops.input_share[:, None])
    by_type["passing_backward"] = np.where(defers[..., None], inputs, by_type["backward"])
    by_type["passing"] = np.where(defers[..., None],
                                  by_type["forward"] + by_type["passing_backward"],
                                  by_type["whole"])
    return {name: np.stack([x[:, :, c[3]] for c in classes], axis=-1)
            for name, x in by_type.items()}


def device_classes(speeds: DeviceSpeeds) -> list[tuple[float, float, int, int]]:
    """Devices grouped by speed, memory and type column: ``(sigma, memory bytes, count,
    column)``, fastest first. Two types with the same best speed and memory are still two
    classes: on most ranges of ops one of them is slower (``by_class``)."""
    counts: dict[tuple[float, float, int], int] = {}
    for key in zip(speeds.sigma.tolist(), speeds.memory.tolist(), speeds.column):
        counts[key] = counts.get(key, 0) + 1
    return sorted(((s, m, c, k) for (s, m, k), c in counts.items()), reverse=True)
