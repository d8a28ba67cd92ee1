"""The class DP of the stage-balanced bound: devices counted per class, exactly.

Devices are grouped into classes (best relative speed, memory and type:
``ranges.device_classes``). The DP's state is how many devices of each class are left,
so no two stages can both use the fastest devices; a stage's replicas are a vector of
class counts, its microbatch split by whole samples over exactly those devices in one of
the share options (``shares.class_share_options``), its AllReduce floor that vector's
(``network.allreduce_floors``), and each class at its own time of the range
(``scalable``): a replica of class ``q`` with ``c`` of ``B`` samples takes at least
``scalable_q(R) c / B``, so the fastest type's time may be replaced by the least
``sigma_q scalable_q(R)`` over the classes the vector uses.

The terms are the cheap DP's (``cheap``): busy after the chain before it (from the forward
chain where plans split backwards), chain, and the AllReduce terms by caps
(``dp.search_caps``); on clusters of at most ``SMALL_CLASS_STATES`` states also the round
trip term and the samples' average way, each class at its own time of a range.

Complexity: O(U^2 x S x K x O) per solve for U regions, S states, K class vectors and O
share options; a handful of solves per microbatch count.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from .cheap import average_way
from .dp import continuation, search_caps
from .shares import class_share_options

if TYPE_CHECKING:
    from .stage_balanced import Inputs

# clusters of at most this many class-count states also take the round trip term and the
# samples' average way in the class DP, and its caps 10x finer
SMALL_CLASS_STATES = 64


@lru_cache(maxsize=8)
def class_states(counts: tuple[int, ...]) -> tuple[list[tuple[int, ...]], list[np.ndarray],
                                                   list[np.ndarray]]:
    """Every class-count vector up to ``counts`` (``itertools.product`` order, so ``counts``
    itself is the last), and per vector the indices of its non-zero sub-vectors and of what
    each leaves of it."""
    vectors = list(itertools.product(*(range(n + 1) for n in counts)))
    index = {kv: n for n, kv in enumerate(vectors)}
    subs, rests = [], []
    for kv in vectors:
        ks = [n for n, k2 in enumerate(vectors)
              if any(k2) and all(a <= b for a, b in zip(k2, kv))]
        subs.append(np.array(ks, dtype=np.int64))
        rests.append(np.array([index[tuple(b - a for a, b in zip(vectors[n], kv))] for n in ks],
                              dtype=np.int64))
    return vectors, subs, rests


def balanced(x: Inputs, part: str, vectors: list[tuple[int, ...]]) -> np.ndarray:
    """``[i, j, K]``: the scalable time of ``part`` of each range on the devices of each
    class vector at their fractional balance, ``1 / sum_q k_q / scalable_q(R)`` (each class
    at its own time of the range; inf for the empty vector)."""
    own = x.ranges.by_class[part]  # scalable_q(R)
    counts = np.array(vectors, dtype=np.float64)  # [K, C]
    rate = np.zeros((*own.shape[:2], len(counts)))
    with np.errstate(divide="ignore", invalid="ignore"):
        for q in range(own.shape[2]):  # (a class absent adds nothing, even at 1 / 0)
            k = counts[:, q]
            rate += np.where(k > 0, k / own[:, :, q, None], 0.0)
        return 1.0 / rate


def scalable(x: Inputs, part: str, used: np.ndarray) -> np.ndarray:
    """``[i, j, K, 1]``: the scalable time of ``part`` of each range that the class DP
    divides by a replica's speed (``sigma``), on the replicas of each class vector: the
    least ``sigma_q scalable_q(R)`` over the classes the vector uses, never below the
    fastest type's (``sigma_q`` is at least the class's speed on any range)."""
    r = x.ranges
    own = r.by_class[part] * r.class_sigma
    out = np.full((*own.shape[:2], len(used)), np.inf)
    for q in range(own.shape[2]):
        out = np.where(used[:, q], np.minimum(out, own[:, :, q, None]), out)
    return np.maximum(out, r.part(part).scalable[:, :, None])[..., None]


def slowest_backward(x: Inputs) -> np.ndarray:
    """``[i]``: the most scalable backward time the class DP's chain offset may take for the
    regions before ``i`` (for ``drain_most``): per region the largest ``sigma_q
    scalable_q`` over the classes, or the fastest type's where that is larger, summed. A
    stage's chain takes its backward at the least ``sigma_q scalable_q`` over its own
    classes (``scalable``), which may be a slower class's time than the fastest type's: the
    chain offset less the drain by the fastest type's backward was then above the forward
    chain, and the busy term after it above plans that start the stage on the forward
    chain. (A stage's chain less its forward chain is at most the largest such backward of
    its range, which is at most the sum of its regions' largest.)"""
    r = x.ranges
    own = r.by_class["backward"] * r.class_sigma  # [i, j, C]
    at = np.arange(len(r.split))
    per_region = np.maximum(own[at, at + 1].max(axis=-1), r.backward.scalable[at, at + 1])
    return np.concatenate([[0.0], np.cumsum(per_region)])


@dataclass(frozen=True, kw_only=True, slots=True)
class ClassTerms:
    """The class DP's terms at ``m`` microbatches, ``[i, j, K, o]`` (module docstring)."""

    busy: np.ndarray
    chain: np.ndarray
    sync: np.ndarray
    untied: np.ndarray
    around: np.ndarray | None
    forward_first: np.ndarray
    fits: np.ndarray  # a vector's devices hold the range and have such an option
    allreduce: np.ndarray  # AllReduce floor of the range on each vector
    outside: np.ndarray
    hop: np.ndarray
    hop_in: np.ndarray
    replicated: np.ndarray  # [K, 1]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Vectors:
    """The class-count vectors and what the terms read of them."""

    vectors: list[tuple[int, ...]]
    subs: list[np.ndarray]
    rests: list[np.ndarray]
    used: np.ndarray  # [K, C]
    total: np.ndarray  # [K]
    sigma: np.ndarray  # [C]
    small: bool


def _vectors(x: Inputs) -> _Vectors:
    vectors, subs, rests = class_states(tuple(c[2] for c in x.classes))
    return _Vectors(vectors=vectors, subs=subs, rests=rests,
                    used=np.array([[k > 0 for k in kv] for kv in vectors]),
                    total=np.array([sum(kv) for kv in vectors]),
                    sigma=np.array([c[0] for c in x.classes]),
                    small=len(vectors) <= SMALL_CLASS_STATES)


def class_terms(x: Inputs, v: _Vectors, m: int) -> ClassTerms:
    """The terms of the class DP for ``m`` microbatches (``x``: the bound's ``Inputs``)."""
    r, B = x.ranges, x.batch
    samples = B // m
    options = class_share_options(v.vectors, v.sigma, samples, m, B)  # [K, o] each
    share, first = options.busy, options.first
    sig_max = np.array([v.sigma[u].max() if u.any() else np.inf for u in v.used])
    memory = np.array([c[1] for c in x.classes])
    holds = memory[None, None, :] >= r.static[:, :, None]  # [i, j, C]
    allowed = ((~holds).astype(float) @ v.used.T.astype(float) == 0)[..., None]  # [i,j,K,1]
    fixed = {name: r.part(name).fixed[:, :, None, None] for name in
             ("whole", "passing", "forward", "backward", "passing_backward")}
    scal = {name: scalable(x, name, v.used) for name in fixed}
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        first_share = first / (B * sig_max[:, None])
        outside = r.params[:, :, None] * (x.zero + x.update / np.maximum(v.total, 1)[None, None])
        tail = (r.params[:, :, None] * (x.zero + x.update * (v.total == 1)[None, None]))[..., None]
        fits = allowed & np.isfinite(share)
        busy = np.where(fits, m * fixed["whole"] + scal["whole"] * share, np.inf)
        passing = np.where(fits, m * fixed["passing"] + scal["passing"] * share, np.inf)
        hop = x.boundaries.ms(first)[:, None]  # [i, 1, K, o]: the boundary before
        hop_in = x.boundaries.ms(first, True)[:, None]
        drain = x.boundaries.drain_most(r.backward.fixed[0], slowest_backward(x)
                                        / (m * v.sigma.min()), samples)[:, None, None, None]
        chain = np.where(np.isfinite(first), fixed["passing"] + scal["passing"] * first_share
                         + hop, np.inf)
        f_first = fixed["forward"] + scal["forward"] * first_share
        around = _around(fixed, scal, share, first_share, m, np.isfinite(busy),
                         (hop, hop_in, drain, tail)) if v.small else None
        # the AllReduce after every forward and all but the last backward (as in cheap)
        allreduce = (r.params[:, :, None] * x.floors.by_vector[None, None, :])[..., None]
        sync = np.where((v.total >= 2)[:, None] & np.isfinite(share),
                        m * fixed["forward"] + scal["forward"] * share
                        + (m - 1) * fixed["backward"] + scal["backward"] * share * ((m - 1) / m)
                        + allreduce + outside[..., None], 0.0)
        # after sync: the update may overlap the tie's AllReduce
        sync = np.where(allowed, np.maximum(sync, busy + outside[..., None]), sync)
        untied = passing + hop
        # (the whole busy time and the sync from the forward chain only, as in cheap)
        busy = np.maximum(untied + x.ties[:, :, None, None],
                          np.maximum(busy + tail, sync) + hop_in - drain)
    busy[:, :, 0] = np.inf
    untied[:, :, 0] = np.inf
    return ClassTerms(busy=busy, chain=chain, sync=sync, untied=untied,
                      around=around,
                      forward_first=f_first, fits=fits, allreduce=allreduce, outside=outside,
                      hop=hop, hop_in=hop_in, replicated=(v.total >= 2)[:, None])


def _around(fixed, scal, share, first_share, m: int, finite, crossing) -> np.ndarray:
    """A replica's first backward and its last forward's microbatch wait for the round trip
    through the stages after it (the cheap DP's around term); counted from the forward
    chain, with the W's and the tail (``crossing``: both ways, the way in, the drain, the
    tail)."""
    hop, hop_in, drain, tail = crossing
    f_first = fixed["forward"] + scal["forward"] * first_share
    b_first = fixed["passing_backward"] + scal["passing_backward"] * first_share
    f_busy = m * fixed["forward"] + scal["forward"] * share
    b_busy = m * fixed["passing_backward"] + scal["passing_backward"] * share
    around = np.maximum(f_first + b_busy, f_busy + b_first) + hop
    with_w = np.maximum(f_first + m * fixed["backward"] + scal["backward"] * share,
                        f_busy + fixed["backward"] + scal["backward"] * first_share)
    return np.where(finite, np.maximum(around, with_w + hop_in - drain + tail), np.inf)


class _Solver:
    """The class DP over suffixes of regions and class-count states (``solve``)."""

    def __init__(self, x: Inputs, v: _Vectors, t: ClassTerms):
        self.split, self.v, self.t = x.ranges.split, v, t
        self.sync = t.sync  # the AllReduce terms the caps mask by (class_bound adds ``wait``)
        self.full = len(v.vectors) - 1  # every device left
        # every (state, non-empty sub-vector) pair, by state: the sub-vector, what it
        # leaves, the states that have any, and where each state's run starts
        sizes = np.array([len(ks) for ks in v.subs])
        self.pairs = (np.concatenate(v.subs), np.concatenate(v.rests),
                      np.flatnonzero(sizes), np.concatenate([[0], np.cumsum(sizes)])[:-1][sizes > 0])
        self.after = None
        if v.small:  # the least chain after each region on each state's devices
            fits = np.where(np.isfinite(t.busy), -np.inf, np.inf)
            self.after = continuation(self.solve(np.inf, busy=fits, full=True, beside=False),
                                      self.split)

    def solve(self, cap: float, busy=None, full: bool = False, beside: bool | None = None,
              way: tuple | None = None):
        """``A(cap)`` (``full``: per region and state); ``beside``: with the round trip term
        (by default on small clusters); ``way``: ``(chain, around, after, sync)`` instead of
        this DP's own (the samples' average way)."""
        t, v = self.t, self.v
        busy = t.busy if busy is None else busy
        beside = v.small if beside is None else beside
        chain, around, after, sync = way or (t.chain, None, None, self.sync)
        if beside and way is None:
            around, after = t.around, self.after
        b = busy if cap == np.inf else np.where(sync <= cap, busy, np.inf)
        regions = len(self.split)
        g = np.full((regions + 2, len(v.vectors)), np.inf)
        g[regions] = 0.0
        g[regions + 1] = 0.0
        ks, rests, states, starts = self.pairs
        for i in range(regions - 1, -1, -1):
            cont = continuation(g, self.split)
            # per class vector first ([K, j, o], [K, j]); every (state, sub-vector) pair at
            # once, the least per state taken over its run of pairs
            bi = np.ascontiguousarray(b[i, i + 1:].transpose(1, 0, 2))
            ci = np.ascontiguousarray(chain[i, i + 1:].transpose(1, 0, 2))
            conti = np.ascontiguousarray(cont[i + 1:].T)
            val = np.maximum(bi[ks], ci[ks] + conti[rests, :, None])
            if beside:
                ai = np.ascontiguousarray(around[i, i + 1:].transpose(1, 0, 2))
                afteri = np.ascontiguousarray(after[i + 1:].T)
                val = np.maximum(val, ai[ks] + afteri[rests, :, None])
            g[i, states] = np.minimum.reduceat(val.min(axis=(1, 2)), starts)
            if self.split[i]:
                g[i] = np.minimum(g[i], g[i + 1])
        return g if full else float(g[0, self.full])

    def left(self) -> np.ndarray:
        """``[K]``: the state left after a stage of each vector on the whole cluster."""
        out = np.full(len(self.v.vectors), self.full)
        out[self.v.subs[self.full]] = self.v.rests[self.full]
        return out


def uncapped_table(x: Inputs, m: int) -> np.ndarray:
    """The class DP's ``A(inf)`` per region and state, for ``class_bound(uncapped=...)``."""
    v = _vectors(x)
    return _Solver(x, v, class_terms(x, v, m)).solve(np.inf, full=True)


def class_bound(x: Inputs, m: int, enough: float, uncapped: np.ndarray,
                known: float = 0.0) -> float:
    """The class DP's bound for ``m`` microbatches over its AllReduce caps, from the table
    of ``A(inf)`` (``uncapped_table``), refined until it reaches ``enough`` (a caller that
    keeps the least bound over ``m`` needs no more). ``known``, a bound for ``m`` already
    found, is where the search for the caps starts when it is above ``A(inf)``."""
    v = _vectors(x)
    t = class_terms(x, v, m)
    solver = _Solver(x, v, t)
    best = max(float(uncapped[0, solver.full]), known)
    if best >= enough:
        return best
    left = solver.left()
    with np.errstate(invalid="ignore", over="ignore"):
        # and after its first forward and the stages after it on the devices it leaves
        # (as in the cheap DP's ``wait``)
        g = solver.solve(np.inf, busy=t.untied, full=True) if x.ties.any() else uncapped
        cont = continuation(g, x.ranges.split)
        wait = np.where(t.replicated, t.forward_first + t.hop_in + t.allreduce
                        + t.outside[..., None] + cont[None, :, left, None], -np.inf)
        sync = solver.sync = np.maximum(t.sync, wait)
    best = search_caps(best, t.busy, sync, solver.solve, enough, v.small)
    if v.small and best < enough:
        best = max(best, _averaged_bound(x, v, t, solver, sync, m, enough, best, left))
    return best


def _averaged_bound(x: Inputs, v: _Vectors, t: ClassTerms, solver: _Solver, sync, m: int,
                    enough: float, best: float, left: np.ndarray) -> float:
    """The class DP along the samples' average way (the cheap DP's), each stage's replicas
    at their fractional balance with each class at its own times."""
    r = x.ranges
    parts = ("passing", "forward", "backward", "passing_backward")
    fixed = {name: r.part(name).fixed for name in parts}
    way = average_way(fixed, {name: balanced(x, name, v.vectors) for name in parts}, t.fits,
                      m, t.hop)
    work = way.work
    work[:, :, 0] = np.inf
    fits = np.where(np.isfinite(work), -np.inf, np.inf)
    after = continuation(solver.solve(np.inf, busy=fits, full=True, beside=False,
                                      way=(way.chain, None, None, sync)), r.split)
    with np.errstate(invalid="ignore"):
        lead = np.where(t.replicated, t.allreduce + t.outside[..., None] + way.before_rest
                        + after[None, :, left, None], -np.inf)
    terms = (way.chain, way.around, after, np.maximum(sync, lead))
    begin = max(best, solver.solve(np.inf, busy=work, way=terms))
    return search_caps(begin, work, terms[3], lambda cap: solver.solve(cap, busy=work, way=terms),
                       enough, v.small)
