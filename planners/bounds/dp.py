"""The min-max dynamic programme over partitions that the stage-balanced bound solves.

A partition cuts the regions ``0..U`` into stages ``[i, j)``, each on ``k`` devices in one
share option ``o``; the terms of a stage are arrays ``[i, j, k, o]`` (``StageTerms``):

* ``busy``: what the stage takes after the chain of the stages before it;
* ``chain``: what it adds to a microbatch's way through the pipeline;
* ``sync``: what it takes with no chain offset (its AllReduce);
* ``around``: what it takes before the least chain of the stages after it (``after``).

The value of a partition is ``max(max_s (chain before s + busy_s), max_s (chain before s +
around_s + after_s), max_s sync_s)`` and the bound the least value over partitions, by a
DP over suffixes ``g(i, r) = min_{j,k,o} max(busy, chain + g(j, r - k), around + after)``
(``table``) with ``r`` devices left. The least chain after a stage is itself taken over
every partition of the rest (``least_chain_after``), which keeps the min-max one DP.

The sync terms carry no chain offset, so they are handled by caps: with ``A(c)`` the DP
over stages whose sync is at most ``c`` (non-increasing in ``c``), a partition whose
largest sync lies in ``(c', c]`` is at least ``max(next sync value above c', A(c))``
(``capped_min_max``, ``search_caps``).

Where a region may be split (``split[u]``), the next stage may start inside it: the DP
then also continues from ``u + 1`` (``continuation``), counting the region for neither.

On clusters of more than ``EXACT_COUNTS_UP_TO`` devices the counts ``k`` and ``r`` are
taken on a grid (``DeviceGrid``), a relaxation of the same DP.

Complexity: O(U^2 x D^2 x O) per DP: for each first region ``i`` one vectorised pass over
every ``j`` (up to the last that any stage cost allows), every split ``k + l <= D`` of the
devices left between the stage and the rest, and every option.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CAPS_PER_PASS = 12  # caps one vectorised pass of the capped DP solves at once
CAP_PRECISION = 0.01  # the class DP's caps stop within this of the exact min-max
MAX_CAP_SOLVES = 6  # or after this many capped solves (each is a whole class DP)
# the cheap DP takes every device count on clusters of at most this many devices; on larger
# ones, counts on a grid (``DeviceGrid``): a relaxation of the same bound
EXACT_COUNTS_UP_TO = 32
# the chain after a stage taken over partitions of stages no longer than a limit: DPs per
# microbatch count, and the first limit's (and each step up's) ratio to the bound below it
AFTER_ROUNDS = 3
AFTER_STEP = 1.25


class DeviceGrid:
    """Device counts on a grid, for the cheap DP on a large cluster.

    A stage's count ``k`` falls in the bucket of the grid value ``lo <= k`` below it; the
    bucket's terms are the least of its counts' (each term of a stage on ``k`` devices is
    at least that) and it takes only ``lo`` devices from what is left; what is left is
    looked up at the grid value at or above it (a DP over more devices is no larger). Every
    plan's stages map to buckets whose value is at most the plan's, so the DP on the grid
    bounds every plan too; with every count on the grid it is the exact DP.

    ``lo``: the grid (0, 1, ..., 16, then about 24 geometric steps to ``D``); ``up[r]``: the
    position of the least grid value ``>= r``; ``ks[q]``: the buckets (``>= 1``) a stage may
    take with ``lo[q]`` devices left; ``at[q][b]``: the position of what is left after it.
    """

    def __init__(self, devices: int, dense: int = 16, steps: int = 24):
        grid = set(range(min(dense, devices) + 1)) | {devices}
        if devices > dense:
            grid |= {int(round(x)) for x in np.geomspace(dense, devices, steps)}
        self.lo = np.array(sorted(grid))
        self.up = np.searchsorted(self.lo, np.arange(devices + 1))  # lo[up[r]] >= r, the least
        self.ks = [np.nonzero((self.lo >= 1) & (self.lo <= r))[0] for r in self.lo]
        self.at = [self.up[np.maximum(r - self.lo, 0)] for r in self.lo]
        self.left = self.up[devices - self.lo]  # after a stage of bucket b on the whole cluster

    def reduce(self, x: np.ndarray, axis: int) -> np.ndarray:
        """``x`` over counts ``0..D`` on ``axis`` as buckets: the least over each."""
        return np.minimum.reduceat(x, self.lo, axis=axis)


@dataclass(frozen=True, kw_only=True, slots=True)
class Shape:
    """What every DP over one bound's partitions shares: which regions may be split, the
    device count, and the grid of counts on a large cluster (None: every count)."""

    split: np.ndarray
    devices: int
    grid: DeviceGrid | None = None

    @property
    def regions(self) -> int:
        return len(self.split)


@dataclass(frozen=True, kw_only=True, slots=True)
class StageTerms:
    """A stage's terms per ``[i, j, k, o]`` (module docstring); ``wait`` (with ``untied``,
    the busy terms without tied weights' AllReduces) adds a sync term for what a stage's
    AllReduce waits on: ``wait +`` the least the stages after it take on the devices it
    leaves."""

    busy: np.ndarray
    chain: np.ndarray
    sync: np.ndarray
    around: np.ndarray | None = None
    after: np.ndarray | None = None
    wait: np.ndarray | None = None
    untied: np.ndarray | None = None


def continuation(g: np.ndarray, split: np.ndarray) -> np.ndarray:
    """``[..., j, :]`` for a DP table ``g`` over regions ``0..U+1`` (second-last axis): what
    follows a stage that ends before region ``j``, ``g(j)``, or where region ``j`` may be
    split (the next stage may start inside it), the lesser of ``g(j)`` and ``g(j + 1)``."""
    regions = len(split)
    out = g[..., :regions + 1, :].copy()
    out[..., :regions, :] = np.where(split[:, None],
                                     np.minimum(g[..., :regions, :], g[..., 1:regions + 1, :]),
                                     g[..., :regions, :])
    return out


def least_chain_after(busy: np.ndarray, chain: np.ndarray, shape: Shape) -> np.ndarray:
    """``[j, r]``: the least chain of the stages of regions ``j..`` on at most ``r`` devices,
    over every partition of them into stages that fit (``busy`` finite); where region ``j``
    may be split, the stages may also start at ``j + 1``: the DP of ``table`` with every
    stage that fits worth nothing but its chain. (On a grid: over its buckets and
    positions.)"""
    fits = np.where(np.isfinite(busy), -np.inf, np.inf)
    return continuation(table(fits[None], chain, shape)[0], shape.split)


def table(busy: np.ndarray, chain: np.ndarray, shape: Shape, around=None,
          after=None, sync: np.ndarray | None = None, caps=None) -> np.ndarray:
    """``[G, i, r]``: the min-max DP over regions ``i..`` on at most ``r`` devices, for each
    of ``G`` stage costs ``busy`` (``[G, i, j, k, o]``); ``around`` and ``after``, when
    given, add the round trip term. With ``sync`` and ``G`` ``caps``, ``busy`` is one cost
    (``[i, j, k, o]``) taken for each cap where ``sync`` is at most it (inf elsewhere)."""
    if caps is not None:
        caps = np.asarray(caps, dtype=float)
        if shape.grid is not None:
            busy = np.where(sync[None] <= caps[:, None, None, None, None], busy[None], np.inf)
        else:
            return _table(busy, chain, shape, around, after, sync, caps)
    if shape.grid is not None:
        return _table_on_grid(busy, chain, shape, around, after)
    return _table(busy, chain, shape, around, after)


def _table(busy, chain, shape: Shape, around=None, after=None, sync=None,
           caps=None) -> np.ndarray:
    """``table`` over every device count (slices of the stage costs per first region)."""
    capped = caps is not None
    G, regions, devices = len(caps) if capped else len(busy), shape.regions, shape.devices
    g = np.full((G, regions + 2, devices + 1), np.inf)
    g[:, regions, :] = 0.0
    g[:, regions + 1, :] = 0.0
    # continuation(g) kept row by row: row j is final once g's rows j and j + 1 are
    cont = np.full((G, regions + 1, devices + 1), np.inf)
    cont[:, regions] = g[:, regions]
    # stages [i, j) that some cost allows end before ``stop[i]``: the rest are inf for all
    if capped:
        allowed = ((busy < np.inf) & (sync <= caps.max())).any(axis=(2, 3))  # [i, j]
    else:
        allowed = (busy < np.inf).any(axis=(0, 3, 4))
    stop = regions + 1 - np.argmax(allowed[:, ::-1], axis=1)
    # every (k, l): a stage on k devices and l left for the rest, by their sum r = k + l
    ks = np.array([k for r in range(1, devices + 1) for k in range(1, r + 1)])
    ls = np.array([r - k for r in range(1, devices + 1) for k in range(1, r + 1)])
    starts = np.array([r * (r - 1) // 2 for r in range(1, devices + 1)])
    for i in range(regions - 1, -1, -1):
        end = int(stop[i]) if allowed[i].any() else i + 1
        if end > i + 1:
            # stages [i, j) for i < j < end, every (k, l) at once: [G, j, pair, o]
            if capped:  # [j, pair, o] for each cap
                stage = np.where(sync[i, i + 1:end][:, ks][None] <= caps[:, None, None, None],
                                 busy[i, i + 1:end][:, ks][None], np.inf)
            else:
                stage = busy[:, i, i + 1:end][:, :, ks]
            val = np.maximum(stage, chain[i, i + 1:end][:, ks][None]
                             + cont[:, i + 1:end][:, :, ls][..., None])
            if around is not None:
                beside = around[i, i + 1:end][:, ks] + after[i + 1:end][:, ls][..., None]
                val = np.maximum(val, beside[None])
            least = val.min(axis=(1, 3))  # [G, pair]
            # on at most r devices: the least over pairs of sum r and the counts below
            g[:, i, 1:] = np.minimum.accumulate(np.minimum.reduceat(least, starts, axis=1),
                                                axis=1)
        if shape.split[i]:
            g[:, i] = np.minimum(g[:, i], g[:, i + 1])
        cont[:, i] = np.minimum(g[:, i], g[:, i + 1]) if shape.split[i] else g[:, i]
    return g


def _table_on_grid(busy, chain, shape: Shape, around=None, after=None) -> np.ndarray:
    """``table`` over device-count buckets and what is left on the grid (``DeviceGrid``):
    per first region one vectorised pass over every (grid value left, bucket) pair, as
    ``_table`` takes every (k, l) pair (with gathered indices where ``_table`` takes slices:
    gathers copy, so the clusters small enough for every count keep the slicing loop)."""
    c, regions = shape.grid, shape.regions
    G, R = len(busy), len(c.lo)
    g = np.full((G, regions + 2, R), np.inf)
    g[:, regions, :] = 0.0
    g[:, regions + 1, :] = 0.0
    # every (q, b): with lo[q] devices left, a stage of bucket b, the rest at position at
    ks = np.concatenate([c.ks[q] for q in range(1, R)])
    at = np.concatenate([c.at[q][c.ks[q]] for q in range(1, R)])
    starts = np.cumsum([0] + [len(c.ks[q]) for q in range(1, R - 1)])
    for i in range(regions - 1, -1, -1):
        rest = continuation(g, shape.split)[:, i + 1:, at]  # [G, j, pair]
        # (index ``i`` first: an integer beside an index array would move their axes)
        val = np.maximum(busy[:, i][:, i + 1:][:, :, ks],
                         chain[i][i + 1:][:, ks][None] + rest[..., None])
        if around is not None:
            beside = around[i][i + 1:][:, ks] + after[i + 1:, at][..., None]
            val = np.maximum(val, beside[None])
        least = val.min(axis=(1, 3))  # [G, pair]
        # with lo[q] left: the least over its pairs and the grid values below
        g[:, i, 1:] = np.minimum.accumulate(np.minimum.reduceat(least, starts, axis=1), axis=1)
        if shape.split[i]:
            g[:, i] = np.minimum(g[:, i], g[:, i + 1])
    return g


def capped_min_max(terms: StageTerms, shape: Shape, enough: float = np.inf) -> float:
    """The least value over partitions (module docstring), the sync terms by caps.

    The caps start at a few ranks of the distinct positive sync values, and the interval
    that gives the least is split again (``CAPS_PER_PASS`` new caps in one vectorised
    pass: half just above its bound, where ``A`` usually meets the caps, half spread over
    its ranks) until it holds one value: then the bound is exact. A caller that needs no
    more than ``enough`` gets the first bound that reaches it (``enough = 0``: the one of
    the first caps)."""
    def solve(caps: np.ndarray, busy=terms.busy, full: bool = False) -> np.ndarray:
        g = table(busy, terms.chain, shape, terms.around, terms.after, sync=sync, caps=caps)
        return g if full else g[:, 0, -1]

    sync = terms.sync
    if terms.wait is not None:
        g = solve(np.array([np.inf]), busy=terms.untied, full=True)[0]
        # [j, k]: the rest on the D - k devices left
        left = shape.devices - np.arange(shape.devices + 1) if shape.grid is None \
            else shape.grid.left
        later = continuation(g, shape.split)[:, left]
        with np.errstate(invalid="ignore"):
            sync = np.maximum(sync, terms.wait + later[None, :, :, None])
    values = np.unique(sync[np.isfinite(terms.busy) & (sync > 0)])
    if len(values) == 0:
        return float(solve(np.array([np.inf]))[0])
    # A at cap 0, at the largest value (every stage allowed) and at a few ranks between
    ranks = np.unique(np.linspace(0, len(values) - 1, 4).round().astype(int))
    first = solve(np.concatenate([[0.0], values[ranks]]))
    zero = float(first[0])
    solved = dict(zip(ranks.tolist(), first[1:].tolist()))
    while True:
        held = sorted(solved)
        lows = [0, *(q + 1 for q in held[:-1])]  # the lowest rank each cap's interval holds
        bounds = [max(values[lo], solved[q]) for lo, q in zip(lows, held)]
        n = int(np.argmin(bounds))
        lo, q = lows[n], held[n]
        if lo == q or bounds[n] >= min(zero, enough):  # exact, or enough, or the no-sync
            return min(zero, bounds[n])  # partitions are lower
        # the crossing is usually just above the interval's bound: half the new caps at
        # values a little above it (0.5%, 1%, 2%, ...), half spread over the ranks
        near = bounds[n] * (1.0 + 0.005 * 2.0 ** np.arange(CAPS_PER_PASS // 2))
        new = np.concatenate([np.searchsorted(values, near, side="right") - 1,
                              np.linspace(lo, q - 1, CAPS_PER_PASS // 2).round()])
        new = np.unique(np.clip(new, lo, q - 1).astype(int))
        new = new[[r not in solved for r in new.tolist()]]
        solved.update(zip(new.tolist(), solve(values[new]).tolist()))


def bisect_limit(value: float, enough: float, solve) -> float:
    """The most of ``min(L, solve(L))`` over a few limits ``L``.

    ``solve(L)`` bounds every plan whose stages all take at most ``L``, and a plan with a
    longer stage takes more than ``L``, so ``min(L, solve(L))`` bounds every plan;
    ``solve`` falls as ``L`` grows. From ``value`` (a bound already), ``L`` steps up by
    ``AFTER_STEP`` until ``solve`` falls below it, then bisects: ``AFTER_ROUNDS`` solves
    at most, none once the bound reaches ``enough`` (or where ``enough`` is 0: the first
    caps' pass)."""
    lo, hi = value, np.inf
    limit = value * AFTER_STEP
    for _ in range(AFTER_ROUNDS if enough > 0 else 0):
        if lo >= enough:
            break
        v = solve(limit)
        if v >= limit:
            lo = limit
        else:
            lo, hi = max(lo, v), limit
        limit = lo * AFTER_STEP if hi == np.inf else 0.5 * (lo + hi)
    return lo


def search_caps(best: float, busy, sync, solve, enough: float, small: bool) -> float:
    """The bound over AllReduce caps, one ``solve(cap)`` (``A(cap)``) at a time, from
    ``best`` (at least ``A(inf)``).

    Caps at the distinct sync values above it, v_0 < v_1 < ...: a partition whose
    largest sync is at most v_q is at least A(v_q), any other at least v_{q+1}, so
    f(q) = min(v_{q+1}, A(v_q)) bounds all; the first term grows with q and the second
    shrinks, so the largest f is where they cross (the exact min-max). The search first
    tries the cap a caller needs (``enough``), then gallops up from ``best`` and bisects
    once it is bracketed, until the bound is within ``CAP_PRECISION`` of the min-max (10x
    finer, with more solves, on ``small`` clusters)."""
    values = np.unique(sync[np.isfinite(busy) & (sync > best)])
    lo, hi = -1, len(values) - 1  # A(v_lo) > v_lo+1 (lo = -1: none known), A(v_hi) <= v_hi+1
    top = max(float(values[hi]), best) if len(values) else best  # some partition's value
    precision, most = (CAP_PRECISION / 10, 14) if small else (CAP_PRECISION, MAX_CAP_SOLVES)
    step, bracketed, solves = precision, False, 0
    while (hi - lo > 1 and best < enough and best * (1.0 + precision) < top
           and solves < most):
        below = float(values[lo + 1]) if lo >= 0 else best
        if enough < top:
            target = enough
        elif bracketed:
            target = float(np.sqrt(below * top))
        else:
            target, step = below * (1.0 + step), 2.0 * step
        q = int(np.searchsorted(values, target, side="left")) - 1  # the largest value below
        q = min(max(q, lo + 1), hi - 1)
        a, solves = solve(float(values[q])), solves + 1
        best = max(best, min(float(values[q + 1]), a))
        if a > values[q + 1]:
            lo = q
        else:
            hi, top, bracketed = q, min(top, max(float(values[q]), a)), True
    return best
